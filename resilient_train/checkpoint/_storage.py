"""What every path of the checkpoint store shares: one root on one filesystem, its names, the retried call.

The store (checkpoint/store.py) is a facade over three parts, one module each: the read path
(checkpoint/read_path.py), the commit path (checkpoint/commit_path.py) and retention
(checkpoint/retention.py). The first two, and the facade itself, reach the storage the same
way: through the ``StorageRoot`` the facade opened once, every remote operation wrapped by
the one RetryPolicy (``_do``), every permanent failure a StorageError naming the URL
(``_fail``). ``OnStorage`` is that shared access and nothing more: it holds no state that
changes after construction (the commit path's generation fence is its own).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import fsspec
from fsspec.implementations.local import LocalFileSystem

from resilient_train.checkpoint.retry import RetryPolicy, describe
from resilient_train.errors import StorageError


@dataclass(frozen=True)
class StorageRoot:
    """One checkpoint root, opened once by the facade and shared by its parts."""

    url: str  # normalised (checkpoint/store.py)
    fs: fsspec.AbstractFileSystem
    root: str  # the root as ``fs`` names it (a local path for local storage)
    emit: Callable[..., None]
    retry: RetryPolicy
    clock: Callable[[], str]
    host_cache: Path | None


class OnStorage:
    """The storage access the store's parts share (see the module docstring)."""

    def __init__(self, storage: StorageRoot) -> None:
        self.url = storage.url
        self.fs = storage.fs
        self._root = storage.root
        self._local = bool(getattr(storage.fs, "local_file", False))
        # Plain local disk (not a wrapper such as the fault-injecting one, whose faults
        # must fire): files move in and out by hard link where the filesystem allows.
        self._linkable = type(storage.fs) is LocalFileSystem
        self._emit = storage.emit
        self._retry = storage.retry
        self._clock = storage.clock
        self._host_cache = storage.host_cache

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
