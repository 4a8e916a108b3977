"""The store's read path: list, scan, verify, fetch (host cache first), restore.

Readers only ever return a checkpoint whose manifest parses and whose files match it
(sizes from the listing; sha256 while downloading or verifying). A torn or corrupt
checkpoint is reported (``checkpoint_rejected``) and skipped, never deleted here; a
directory without a readable manifest is UNCOMMITTED: it does not exist for readers.
The protocol these reads rely on is checkpoint/store.py's module docstring.

``files_under``, ``inspect`` and ``hash_check`` are also the commit path's reads
(checkpoint/commit_path.py): re-committing a step first checks what is committed there.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import hashlib
import os
import posixpath
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from resilient_train.rundir.atomic import write_atomic
from resilient_train.checkpoint._storage import OnStorage, StorageRoot
from resilient_train.checkpoint.cache import cached_copy_problem, link_or_copy_tree
from resilient_train.checkpoint.deadline import progress
from resilient_train.checkpoint.manifest import (
    CHUNK_SIZE,
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    sha256_file,
    sha256_stream,
)
from resilient_train.checkpoint.shares import writer_of
from resilient_train.errors import CheckpointCorruptError

__all__ = ["CheckpointInfo", "PartialFetch", "ReadPath", "Status"]

_DIR_RE = re.compile(r"^ckpt-(\d{12,})$")


class Status(str, enum.Enum):
    """What a reader may do with a checkpoint directory.

    OK: committed and its files match the manifest (by size when listed, by sha256 when
    verified) -> restorable. TORN: committed but a listed file is missing. CORRUPT:
    committed but a file's size or sha256 differs. UNCOMMITTED: no readable manifest
    (an upload in progress, a crashed one, or a half-finished deletion) -> invisible.
    """

    OK = "ok"
    TORN = "torn"
    CORRUPT = "corrupt"
    UNCOMMITTED = "uncommitted"


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory as a reader sees it."""

    global_step: int
    path: str
    manifest: Manifest | None
    status: Status
    detail: str
    size: int

    def __post_init__(self) -> None:
        if self.global_step < 0:
            raise ValueError(f"Received global_step={self.global_step!r}; expected >= 0")
        if not isinstance(self.status, Status):
            raise ValueError(f"Received status={self.status!r}; expected a Status")
        if (self.manifest is None) != (self.status is Status.UNCOMMITTED):
            raise ValueError(
                f"Received status={self.status.value} with manifest={'set' if self.manifest else None}; "
                "only uncommitted checkpoints lack a manifest"
            )



@dataclass(frozen=True)
class PartialFetch:
    """A checkpoint fetched but for ``missing`` files, which a read-once restore's peers
    send (runner/state/read_once.py): ``path`` holds the rest, each file verified (a private
    staging directory, or ``target`` itself when this worker's own cache served it whole).
    ``missing`` empty: ``whole``. ``ReadPath.complete`` checks what the peers wrote and
    installs it as ``target``."""

    manifest: Manifest
    path: Path
    target: Path
    missing: frozenset[str]
    source: str
    started: float
    store_bytes: int

    @property
    def whole(self) -> bool:
        return not self.missing


