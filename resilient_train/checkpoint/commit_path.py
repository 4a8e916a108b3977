"""The store's commit path: staging uploads, the manifest written last, generation fencing.

The protocol (checkpoint/store.py's module docstring): every file of a checkpoint is
uploaded first, in any order, and its MANIFEST.json is written LAST, one PUT, which is
the commit; a re-commit of a committed step never leaves a torn state. With a generation
fence (``claim_generation``, checkpoint/fence.py) every write here (each upload, the
manifest, each deletion, ``delete`` included, which retention calls) first checks that no
newer generation claimed the storage, and the manifest is created create-only.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import os
import posixpath
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

from resilient_train.checkpoint._files import abandon_write, create_or_confirm, write_create_only
from resilient_train.checkpoint._storage import OnStorage, StorageRoot
from resilient_train.checkpoint.cache import write_through
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
)
from resilient_train.checkpoint.read_path import ReadPath, Status
from resilient_train.checkpoint.shares import parse_share_record, share_record, share_record_name
from resilient_train.errors import CheckpointCorruptError, StorageError, StorageUnavailableError

__all__ = ["CommitPath"]

_PLACEHOLDER = FileEntry(size=0, sha256="0" * 64)
FENCE_RECHECK_S = 1.0  # between uploads of one commit, the fence is re-read after this long (store.py)
_monotonic = time.monotonic  # the recheck's clock (tests freeze a writer by moving it)
SHARE_POLL_S = 0.05  # the chief's listing interval while it waits for the other workers' shares


class CommitPath(OnStorage):
    """Every write of the checkpoints under one root (see the module docstring)."""

    def __init__(self, storage: StorageRoot, reader: ReadPath) -> None:
        super().__init__(storage)
        self._reader = reader
        self._fence: GenerationFence | None = None

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
        shares: Collection[str] = (),
        before_manifest: Callable[[], Mapping[str, FileEntry]] | None = None,
        share_copies: Mapping[str, Path] | None = None,
    ) -> Manifest:
        """Upload every file under ``local_dir`` into ckpt-<global_step>/, then the manifest.

        ``shares``: names of files of this checkpoint that other writers upload (a sharded
        save: ``upload_share``); ``local_dir`` must not hold them. ``before_manifest()`` runs
        after this writer's uploads, before the manifest, and returns their entries: a sharded
        save's chief waits there for the others (``wait_for_shares``), so its own upload
        overlaps theirs. ``share_copies``: this host's copies of those files (the chief wrote
        every share locally), so the host cache still gets the whole checkpoint.

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
        shares = sorted(shares)
        if set(shares) & local_files.keys() or (shares and before_manifest is None):
            raise ValueError(f"Received shares={shares} with files {sorted(local_files)} in local_dir and "
                             f"before_manifest={before_manifest!r}; expected files from other writers only, "
                             "and before_manifest to give their entries")
        # Validates every field before the first byte is uploaded.
        extra = dict(extra or {})
        if self._fence is not None:
            extra["generation"] = self._fence.generation
        draft = Manifest(
            schema_version=SCHEMA_VERSION, run_id=run_id, epoch=epoch, step_in_epoch=step_in_epoch,
            global_step=global_step, world_size=world_size, tf_version=tf_version,
            created_at=self._clock(), files={rel: _PLACEHOLDER for rel in [*local_files, *shares]},
            weights_sha256=weights_sha256, extra=extra,
        )
        name = self.dir_name(global_step)
        uploading = False
        try:
            self._check_fence("commit", name)
            entries = self._reuse_committed(global_step, local_files, shares)
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
            if before_manifest is not None:
                shared = dict(before_manifest())
                if sorted(shared) != shares or any(entries.get(rel, shared[rel]) != shared[rel] for rel in shared):
                    raise StorageError(f"cannot commit {self._url(name)}: the other writers' files {sorted(shared)} "
                                       f"are not the expected {shares}, or not the committed ones")
                entries.update(shared)
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
        cached = {**local_files, **(share_copies or {})}
        if self._host_cache is not None and cached.keys() == manifest.files.keys():
            write_through(self._host_cache, name, cached, manifest, emit=self._emit)
        return manifest

    # -- sharded saves (checkpoint/shares.py) ----------------------------------------

    def upload_share(self, local_files: Mapping[str, Path], *, global_step: int, rank: int,
                     known: Mapping[str, FileEntry] | None = None,
                     on_uploaded: Callable[[str], None] | None = None) -> dict[str, FileEntry]:
        """A non-chief writer's part of a sharded save: upload ``local_files`` (name in the
        checkpoint directory -> local path) into ckpt-<global_step>/, then its share record.

        Fenced like a commit; never writes a manifest, never deletes. When the step is
        committed already, nothing is overwritten: files the manifest lists with the same
        bytes are left as they are (the record still confirms them), other bytes are refused
        (StorageError), since replacing a file under a live manifest tears the checkpoint.
        ``on_uploaded(name)``: after each file, before the record (the chaos suite's
        "killed mid-upload" point, as in ``commit``).
        """
        name = self.dir_name(global_step)
        try:
            self._check_fence("upload share", name)
            files = self._reader.files_under(name)
            if MANIFEST_NAME in files:
                entries = {rel: sha256_file(Path(src)) for rel, src in local_files.items()}
                committed = self._reader.inspect(global_step, files).manifest
                if committed is None or any(committed.files.get(rel) != e for rel, e in entries.items()):
                    raise StorageError(f"cannot upload a share of {self._url(name)}: the step is committed with "
                                       "other bytes")
            else:
                if self._local:
                    self._do("makedirs", name, functools.partial(self.fs.makedirs, self._remote(name), exist_ok=True))
                entries = {}
                checked = _monotonic()
                for rel, src in sorted(local_files.items()):
                    if _monotonic() - checked >= FENCE_RECHECK_S:
                        self._check_fence("upload", f"{name}/{rel}")
                        checked = _monotonic()
                    entries[rel] = self._upload(Path(src), f"{name}/{rel}", (known or {}).get(rel))
                    if on_uploaded is not None:
                        on_uploaded(rel)
            self._check_fence("write share record", name)
            record = share_record(rank, entries, generation=None if self._fence is None else self._fence.generation)
            self._put_small(f"{name}/{share_record_name(rank)}", record)
        except OSError as exc:
            raise self._fail(f"upload share {rank} of {name} to", exc) from None
        return entries

    def wait_for_shares(self, global_step: int, ranks: Mapping[int, Mapping[str, FileEntry]], *,
                        copies: Mapping[str, Path], timeout_s: float,
                        give_up: Callable[[], str | None] = lambda: None,
                        sleep: Callable[[float], None] = time.sleep) -> dict[str, FileEntry]:
        """The chief's wait in a sharded save: until every rank in ``ranks`` recorded its
        share of ckpt-<global_step>/ in this fence's generation, with, by rank, the entries
        of the chief's own copies (``copies``: file name -> local path) of the same files.

        A share recorded with other bytes (the replicas' states differ: e.g. statistics each
        worker updates from its own batches, which only the chief's copy is the run's, as
        with a chief-only save) is replaced by the chief's copy, uploaded here
        (``checkpoint_share_replaced``): a checkpoint is always the chief's state.
        Returns every share's files (name -> entry), for the manifest. Raises
        StorageUnavailableError naming the missing ranks after ``timeout_s`` without a new
        share (restartable: a worker that died is restarted with the group anyway), or at
        once when ``give_up()`` gives a reason (a rescue: a peer is gone).
        """
        name = self.dir_name(global_step)
        generation = None if self._fence is None else self._fence.generation
        pending = dict(ranks)
        started = _monotonic()
        while pending:
            listed = self._reader.files_under(name)
            for rank in sorted(pending):
                record_name = share_record_name(rank)
                data = self._reader.read_record(f"{name}/{record_name}") if record_name in listed else None
                if data is None:
                    continue
                try:
                    got_rank, got_generation, entries = parse_share_record(data, where=self._url(name, record_name))
                except ValueError as exc:  # written by something else than upload_share
                    raise CheckpointCorruptError(str(exc)) from None
                if got_generation != generation or got_rank != rank:
                    continue  # a leftover of an earlier attempt's save of this step
                if entries != dict(pending[rank]):
                    self._replace_share(global_step, rank, pending[rank], entries, copies)
                del pending[rank]
                started = _monotonic()
            if not pending:
                break
            reason = give_up()
            if reason is not None:
                raise StorageUnavailableError(
                    f"cannot commit {self._url(name)}: gave up waiting for worker(s) {sorted(pending)}: {reason}")
            if _monotonic() - started >= timeout_s:
                raise StorageUnavailableError(
                    f"cannot commit {self._url(name)}: no share from worker(s) {sorted(pending)} within "
                    f"{timeout_s:g} s")
            sleep(SHARE_POLL_S)
        return {rel: entry for files in ranks.values() for rel, entry in files.items()}

    def _replace_share(self, global_step: int, rank: int, expected: Mapping[str, FileEntry],
                       recorded: Mapping[str, FileEntry], copies: Mapping[str, Path]) -> None:
        """Upload the chief's copies of a share recorded with other bytes (wait_for_shares)."""
        name = self.dir_name(global_step)
        different = sorted(rel for rel in {*expected, *recorded} if recorded.get(rel) != expected.get(rel))
        missing = [rel for rel in different if rel not in copies or rel not in expected]
        if missing:
            raise CheckpointCorruptError(f"{self._url(name)}: worker {rank}'s share holds {missing}, which the "
                                         "chief has no copy of")
        for rel in different:
            self._check_fence("upload", f"{name}/{rel}")
            uploaded = self._upload(Path(copies[rel]), f"{name}/{rel}", expected[rel])
            if uploaded != expected[rel]:
                raise CheckpointCorruptError(f"{copies[rel]} changed after it was hashed")
        self._emit("checkpoint_share_replaced", global_step=global_step, shard=rank, files=different,
                   reason="the worker's bytes differ from the chief's copy (the replicas' states differ)")

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

    def _reuse_committed(self, step: int, local_files: dict[str, Path],
                         shares: Collection[str] = ()) -> dict[str, FileEntry] | None:
        """Entries to commit without uploading, when ``step`` is already committed with these bytes.

        When a different checkpoint is committed at ``step``, its manifest is deleted
        first (see the module docstring) and None is returned: upload everything.
        """
        name = self.dir_name(step)
        files = self._reader.files_under(name)
        if MANIFEST_NAME not in files:
            return None
        info = self._reader.inspect(step, files)
        if info.status is Status.OK and info.manifest is not None:
            local = {rel: sha256_file(path) for rel, path in local_files.items()}
            committed = info.manifest.files
            # Same bytes by the manifest is not enough: the remote copy may have rotted
            # (a flipped byte is exactly what sends a run back to re-commit this step).
            # Other writers' files (a sharded save) are compared when they confirm them.
            if (committed.keys() == {*local, *shares} and all(committed[rel] == e for rel, e in local.items())
                    and self._reader.hash_check(info).status is Status.OK):
                return dict(committed)
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


    # -- deletion --------------------------------------------------------------------

    def delete(self, step: int) -> None:
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

