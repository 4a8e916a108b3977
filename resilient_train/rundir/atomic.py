"""Whole-file writes on a local disk: a reader sees the old file or the new one, never half.

Every writer of a run-dir file that is rewritten (summary, run id, fingerprint, error
files, Slurm exit reports, files pumped back from Ray slots, TensorBoard rewrites) and of
local checkpoint bookkeeping goes through :func:`replacing`: the data is written to a
temporary name beside the target (same directory, so same filesystem) and renamed over it,
which POSIX makes atomic. Temporary names follow one pattern, :func:`is_temporary`, so
readers that copy a directory (the Ray slot pump) skip them.

Writes to checkpoint *storage* (any fsspec filesystem, where rename may not be atomic) do
not come here: they follow the manifest-last protocol of ``checkpoint/store.py``.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["replacing", "write_atomic", "is_temporary"]

_TEMP_MARK = ".tmp-"


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}{_TEMP_MARK}{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, fsync: bool = False) -> Path:
    """Replace ``path`` with ``data`` atomically; ``fsync`` also survives a host crash."""
    payload = data.encode() if isinstance(data, str) else data
    with replacing(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
    return Path(path)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file of :func:`replacing` (not yet, or never, a file)."""
    return name.startswith(".") and _TEMP_MARK in name