class ReadPath(OnStorage):
    """Every read of the checkpoints under one root (see the module docstring).

    ``bytes_downloaded``: every byte this reader has read of checkpoint files from the store
    (downloads, retried parts included; not manifests, listings or hashing by ``verify``):
    what a restore's ``restore_read`` event reports."""

    def __init__(self, storage: StorageRoot) -> None:
        super().__init__(storage)
        self.bytes_downloaded = 0

    # -- small records beside the checkpoints (OWNER.json) ------------------------------

    def read_record(self, rel: str) -> bytes | None:
        """The bytes of ``rel`` under the root, None when it does not exist."""
        self.fs.invalidate_cache(self._remote(rel))
        try:
            return self._do("read", rel, lambda: self.fs.cat_file(self._remote(rel)))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", exc) from None


    # -- listing ---------------------------------------------------------------------

    def files_under(self, rel: str = "") -> dict[str, int]:
        """One recursive listing below ``rel``: {path relative to it: size}, files only.

        Directory placeholders (S3 servers keep some after deletes) are not files and are
        dropped, so an emptied directory does not exist for the store.
        """
        base = self._remote(rel) if rel else self._root
        self.fs.invalidate_cache(base)  # other processes commit; never trust a cached listing
        try:
            listing = self._do("list", rel, lambda: self.fs.find(base, detail=True))
        except FileNotFoundError as exc:
            if self._local or rel:
                return {}
            raise self._fail("list", exc) from None  # s3fs: the bucket does not exist
        except OSError as exc:
            raise self._fail("list", exc) from None
        prefix = base.rstrip("/") + "/"
        return {
            path[len(prefix):]: int(info.get("size") or 0)
            for path, info in listing.items()
            if info.get("type") == "file" and path.startswith(prefix) and not path.endswith("/")
        }

    def scan(self) -> dict[int, dict[str, int]]:
        """global_step -> {file path relative to its ckpt dir: size}, from one listing."""
        steps: dict[int, dict[str, int]] = {}
        for path, size in self.files_under().items():
            top, _, rel = path.partition("/")
            match = _DIR_RE.match(top)
            if match and rel:
                steps.setdefault(int(match.group(1)), {})[rel] = size
        return steps

    def _read_manifest(self, step: int) -> Manifest:
        """The committed manifest of ``step``; CheckpointCorruptError when absent or bad."""
        rel = posixpath.join(self.dir_name(step), MANIFEST_NAME)
        url = self._url(rel)
        try:
            data = self._do("read", rel, lambda: self.fs.cat_file(self._remote(rel)))
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{self._url(self.dir_name(step))}: not committed (no {MANIFEST_NAME})") from None
        except OSError as exc:
            raise self._fail("read", exc) from None
        manifest = Manifest.from_json(data, path=url)
        if manifest.global_step != step:
            raise CheckpointCorruptError(
                f"{url}: manifest says global_step={manifest.global_step}, directory is {step}"
            )
        return manifest

    def inspect(self, step: int, files: dict[str, int]) -> CheckpointInfo:
        """Status of one directory from its listing and manifest, without hashing."""
        path = self._url(self.dir_name(step))
        listed_size = sum(size for rel, size in files.items() if rel != MANIFEST_NAME)
        if MANIFEST_NAME not in files:
            return CheckpointInfo(step, path, None, Status.UNCOMMITTED, "no manifest", listed_size)
        try:
            manifest = self._read_manifest(step)
        except CheckpointCorruptError as exc:
            reason = _strip_prefix(str(exc), self._url(self.dir_name(step), MANIFEST_NAME))
            return CheckpointInfo(step, path, None, Status.UNCOMMITTED, f"manifest unreadable: {reason}", listed_size)
        problems = []
        for rel, entry in sorted(manifest.files.items()):
            if rel not in files:
                problems.append((Status.TORN, f"missing file {rel}"))
            elif files[rel] != entry.size:
                problems.append(
                    (Status.CORRUPT, f"size mismatch in {rel} (manifest {entry.size} bytes, found {files[rel]})")
                )
        if not problems:
            return CheckpointInfo(step, path, manifest, Status.OK, "", manifest.total_size)
        status, detail = problems[0]
        if len(problems) > 1:
            detail += f" (+{len(problems) - 1} more)"
        return CheckpointInfo(step, path, manifest, status, detail, manifest.total_size)

    def _newest_first(self) -> Iterator[CheckpointInfo]:
        steps = self.scan()
        for step in sorted(steps, reverse=True):
            yield self.inspect(step, steps[step])

    def list(self) -> list[CheckpointInfo]:
        """Every ckpt-* directory, ascending global_step; sizes checked, nothing hashed."""
        steps = self.scan()
        return [self.inspect(step, steps[step]) for step in sorted(steps)]

    def latest_manifest(self) -> Manifest | None:
        """The newest committed manifest whose files are all present with the right sizes."""
        for info in self._newest_first():
            if info.status is Status.OK:
                return info.manifest
        return None

    def read_committed_file(self, manifest: Manifest, rel: str) -> bytes:
        """One file of the committed checkpoint ``manifest``, checked against its sha256
        (CheckpointCorruptError when missing, another file, or absent from the manifest)."""
        name = self.dir_name(manifest.global_step)
        entry = manifest.files.get(rel)
        if entry is None:
            raise CheckpointCorruptError(f"{self._url(name)}: the manifest lists no {rel}")
        try:
            data = self._do("read", f"{name}/{rel}", lambda: self.fs.cat_file(self._remote(name, rel)))
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{self._url(name)}: missing file {rel}") from None
        except OSError as exc:
            raise self._fail("read", exc) from None
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CheckpointCorruptError(f"{self._url(name)}: sha256 mismatch in {rel}")
        return data


    # -- verification ----------------------------------------------------------------

    def verify(self, global_step: int | None = None) -> builtins.list[CheckpointInfo]:
        """Like list(), but every file of every committed checkpoint is hashed.

        With ``global_step``, only that checkpoint (an empty list when it does not exist).
        """
        infos = self.list()
        if global_step is not None:
            infos = [info for info in infos if info.global_step == global_step]
        return [self.hash_check(info) if info.status is Status.OK else info for info in infos]

    def hash_check(self, info: CheckpointInfo) -> CheckpointInfo:
        """``info`` again, its status now from every file's sha256 (TORN, CORRUPT or still OK)."""
        manifest = info.manifest
        if manifest is None:  # cannot happen for Status.OK (CheckpointInfo checks); keeps types honest
            return info
        name = self.dir_name(info.global_step)
        for rel, entry in sorted(manifest.files.items()):
            try:
                got = self._do("read", f"{name}/{rel}", functools.partial(self._hash_remote, f"{name}/{rel}"))
            except FileNotFoundError:
                return dataclasses.replace(info, status=Status.TORN, detail=f"missing file {rel}")
            except OSError as exc:
                raise self._fail("read", exc) from None
            if got.size != entry.size:
                detail = f"size mismatch in {rel} (manifest {entry.size} bytes, found {got.size})"
                return dataclasses.replace(info, status=Status.CORRUPT, detail=detail)
            if got.sha256 != entry.sha256:
                writer = writer_of(manifest.extra, rel)
                by = "" if writer is None else f" (its share's writer: worker {writer})"
                return dataclasses.replace(info, status=Status.CORRUPT, detail=f"sha256 mismatch in {rel}{by}")
        return info

    def _hash_remote(self, rel: str) -> FileEntry:
        with self.fs.open(self._remote(rel), "rb", block_size=CHUNK_SIZE) as src:
            return sha256_stream(src)


    # -- restore ---------------------------------------------------------------------

    def fetch(self, global_step: int, cache_dir: Path) -> tuple[Manifest, Path]:
        """Download ckpt-<global_step> into ``cache_dir``, verifying while downloading.

        Raises CheckpointCorruptError when it is not committed, a file is missing, or a
        size/sha256 differs; StorageError when storage fails. ``cache_dir`` belongs to
        one process (each worker has its own): the stale copy is replaced by a rename.

        Sources, fastest first, each verified against the manifest (sha256 of every file):
        ``cache_dir`` itself, the host cache, shared storage. A copy that fails verification
        is reported (``cache_rejected``) and the next source is used; ``checkpoint_fetched``
        tells which one served.
        """
        return self._fetch(self._read_manifest(global_step), Path(cache_dir))

    def _fetch(self, manifest: Manifest, cache_dir: Path) -> tuple[Manifest, Path]:
        part = self.fetch_part(manifest, cache_dir)
        return self.complete(part)

    def fetch_part(self, manifest: Manifest, cache_dir: Path, *, skip: frozenset[str] = frozenset()) -> PartialFetch:
        """``fetch`` but for the files in ``skip`` (a read-once restore's peers send them):
        from ``cache_dir`` or the host cache whole when they hold it, else every other file
        from the store, verified. Finish it with ``complete`` (after the missing files are
        written into its ``path``) or drop it with ``discard``."""
        name = self.dir_name(manifest.global_step)
        target = cache_dir / name
        started = time.monotonic()
        before = self.bytes_downloaded
        if self._cached_copy_ok(target, manifest):
            write_atomic(target / MANIFEST_NAME, manifest.to_json())
            return PartialFetch(manifest, target, target, frozenset(), "local_cache", started, 0)
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = cache_dir / f".{name}.partial-{uuid.uuid4().hex[:8]}"
        try:
            if self._seed_from_host_cache(manifest, staging):
                return PartialFetch(manifest, staging, target, frozenset(), "host_cache", started, 0)
            missing = frozenset(rel for rel in manifest.files if rel in skip)
            for rel, entry in sorted(manifest.files.items()):
                if rel in missing:
                    continue
                got = self._download(name, rel, staging / rel)
                if got.size != entry.size:
                    raise CheckpointCorruptError(
                        f"{self._url(name)}: size mismatch in {rel} (manifest {entry.size} bytes, read {got.size})"
                    )
                if got.sha256 != entry.sha256:
                    raise CheckpointCorruptError(f"{self._url(name)}: sha256 mismatch in {rel}")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        source = "read_once" if missing else "shared"
        return PartialFetch(manifest, staging, target, missing, source, started, self.bytes_downloaded - before)

    def complete(self, part: PartialFetch) -> tuple[Manifest, Path]:
        """Install ``part`` as its checkpoint's private copy once its missing files are in
        ``part.path`` (each checked against the manifest: CheckpointCorruptError naming a
        file a peer sent wrong); ``checkpoint_fetched`` tells where it came from."""
        manifest, staging, target = part.manifest, part.path, part.target
        name = self.dir_name(manifest.global_step)
        if staging != target:
            try:
                for rel in sorted(part.missing):
                    got = sha256_file(staging / rel) if (staging / rel).is_file() else None
                    entry = manifest.files[rel]
                    if got is None or got.size != entry.size or got.sha256 != entry.sha256:
                        raise CheckpointCorruptError(f"{self._url(name)}: sha256 mismatch in {rel} (as its peer sent it)")
                (staging / MANIFEST_NAME).write_text(manifest.to_json())
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                os.replace(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        self._emit(
            "checkpoint_fetched",
            global_step=manifest.global_step,
            source=part.source,
            size=manifest.total_size,
            store_bytes=part.store_bytes,
            seconds=round(time.monotonic() - part.started, 4),
        )
        return manifest, target

    def discard(self, part: PartialFetch) -> None:
        """Drop an unfinished ``part`` (its staging directory; a whole cached copy stays)."""
        if part.path != part.target:
            shutil.rmtree(part.path, ignore_errors=True)

    def _cached_copy_ok(self, cached: Path, manifest: Manifest, *, report_as: Path | None = None) -> bool:
        """Verify a local copy against ``manifest``; report (``cache_rejected``) a bad one."""
        try:
            problem = cached_copy_problem(cached, manifest)
        except OSError as exc:
            problem = f"unreadable: {type(exc).__name__}: {exc}"
        if problem is None:
            return True
        if problem != "missing":
            self._emit("cache_rejected", path=str(report_as or cached), global_step=manifest.global_step, reason=problem)
        return False

    def _seed_from_host_cache(self, manifest: Manifest, staging: Path) -> bool:
        """Link the host cache's copy into ``staging`` and verify it there (the bytes used)."""
        if self._host_cache is None:
            return False
        cached = self._host_cache / self.dir_name(manifest.global_step)
        if not cached.is_dir():
            return False
        try:
            link_or_copy_tree(cached, sorted(manifest.files), staging)
        except OSError as exc:
            problem: str | None = f"cannot link: {type(exc).__name__}: {exc}"
        else:
            problem = None
        if problem is None and self._cached_copy_ok(staging, manifest, report_as=cached):
            return True
        if problem is not None:
            self._emit("cache_rejected", path=str(cached), global_step=manifest.global_step, reason=problem)
        shutil.rmtree(staging, ignore_errors=True)
        return False

    def _download(self, name: str, rel: str, dst: Path) -> FileEntry:
        """Stream ``name/rel`` to ``dst`` (each remote byte read once), hashing it on the way.

        Always a copy, also from a local store (this path serves when the host cache cannot):
        the private cache is then an independent copy of the store's bytes."""
        remote = self._remote(name, rel)

        def attempt() -> FileEntry:
            dst.parent.mkdir(parents=True, exist_ok=True)
            digest, size = hashlib.sha256(), 0
            with self.fs.open(remote, "rb", block_size=CHUNK_SIZE) as src, open(dst, "wb") as out:
                while chunk := src.read(CHUNK_SIZE):
                    digest.update(chunk)
                    size += len(chunk)
                    self.bytes_downloaded += len(chunk)
                    out.write(chunk)
                    progress()
            return FileEntry(size=size, sha256=digest.hexdigest())

        try:
            return self._do("download", f"{name}/{rel}", attempt)
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{self._url(name)}: missing file {rel}") from None
        except OSError as exc:
            raise self._fail("download from", exc) from None

    def restore_latest(self, cache_dir: Path) -> tuple[Manifest, Path] | None:
        """Fetch the newest committed checkpoint that verifies; None when there is none.

        Each committed-but-bad one on the way down is reported as ``checkpoint_rejected``
        and left in place. Uncommitted directories are not checkpoints and are skipped
        silently. Storage failures propagate: falling back because of a network error
        would silently throw progress away.
        """
        for info in self._newest_first():
            if info.status is Status.UNCOMMITTED:
                continue
            if info.status is not Status.OK or info.manifest is None:
                self._reject(info, info.detail)
                continue
            try:
                return self._fetch(info.manifest, Path(cache_dir))
            except CheckpointCorruptError as exc:
                self._reject(info, _strip_prefix(str(exc), info.path))
        return None

    def _reject(self, info: CheckpointInfo, reason: str) -> None:
        self._emit("checkpoint_rejected", group=True, path=info.path, reason=reason, global_step=info.global_step)



def _strip_prefix(message: str, path: str) -> str:
    return message[len(path) + 2:] if message.startswith(path + ": ") else message
