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

# The parts behind this facade

    CheckpointStore             this module: opening the root, ``check``, the public API
      ReadPath                  checkpoint/read_path.py: list, scan, verify, fetch, host cache, restore
      CommitPath                checkpoint/commit_path.py: uploads, manifest last, fencing, deletion
      Retention                 checkpoint/retention.py: what ``retain`` and ``collect_garbage`` delete
      OnStorage, StorageRoot    checkpoint/_storage.py: the root, its names and the retried call they share

Each public method below hands its call to one part; the parts share one ``StorageRoot``.
"""

from __future__ import annotations

import builtins
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import fsspec

from resilient_train.rundir import events
from resilient_train.checkpoint._storage import OnStorage, StorageRoot
from resilient_train.checkpoint.commit_path import CommitPath
from resilient_train.checkpoint.manifest import FileEntry, Manifest, now_utc
from resilient_train.checkpoint.options import with_backend_timeouts
from resilient_train.checkpoint.read_path import CheckpointInfo, PartialFetch, ReadPath, Status
from resilient_train.checkpoint.retention import Retention
from resilient_train.checkpoint.retry import RetryPolicy, describe
from resilient_train.errors import StorageError

__all__ = ["CheckpointStore", "CheckpointInfo", "Status"]


def _normalise_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"Received url={url!r}; expected an fsspec URL or a local path")
    url = url.strip()
    if "://" in url or "::" in url:
        protocol, _, rest = url.partition("://")
        return f"{protocol}://{rest.rstrip('/')}" if rest.strip("/") else url
    return os.path.abspath(os.path.expanduser(url))


class CheckpointStore(OnStorage):
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
        url = _normalise_url(url)
        retry = retry or RetryPolicy()
        if fs is None:
            options = with_backend_timeouts(url, dict(storage_options or {}), retry.stall_timeout_s)
            try:
                fs, root = fsspec.core.url_to_fs(url, **options)
            except (ValueError, ImportError, TypeError, OSError) as exc:
                raise StorageError(f"cannot use checkpoint storage {url}: {describe(exc)}") from None
        else:
            root = fs._strip_protocol(url)
        storage = StorageRoot(
            url=url, fs=fs, root=root.rstrip("/") or root, emit=emit or events.emit, retry=retry, clock=clock,
            host_cache=Path(host_cache) if host_cache is not None else None,
        )
        super().__init__(storage)
        if not self._local and not self._root.strip("/"):
            raise StorageError(f"cannot use checkpoint storage {self.url}: the URL names no bucket or directory")
        self._reader = ReadPath(storage)
        self._writer = CommitPath(storage, self._reader)
        self._retention = Retention(self._reader.scan, self._reader.inspect, self._writer.delete, self._emit)

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

    # -- fencing (checkpoint/commit_path.py) ---------------------------------------------

    def claim_generation(self, generation: int | None, *, run_id: str, attempt: int) -> int:
        """See ``CommitPath.claim_generation``."""
        return self._writer.claim_generation(generation, run_id=run_id, attempt=attempt)

    def adopt_generation(self, generation: int | None, *, run_id: str, attempt: int) -> int | None:
        """See ``CommitPath.adopt_generation``."""
        return self._writer.adopt_generation(generation, run_id=run_id, attempt=attempt)

    def newest_generation(self) -> int | None:
        """See ``CommitPath.newest_generation``."""
        return self._writer.newest_generation()

    # -- small records beside the checkpoints (OWNER.json) ------------------------------

    def read_record(self, rel: str) -> bytes | None:
        """See ``ReadPath.read_record``."""
        return self._reader.read_record(rel)

    def write_record(self, rel: str, data: bytes, *, create_only: bool) -> None:
        """See ``CommitPath.write_record``."""
        self._writer.write_record(rel, data, create_only=create_only)

    # -- reading (checkpoint/read_path.py) -------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        """See ``ReadPath.list``."""
        return self._reader.list()

    def latest_manifest(self) -> Manifest | None:
        """See ``ReadPath.latest_manifest``."""
        return self._reader.latest_manifest()

    def read_committed_file(self, manifest: Manifest, rel: str) -> bytes:
        """See ``ReadPath.read_committed_file``."""
        return self._reader.read_committed_file(manifest, rel)

    def verify(self, global_step: int | None = None) -> builtins.list[CheckpointInfo]:
        """See ``ReadPath.verify``."""
        return self._reader.verify(global_step)

    def fetch(self, global_step: int, cache_dir: Path) -> tuple[Manifest, Path]:
        """See ``ReadPath.fetch``."""
        return self._reader.fetch(global_step, cache_dir)

    def restore_latest(self, cache_dir: Path) -> tuple[Manifest, Path] | None:
        """See ``ReadPath.restore_latest``."""
        return self._reader.restore_latest(cache_dir)

    def fetch_part(self, manifest: Manifest, cache_dir: Path, *, skip: frozenset[str] = frozenset()) -> PartialFetch:
        """See ``ReadPath.fetch_part`` (a read-once restore: runner/state/read_once.py)."""
        return self._reader.fetch_part(manifest, cache_dir, skip=skip)

    def complete(self, part: PartialFetch) -> tuple[Manifest, Path]:
        """See ``ReadPath.complete``."""
        return self._reader.complete(part)

    def discard(self, part: PartialFetch) -> None:
        """See ``ReadPath.discard``."""
        self._reader.discard(part)

    @property
    def bytes_downloaded(self) -> int:
        """See ``ReadPath``: checkpoint bytes this store object has read from storage."""
        return self._reader.bytes_downloaded

    # -- committing (checkpoint/commit_path.py) --------------------------------------------

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
        """See ``CommitPath.commit``."""
        return self._writer.commit(
            local_dir, run_id=run_id, epoch=epoch, step_in_epoch=step_in_epoch, global_step=global_step,
            world_size=world_size, weights_sha256=weights_sha256, tf_version=tf_version, extra=extra,
            on_uploaded=on_uploaded, known=known, shares=shares, before_manifest=before_manifest,
            share_copies=share_copies,
        )

    def upload_share(self, local_files: Mapping[str, Path], *, global_step: int, rank: int,
                     known: Mapping[str, FileEntry] | None = None,
                     on_uploaded: Callable[[str], None] | None = None) -> dict[str, FileEntry]:
        """See ``CommitPath.upload_share``."""
        return self._writer.upload_share(local_files, global_step=global_step, rank=rank, known=known,
                                         on_uploaded=on_uploaded)

    def wait_for_shares(self, global_step: int, ranks: Mapping[int, Mapping[str, FileEntry]], *,
                        copies: Mapping[str, Path], timeout_s: float,
                        give_up: Callable[[], str | None] = lambda: None) -> dict[str, FileEntry]:
        """See ``CommitPath.wait_for_shares``."""
        return self._writer.wait_for_shares(global_step, ranks, copies=copies, timeout_s=timeout_s,
                                            give_up=give_up)

    # -- deletion (checkpoint/retention.py) ------------------------------------------------

    def retain(self, keep: int) -> builtins.list[str]:  # builtins: list() is a method here
        """See ``Retention.retain``."""
        return self._retention.retain(keep)

    def collect_garbage(self) -> builtins.list[str]:
        """See ``Retention.collect_garbage``."""
        return self._retention.collect_garbage()
