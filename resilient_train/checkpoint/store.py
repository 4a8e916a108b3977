"""CheckpointStore: commit, list, verify, fetch, retain and clean checkpoints over fsspec.

# Implementation: the commit protocol (works where rename is not atomic)

    <root>/ckpt-<global_step:012d>/<files...>        uploaded first, in any order
    <root>/ckpt-<global_step:012d>/MANIFEST.json     written LAST, one object PUT = the commit

Object stores (S3, GCS) have no atomic directory rename, so a commit cannot be "write
to a temp dir, rename". Instead the manifest, which lists every file with its size and
sha256, is written last; a directory without a readable manifest does not exist for
readers. On a local filesystem the manifest is written to a temporary name and renamed,
so a reader never sees half a manifest there either.

Invariants this module keeps:

* Readers (``latest_manifest``, ``restore_latest``, ``fetch``) only ever return a
  checkpoint whose manifest parses and whose files match it (sizes from the listing;
  sha256 while downloading). A torn or corrupt checkpoint is reported
  (``checkpoint_rejected``) and skipped, never deleted here.
* Re-committing an already committed step never leaves a torn state. If the files are
  byte-identical to the committed ones (a deterministic job saving the same step
  twice, e.g. a final save with ``extra={"completed": True}``), only the manifest is
  replaced, in one PUT. Otherwise the old manifest is deleted FIRST (the directory
  becomes uncommitted and readers fall back to the previous checkpoint), then the
  files are uploaded, then the new manifest. Overwriting files under a live manifest
  would expose old-manifest/new-files to readers, which is exactly a torn checkpoint.
* ``retain`` deletes only checkpoints older than the newest good one, manifest first,
  so a half-finished deletion reads as uncommitted. ``collect_garbage`` deletes only
  uncommitted leftovers older than the newest good commit (never an in-flight newer one).
* With a generation fence (``claim_generation``, checkpoint/fence.py) the commit path
  checks that no newer generation claimed the storage before a commit starts, before its
  manifest, before each deletion, and between file uploads whenever ``FENCE_RECHECK_S``
  passed since the last check; the manifest is created create-only. A writer goes stale
  by pausing (a frozen process, a partitioned node) while a newer attempt starts, which
  takes longer than the recheck interval, so a writer that wakes up mid-upload checks
  before its next file; a commit of a few small files checks twice, not once per file
  (each check is a listing). Without a fence (tests, ``verify``, the supervisor) nothing
  changes.
* Every remote operation goes through the RetryPolicy: transient failures are retried
  (``storage_retry`` events), permanent ones surface as StorageError naming the URL.

The store never imports TensorFlow: it moves opaque files.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import errno
import functools
import hashlib
import os
import posixpath
import re
import shutil
import socket
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import fsspec
from fsspec.implementations.local import LocalFileSystem

from resilient_train.rundir import events
from resilient_train.rundir.atomic import write_atomic
from resilient_train.checkpoint._files import abandon_write, create_or_confirm, write_create_only
from resilient_train.checkpoint.cache import cached_copy_problem, link_or_copy_tree, write_through
from resilient_train.checkpoint.deadline import progress
from resilient_train.checkpoint.fence import (
    GENERATIONS_DIR,
    GenerationFence,
    GenerationRecord,
    claim_generation,
    newest_generation,
)
from resilient_train.checkpoint.manifest import (
    CHUNK_SIZE,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    FileEntry,
    Manifest,
    now_utc,
    sha256_file,
    sha256_stream,
)
from resilient_train.checkpoint.options import with_backend_timeouts
from resilient_train.checkpoint.retry import RetryPolicy, describe
from resilient_train.errors import CheckpointCorruptError, StorageError

__all__ = ["CheckpointStore", "CheckpointInfo", "Status"]

_DIR_RE = re.compile(r"^ckpt-(\d{12,})$")
_PLACEHOLDER = FileEntry(size=0, sha256="0" * 64)
FENCE_RECHECK_S = 1.0  # between uploads of one commit, the fence is re-read after this long
_monotonic = time.monotonic  # the recheck's clock (tests freeze a writer by moving it)


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


def _normalise_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"Received url={url!r}; expected an fsspec URL or a local path")
    url = url.strip()
    if "://" in url or "::" in url:
        protocol, _, rest = url.partition("://")
        return f"{protocol}://{rest.rstrip('/')}" if rest.strip("/") else url
    return os.path.abspath(os.path.expanduser(url))


class CheckpointStore:
    """Checkpoints under one root URL; see the module docstring for the protocol."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        emit: Callable[..., None] | None = None,
        retry: RetryPolicy | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        clock: Callable[[], str] = now_utc,
        host_cache: Path | None = None,
    ) -> None:
        """``host_cache``: a local directory for the write-through copy of the newest commit
        (checkpoint/cache.py); ``fetch`` looks there before downloading. None: no host cache."""
        self.url = _normalise_url(url)
        self._host_cache = Path(host_cache) if host_cache is not None else None
        self._emit = emit or events.emit
        self._retry = retry or RetryPolicy()
        self._clock = clock
        if fs is None:
            options = with_backend_timeouts(self.url, dict(storage_options or {}), self._retry.stall_timeout_s)
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **options)
            except (ValueError, ImportError, TypeError, OSError) as exc:
                raise StorageError(f"cannot use checkpoint storage {self.url}: {describe(exc)}") from None
        else:
            root = fs._strip_protocol(self.url)
        self.fs = fs
        self._root = root.rstrip("/") or root
        self._local = bool(getattr(fs, "local_file", False))
        # Plain local disk (not a wrapper such as the fault-injecting one, whose faults
        # must fire): files move in and out by hard link where the filesystem allows.
        self._linkable = type(fs) is LocalFileSystem
        self._fence: GenerationFence | None = None
        # retain(): each directory's listing and status when retention last inspected it
        self._retention_seen: dict[int, tuple[tuple[tuple[str, int], ...], CheckpointInfo]] = {}
        if not self._local and not self._root.strip("/"):
            raise StorageError(f"cannot use checkpoint storage {self.url}: the URL names no bucket or directory")

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    @property
    def local(self) -> bool:
        """Whether the root is a path on this machine's filesystem."""
        return self._local

    @property
    def root(self) -> str:
        """The root as the filesystem names it (a local path for local storage)."""
        return self._root

    # -- naming ----------------------------------------------------------------------

    @staticmethod
    def dir_name(global_step: int) -> str:
        if isinstance(global_step, bool) or not isinstance(global_step, int) or global_step < 0:
            raise ValueError(f"Received global_step={global_step!r}; expected an int >= 0")
        return "ckpt-%012d" % global_step

    def _remote(self, *parts: str) -> str:
        return posixpath.join(self._root, *parts)

    def _url(self, *parts: str) -> str:
        return posixpath.join(self.url, *parts)

    def _do(self, op: str, rel: str, fn: Callable[[], Any]) -> Any:
        return self._retry.call(fn, op=op, path=self._url(rel) if rel else self.url, emit=self._emit)

    def _fail(self, action: str, exc: BaseException) -> StorageError:
        if isinstance(exc, StorageError):
            return exc
        return StorageError(f"cannot {action} {self.url}: {describe(exc)}")

    # -- fail fast -------------------------------------------------------------------

    def check(self) -> None:
        """Prove the root is usable before any training: create (local), write, read, delete.

        Raises StorageError naming the URL and the cause (missing bucket, no permission,
        not a directory, ...); transient failures are retried first.
        """
        probe = f".rt-probe-{uuid.uuid4().hex[:12]}"
        try:
            if self._local:
                self._do("makedirs", "", lambda: self.fs.makedirs(self._root, exist_ok=True))
            self._do("write", probe, lambda: self.fs.pipe_file(self._remote(probe), b"probe"))
            data = self._do("read", probe, lambda: self.fs.cat_file(self._remote(probe)))
            self._do("delete", probe, lambda: self.fs.rm_file(self._remote(probe)))
        except (TypeError, AttributeError, NameError):
            raise  # a bug (ours or a caller's), not a storage problem
        except Exception as exc:  # the fail-fast boundary: e.g. botocore's NoCredentialsError is no OSError
            raise self._fail("write checkpoints to", exc) from None
        if data != b"probe":
            raise StorageError(f"cannot use checkpoint storage {self.url}: probe object read back as {data[:20]!r}")

    # -- fencing ---------------------------------------------------------------------

    def claim_generation(self, generation: int | None, *, run_id: str, attempt: int) -> int:
        """Claim ``generations/gen-<generation>.json`` and fence every later write by it.

        Returns the claimed generation (``None`` claims the next free one). Raises
        StaleWriterError when a newer generation already exists (checkpoint/fence.py).
        """
        try:
            self._fence = claim_generation(
                self.fs, self._root, self.url, generation=generation, run_id=run_id, attempt=attempt,
                call=self._do, emit=self._emit, local=self._local,
            )
        except OSError as exc:
            raise self._fail("claim a generation in", exc) from None
        return self._fence.generation

    def adopt_generation(self, generation: int | None, *, run_id: str, attempt: int) -> int | None:
        """Fence this store's writes by the generation its attempt's chief claims, without
        claiming it: a non-chief rank that may commit a rescue for the live attempt
        (runner/state/memory_tier.py). ``None`` (a launcher that hands none down): the
        newest generation in the storage now, None when there is none (then unfenced)."""
        if generation is None:
            generation = self.newest_generation()
            if generation is None:
                return None
        record = GenerationRecord(generation, run_id, attempt, os.getpid(), socket.gethostname(), now_utc())
        self._fence = GenerationFence(self.fs, self._root, self.url, record, call=self._do, emit=self._emit)
        return generation

    def newest_generation(self) -> int | None:
        """The highest generation claimed in this storage (one listing), None when none is."""
        try:
            return newest_generation(self.fs, self._remote(GENERATIONS_DIR), self._do)
        except OSError as exc:
            raise self._fail("list generations in", exc) from None

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

    def write_record(self, rel: str, data: bytes, *, create_only: bool) -> None:
        """Write ``rel`` under the root; ``create_only`` raises FileExistsError if it exists."""
        remote = self._remote(rel)
        try:
            if create_only:
                self._do("write", rel, lambda: write_create_only(self.fs, remote, data, local=self._local))
            else:
                self._put_small(rel, data)
        except FileExistsError:
            raise
        except OSError as exc:
            raise self._fail("write", exc) from None

    def _check_fence(self, op: str, rel: str) -> None:
        if self._fence is not None:
            self._fence.check(op, self._url(rel))

    # -- listing ---------------------------------------------------------------------

    def _files_under(self, rel: str = "") -> dict[str, int]:
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

    def _scan(self) -> dict[int, dict[str, int]]:
        """global_step -> {file path relative to its ckpt dir: size}, from one listing."""
        steps: dict[int, dict[str, int]] = {}
        for path, size in self._files_under().items():
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

    def _inspect(self, step: int, files: dict[str, int]) -> CheckpointInfo:
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
        steps = self._scan()
        for step in sorted(steps, reverse=True):
            yield self._inspect(step, steps[step])

    def list(self) -> list[CheckpointInfo]:
        """Every ckpt-* directory, ascending global_step; sizes checked, nothing hashed."""
        steps = self._scan()
        return [self._inspect(step, steps[step]) for step in sorted(steps)]

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
        return [self._hash_check(info) if info.status is Status.OK else info for info in infos]

    def _hash_check(self, info: CheckpointInfo) -> CheckpointInfo:
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
                return dataclasses.replace(info, status=Status.CORRUPT, detail=f"sha256 mismatch in {rel}")
        return info

    def _hash_remote(self, rel: str) -> FileEntry:
        with self.fs.open(self._remote(rel), "rb", block_size=CHUNK_SIZE) as src:
            return sha256_stream(src)

    # -- commit ----------------------------------------------------------------------

    def commit(
        self,
        local_dir: Path,
        *,
        run_id: str,
        epoch: int,
        step_in_epoch: int,
        global_step: int,
        world_size: int,
        weights_sha256: str,
        tf_version: str,
        extra: dict[str, Any] | None = None,
        on_uploaded: Callable[[str], None] | None = None,
        known: Mapping[str, FileEntry] | None = None,
    ) -> Manifest:
        """Upload every file under ``local_dir`` into ckpt-<global_step>/, then the manifest.

        ``on_uploaded(relative_name)`` is called after each data file is uploaded (progress,
        and the chaos suite's "killed mid-upload" fault point). ``known``: the size and
        sha256 of files the caller wrote from bytes it had already hashed (a carried
        iterator capture, committed by many saves): a local store links them without
        reading them again; a streamed upload hashes what it sends and must match. Returns the committed manifest. Raises StorageError (permanent or retries
        exhausted); the directory then stays uncommitted and invisible to readers.
        """
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise ValueError(f"Received local_dir={str(local_dir)!r}; expected an existing directory")
        local_files = {p.relative_to(local_dir).as_posix(): p for p in sorted(local_dir.rglob("*")) if p.is_file()}
        if not local_files:
            raise ValueError(f"Received local_dir={str(local_dir)!r}; expected at least one file in it")
        # Validates every field before the first byte is uploaded.
        extra = dict(extra or {})
        if self._fence is not None:
            extra["generation"] = self._fence.generation
        draft = Manifest(
            schema_version=SCHEMA_VERSION, run_id=run_id, epoch=epoch, step_in_epoch=step_in_epoch,
            global_step=global_step, world_size=world_size, tf_version=tf_version,
            created_at=self._clock(), files={rel: _PLACEHOLDER for rel in local_files},
            weights_sha256=weights_sha256, extra=extra,
        )
        name = self.dir_name(global_step)
        uploading = False
        try:
            self._check_fence("commit", name)
            entries = self._reuse_committed(global_step, local_files)
            replacing = entries is not None
            if entries is None:
                uploading = True
                if self._local:  # object stores have no directories; a local disk needs them first
                    for parent in sorted({posixpath.dirname(f"{name}/{rel}") for rel in local_files}):
                        self._do("makedirs", parent, functools.partial(self.fs.makedirs, self._remote(parent), exist_ok=True))
                entries = {}
                checked = _monotonic()
                for rel, src in local_files.items():
                    if _monotonic() - checked >= FENCE_RECHECK_S:
                        self._check_fence("upload", f"{name}/{rel}")
                        checked = _monotonic()
                    entries[rel] = self._upload(src, f"{name}/{rel}", (known or {}).get(rel))
                    if on_uploaded is not None:
                        on_uploaded(rel)
                uploading = False  # past here a failure may be another writer's manifest: keep files
            manifest = dataclasses.replace(draft, files=entries, created_at=self._clock())
            self._check_fence("write manifest", f"{name}/{MANIFEST_NAME}")
            self._put_manifest(name, manifest.to_json().encode(), replace=replacing)
            self._adopt_root_mode(name)
        except OSError as exc:
            removed = uploading and self._remove_partial(name)
            error = self._fail(f"commit checkpoint {name} to", exc)
            if removed:  # same type: a transient failure must stay restartable (errors.py EXIT_RULES)
                error = type(error)(f"{error} (the partial upload was removed)")
            raise error from None
        if self._host_cache is not None:
            write_through(self._host_cache, name, local_files, manifest, emit=self._emit)
        return manifest

    def _adopt_root_mode(self, name: str) -> None:
        """On a local disk, the committed directory and files take the storage root's mode.

        Workers run under the run dir's private umask (rundir/permissions.py), which is
        right for the run dir but not for a storage root a team shares: a root made 0775
        for a group keeps its checkpoints readable by that group (files without the x
        bits). The default root (<run-dir>/checkpoints) is created under the private umask,
        so there nothing changes. Object stores have no modes: nothing to do.
        """
        if not self._local:
            return
        mode = stat.S_IMODE(os.stat(self._root).st_mode)
        top = Path(self._remote(name))
        for path in (top, *top.rglob("*")):
            os.chmod(path, mode if path.is_dir() else mode & 0o666)

    def _remove_partial(self, name: str) -> bool:
        """Delete an upload that failed before its manifest (a full disk must not stay full).

        Best effort, no retries: the storage just failed, and garbage collection removes
        what is left once a newer checkpoint commits. True when the directory is gone; a
        directory with a manifest (committed by someone else meanwhile) is never touched.
        """
        try:
            if self.fs.exists(self._remote(name, MANIFEST_NAME)):
                return False
            self.fs.rm(self._remote(name), recursive=True)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def _reuse_committed(self, step: int, local_files: dict[str, Path]) -> dict[str, FileEntry] | None:
        """Entries to commit without uploading, when ``step`` is already committed with these bytes.

        When a different checkpoint is committed at ``step``, its manifest is deleted
        first (see the module docstring) and None is returned: upload everything.
        """
        name = self.dir_name(step)
        files = self._files_under(name)
        if MANIFEST_NAME not in files:
            return None
        info = self._inspect(step, files)
        if info.status is Status.OK and info.manifest is not None:
            local = {rel: sha256_file(path) for rel, path in local_files.items()}
            # Same bytes by the manifest is not enough: the remote copy may have rotted
            # (a flipped byte is exactly what sends a run back to re-commit this step).
            if local == info.manifest.files and self._hash_check(info).status is Status.OK:
                return local
        self._check_fence("delete", f"{name}/{MANIFEST_NAME}")
        self._do("delete", f"{name}/{MANIFEST_NAME}", lambda: self.fs.rm_file(self._remote(name, MANIFEST_NAME)))
        return None

    def _upload(self, src: Path, rel: str, known: FileEntry | None = None) -> FileEntry:
        """Stream one local file to ``rel``, hashing the bytes as they are read.

        A store on the staging files' own disk gets a hard link and one hashing read
        instead: no copy. The staged file, the committed one and the host cache's copy
        (also links, checkpoint/cache.py) are then one inode under three names, which is
        safe because checkpoint files are never written after they are staged (a byte
        flipped on that disk reads wrong under every name, and the manifest's sha256
        rejects the checkpoint)."""
        remote = self._remote(rel)
        if self._linkable:
            linked = _link_and_hash(Path(src), Path(remote), known)
            if linked is not None:
                return linked

        def attempt() -> FileEntry:
            digest, size = hashlib.sha256(), 0
            with open(src, "rb") as reader:
                dst = self.fs.open(remote, "wb")
                try:
                    while chunk := reader.read(CHUNK_SIZE):
                        digest.update(chunk)
                        size += len(chunk)
                        dst.write(chunk)
                        progress()  # the stall deadline measures silence, not duration
                except BaseException:
                    abandon_write(dst)
                    raise
                dst.close()
            sent = FileEntry(size=size, sha256=digest.hexdigest())
            if known is not None and sent != known:
                raise CheckpointCorruptError(f"{src} changed after it was staged: it is not the bytes the save captured")
            return sent

        return self._do("upload", rel, attempt)

    def _put_manifest(self, name: str, data: bytes, *, replace: bool) -> None:
        """The commit PUT. Fenced writers create it create-only (unless re-committing the
        same bytes), so a stale writer cannot replace a manifest committed meanwhile."""
        rel = f"{name}/{MANIFEST_NAME}"
        if self._fence is None or replace:
            self._put_small(rel, data)
            return
        remote = self._remote(rel)

        try:
            self._do("write", rel, lambda: create_or_confirm(self.fs, remote, data, local=self._local))
        except FileExistsError:
            self._check_fence("write manifest", rel)  # a newer generation committed it: fenced
            raise StorageError(f"cannot commit {self._url(name)}: another writer committed it concurrently") from None

    def _put_small(self, rel: str, data: bytes) -> None:
        """One small object in one PUT; on a local disk via a temp name and a rename."""
        remote = self._remote(rel)
        if not self._local:
            self._do("write", rel, lambda: self.fs.pipe_file(remote, data))
            return
        tmp = posixpath.join(posixpath.dirname(remote), f".{posixpath.basename(remote)}.tmp-{uuid.uuid4().hex[:8]}")

        def attempt() -> None:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, remote)

        self._do("write", rel, attempt)

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
        name = self.dir_name(manifest.global_step)
        target = cache_dir / name
        started = time.monotonic()
        if self._cached_copy_ok(target, manifest):
            write_atomic(target / MANIFEST_NAME, manifest.to_json())
            self._fetched(manifest, "local_cache", started)
            return manifest, target
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = cache_dir / f".{name}.partial-{uuid.uuid4().hex[:8]}"
        source = "shared"
        try:
            if self._seed_from_host_cache(manifest, staging):
                source = "host_cache"
            for rel, entry in sorted(manifest.files.items()) if source == "shared" else ():
                got = self._download(name, rel, staging / rel)
                if got.size != entry.size:
                    raise CheckpointCorruptError(
                        f"{self._url(name)}: size mismatch in {rel} (manifest {entry.size} bytes, read {got.size})"
                    )
                if got.sha256 != entry.sha256:
                    raise CheckpointCorruptError(f"{self._url(name)}: sha256 mismatch in {rel}")
            (staging / MANIFEST_NAME).write_text(manifest.to_json())
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._fetched(manifest, source, started)
        return manifest, target

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

    def _fetched(self, manifest: Manifest, source: str, started: float) -> None:
        self._emit(
            "checkpoint_fetched",
            global_step=manifest.global_step,
            source=source,
            size=manifest.total_size,
            seconds=round(time.monotonic() - started, 4),
        )

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

    # -- deletion --------------------------------------------------------------------

    def retain(self, keep: int) -> builtins.list[str]:  # builtins: list() is a method here
        """Delete all but the newest ``keep`` good checkpoints; returns the deleted paths.

        Only OK (by listing) checkpoints older than the newest OK one are candidates;
        torn/corrupt ones are left for ``verify`` to report, uncommitted ones for
        ``collect_garbage``.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Received keep={keep!r}; expected an int >= 1")
        steps = self._scan()
        good = [info for info in map(self._inspect_for_retention, sorted(steps), (steps[s] for s in sorted(steps)))
                if info.status is Status.OK]
        self._retention_seen = {step: seen for step, seen in self._retention_seen.items() if step in steps}
        doomed = good[:-keep]
        for info in doomed:
            self._delete(info.global_step)
        return [info.path for info in doomed]

    def _inspect_for_retention(self, step: int, files: dict[str, int]) -> CheckpointInfo:
        """``_inspect``, without re-reading a manifest whose directory lists exactly as before.

        Retention runs after every commit; reading every kept manifest each time was most
        of a small commit's storage calls. A committed directory whose names and sizes are
        unchanged has the same status (the status is the listing against the manifest's
        names and sizes), which is all retention decides on.
        """
        listing = tuple(sorted(files.items()))
        seen = self._retention_seen.get(step)
        if seen is not None and seen[0] == listing:
            return seen[1]
        info = self._inspect(step, files)
        self._retention_seen[step] = (listing, info)
        return info

    def collect_garbage(self) -> builtins.list[str]:
        """Delete uncommitted directories older than the newest good commit.

        Torn or corrupt committed checkpoints are not touched (``verify`` reports them).
        Newer uncommitted directories may be uploads in progress and are left alone.
        """
        infos = self.list()
        good = [info.global_step for info in infos if info.status is Status.OK]
        if not good:
            return []
        doomed = [i for i in infos if i.status is Status.UNCOMMITTED and i.global_step < max(good)]
        for info in doomed:
            self._delete(info.global_step)
        paths = [info.path for info in doomed]
        if paths:
            self._emit("garbage_collected", group=True, paths=paths, count=len(paths))
        return paths

    def _delete(self, step: int) -> None:
        """Manifest first (the checkpoint stops existing for readers), then the rest."""
        name = self.dir_name(step)
        self._check_fence("delete", name)
        try:
            try:
                self._do("delete", f"{name}/{MANIFEST_NAME}", lambda: self.fs.rm_file(self._remote(name, MANIFEST_NAME)))
            except FileNotFoundError:
                pass
            try:
                self._do("delete", name, lambda: self.fs.rm(self._remote(name), recursive=True))
            except FileNotFoundError:
                pass
        except OSError as exc:
            raise self._fail(f"delete {name} from", exc) from None


_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP}


def _link_and_hash(src: Path, dst: Path, known: FileEntry | None = None) -> FileEntry | None:
    """Make ``dst`` a hard link to ``src`` and hash it (or take ``known`` when its size
    matches); None where links are impossible (another filesystem, or one without hard
    links): the caller copies instead.

    Checkpoint files are never modified after they are written, so sharing the inode is
    safe; ``dst`` is unlinked first so that a file a reader already linked elsewhere is
    never written into.
    """
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno in _NO_LINK:
            return None
        raise
    if known is not None and os.stat(dst).st_size == known.size:
        return known
    return sha256_file(dst)


def _strip_prefix(message: str, path: str) -> str:
    return message[len(path) + 2:] if message.startswith(path + ": ") else message
