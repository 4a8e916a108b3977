"""The host cache: the newest committed checkpoint, also on this host's local disk.

A gang restart on the same host restores the checkpoint its chief committed moments ago.
Downloading it again from shared storage (S3, GCS, NFS) is the slowest part of a restore
for large models, so the committing chief also keeps the files it just uploaded in
``<host_cache>/ckpt-<step>/`` (write-through), and ``CheckpointStore.fetch`` takes them from
there before it goes to shared storage.

Invariants:

* Shared storage stays the source of truth. The cache is only ever read against a manifest
  read from shared storage, and every cached file's size and sha256 must match it; a copy
  that is missing, torn or corrupt is reported (``cache_rejected``), ignored, and the
  checkpoint is downloaded as before. The cache can make a restore faster, never different.
* The cache holds one checkpoint: a commit places its directory complete under a temporary
  name, renames it into place, then deletes every other entry. A chief killed half-way
  leaves only a ``.partial`` directory, which readers never look at and the next commit
  removes.
* Files are hard links to the chief's staging files where the filesystem allows (no copy on
  the commit path; the staging directory is deleted, never rewritten in place), otherwise
  copies. Readers link or copy them into their own private cache directory, so a later
  commit pruning the host cache cannot pull files from under a restore.
* Writing the cache is best effort: a full or read-only local disk costs the fast path,
  never the commit (``cache_write_failed``).

The store never imports TensorFlow, and neither does this module.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Mapping

from resilient_train.checkpoint.manifest import MANIFEST_NAME, Manifest, sha256_file

__all__ = ["write_through", "cached_copy_problem", "link_or_copy_tree"]


def write_through(
    host_cache: Path,
    name: str,
    files: Mapping[str, Path],
    manifest: Manifest,
    *,
    emit: Callable[..., None],
) -> Path | None:
    """Place the just-committed ``files`` as ``host_cache/name`` and prune the rest."""
    host_cache = Path(host_cache)
    partial = host_cache / f".{name}.partial-{uuid.uuid4().hex[:8]}"
    target = host_cache / name
    try:
        for rel, src in files.items():
            _link_or_copy(Path(src), partial / rel)
        (partial / MANIFEST_NAME).write_text(manifest.to_json())
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
        for entry in host_cache.iterdir():
            if entry.name != name:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        emit("cache_write_failed", path=str(target), reason=f"{type(exc).__name__}: {exc}")
        return None
    return target


def cached_copy_problem(cached: Path, manifest: Manifest) -> str | None:
    """None when ``cached`` holds exactly the manifest's files with matching sha256, else why not."""
    if not cached.is_dir():
        return "missing"
    present = {p.relative_to(cached).as_posix() for p in cached.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    if present != set(manifest.files):
        missing, extra = sorted(set(manifest.files) - present), sorted(present - set(manifest.files))
        return f"file set differs (missing {missing}, unexpected {extra})"
    for rel, entry in sorted(manifest.files.items()):
        size = (cached / rel).stat().st_size
        if size != entry.size:
            return f"size mismatch in {rel} (manifest {entry.size} bytes, cached {size})"
    for rel, entry in sorted(manifest.files.items()):
        if sha256_file(cached / rel) != entry:
            return f"sha256 mismatch in {rel}"
    return None


def link_or_copy_tree(src_dir: Path, rels: list[str], dst_dir: Path) -> None:
    for rel in rels:
        _link_or_copy(src_dir / rel, dst_dir / rel)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not supported
        shutil.copyfile(src, dst)
