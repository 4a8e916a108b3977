"""A fault-injecting fsspec filesystem (protocol ``faulty``) for tests and chaos runs.

Why: the commit protocol's claims ("a torn upload is never restored", "transient errors
are retried, permanent ones are not") are only worth something if they are exercised
against failures at exact, reproducible points. This wrapper sits in front of any
fsspec filesystem and, driven by a seed, injects:

* ``fail_write_k``: the k-th file write attempt (1-based; ``open(..., "wb")`` or
  ``pipe_file``) raises once: ``ConnectionResetError`` (``fail_kind="transient"``) or
  ``PermissionError`` (``fail_kind="permanent"``) or ``OSError(ENOSPC)``, a full disk
  (``fail_kind="nospace"``);
* ``transient_rate``: each operation raises ``ConnectionResetError`` with this
  probability (``random.Random(seed)``, so a seed replays the same faults);
* ``fail_op_k``: the k-th operation of any kind (1-based) raises ``ConnectionResetError``
  once: a transient fault with no luck involved, so every process that does k
  operations is certain to see one (a rate may draw none in a short attempt). Once,
  not every k-th: a retried unit of work that does a multiple of k operations would
  meet the fault on every try;
* ``stop_after_files``: after n completed file writes every further write raises
  :class:`SimulatedCrash`, a ``BaseException`` standing for the chief being killed
  mid-upload (no retry policy may swallow it);
* ``latency_s``: a delay before every operation (through the injectable ``sleep``);
* ``stall_write_k``: the k-th file write attempt, and the ``stall_count - 1`` after it
  (``stall_count=0``: every one from k on, a store that went quiet for good), blocks before
  it starts: for ``stall_s`` seconds, or until :meth:`FaultyFileSystem.release` when
  ``stall_s`` is None, then goes on normally. A real wait, not the injectable ``sleep``:
  what is tested is a deadline that gives up on a call from another thread.

It also counts what passes through (``stats``: reads, bytes_read, writes, files_written,
ops, stalls) so tests can prove, e.g., that a cache hit downloads nothing.

Ways to configure it (later wins): the environment (a JSON object, because the chaos
suite hands options to worker processes that way), the URL, keyword arguments /
``storage_options``. From the environment: ``RT_CHAOS_FAULTFS``, options per attempt
(``{"<attempt>" or "*": {options}}``, this process's ``RT_ATTEMPT`` picks its entry; a
process without ``RT_ATTEMPT``, the supervisor, sees none: its storage check and summary
stay clean), else ``RT_FAULTFS``, options for every process. The attempt is read when the
filesystem is created, not when Python starts: a warm standby worker gets its attempt's
environment only when it is handed its assignment. Keyword options that
are not fault options are passed to the inner filesystem, so ``faulty://s3://b/p``
takes the same storage_options (key, secret, client_kwargs) as ``s3://b/p``::

    faulty://memory://bucket/run           faulty:///tmp/ckpts        faulty://s3://b/p
    {"target_protocol": "s3", "target_options": {...}, "seed": 3, "transient_rate": 0.2}

Only the operations the checkpoint store uses are wrapped; faults fire when an
operation starts, never halfway through a byte stream.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import fsspec
from fsspec.spec import AbstractFileSystem

from resilient_train.checkpoint._files import abandon_write
from resilient_train.cluster.environment import ATTEMPT

__all__ = ["FaultyFileSystem", "FaultSpec", "SimulatedCrash", "ENV_VAR", "ATTEMPT_ENV_VAR", "env_options"]

ENV_VAR = "RT_FAULTFS"
ATTEMPT_ENV_VAR = "RT_CHAOS_FAULTFS"  # {"<attempt>" or "*": {options}}: see the module docstring
_PREFIX = "faulty://"


class SimulatedCrash(BaseException):
    """The process was 'killed' by fault injection; nothing after this point runs."""


@dataclass(frozen=True)
class FaultSpec:
    """Which faults to inject (see the module docstring)."""

    seed: int = 0
    fail_write_k: int | None = None
    fail_kind: str = "transient"
    transient_rate: float = 0.0
    fail_op_k: int | None = None
    stop_after_files: int | None = None
    latency_s: float = 0.0
    stall_write_k: int | None = None
    stall_count: int = 1
    stall_s: float | None = None

    def __post_init__(self) -> None:
        if self.fail_write_k is not None and self.fail_write_k < 1:
            raise ValueError(f"Received fail_write_k={self.fail_write_k!r}; expected >= 1 (1-based)")
        if self.fail_kind not in ("transient", "permanent", "nospace"):
            raise ValueError(f"Received fail_kind={self.fail_kind!r}; expected 'transient', 'permanent' or 'nospace'")
        if not 0.0 <= self.transient_rate <= 1.0:
            raise ValueError(f"Received transient_rate={self.transient_rate!r}; expected 0 <= rate <= 1")
        if self.fail_op_k is not None and self.fail_op_k < 1:
            raise ValueError(f"Received fail_op_k={self.fail_op_k!r}; expected >= 1 (1-based)")
        if self.stop_after_files is not None and self.stop_after_files < 0:
            raise ValueError(f"Received stop_after_files={self.stop_after_files!r}; expected >= 0")
        if self.latency_s < 0:
            raise ValueError(f"Received latency_s={self.latency_s!r}; expected >= 0")
        if self.stall_write_k is not None and (
            isinstance(self.stall_write_k, bool) or not isinstance(self.stall_write_k, int) or self.stall_write_k < 1
        ):
            raise ValueError(f"Received stall_write_k={self.stall_write_k!r}; expected an int >= 1 (1-based)")
        if isinstance(self.stall_count, bool) or not isinstance(self.stall_count, int) or self.stall_count < 0:
            raise ValueError(f"Received stall_count={self.stall_count!r}; expected an int >= 0 (0: every write from k on)")
        if self.stall_s is not None and (
            isinstance(self.stall_s, bool) or not isinstance(self.stall_s, (int, float)) or not self.stall_s > 0
        ):
            raise ValueError(f"Received stall_s={self.stall_s!r}; expected seconds > 0, or None (until released)")

    def stalls_write(self, k: int) -> bool:
        """Whether the k-th write attempt (1-based) stalls."""
        first = self.stall_write_k
        if first is None or k < first:
            return False
        return self.stall_count == 0 or k < first + self.stall_count


_SPEC_KEYS = {f.name for f in fields(FaultSpec)}


def env_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """The fault options the environment gives this process (see the module docstring)."""
    scoped = environ.get(ATTEMPT_ENV_VAR)
    if scoped:
        attempt = environ.get(ATTEMPT)
        plan = json.loads(scoped)
        return dict(plan.get(attempt, plan.get("*")) or {}) if attempt else {}
    return json.loads(environ.get(ENV_VAR) or "{}")


def _split_inner(url: str) -> tuple[str, str]:
    """``faulty://s3://b/p`` -> ("s3", "s3://b/p"); ``faulty:///tmp/x`` -> ("file", "/tmp/x")."""
    rest = url[len(_PREFIX):] if url.startswith(_PREFIX) else url
    protocol, _ = fsspec.core.split_protocol(rest)
    return (protocol or "file"), rest


class FaultyFileSystem(AbstractFileSystem):
    protocol = ("faulty",)
    cachable = False  # every instance has its own counters and random stream

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fs: AbstractFileSystem | None = None,
        sleep: Callable[[float], None] = time.sleep,
        **options: Any,
    ) -> None:
        env = env_options(os.environ)
        unknown = sorted(set(env) - _SPEC_KEYS - {"target_protocol", "target_options"})
        if unknown:
            raise ValueError(f"Received {ENV_VAR} option(s) {unknown}; expected some of {sorted(_SPEC_KEYS)}")
        super().__init__()
        self.spec = FaultSpec(**{**{k: v for k, v in env.items() if k in _SPEC_KEYS},
                                 **{k: v for k, v in options.items() if k in _SPEC_KEYS}})
        if fs is None:
            # Keyword options that are not fault options belong to the inner filesystem, so
            # "faulty://s3://b/p" takes the same storage_options as "s3://b/p".
            forwarded = {k: v for k, v in options.items() if k not in _SPEC_KEYS}
            protocol = target_protocol or env.get("target_protocol") or "file"
            inner_options = {**(env.get("target_options") or {}), **(target_options or {}), **forwarded}
            fs = fsspec.filesystem(protocol, **inner_options)
        elif set(options) - _SPEC_KEYS:
            raise ValueError(
                f"Received option(s) {sorted(set(options) - _SPEC_KEYS)} with fs=; "
                f"expected only fault options {sorted(_SPEC_KEYS)}"
            )
        self.fs = fs
        self.stats: Counter[str] = Counter()
        self._sleep = sleep
        self._rng = random.Random(self.spec.seed)
        self._write_attempts = 0
        self._released = threading.Event()

    def release(self) -> None:
        """End every stall, the one in progress and all later ones (``stall_s`` None or not)."""
        self._released.set()

    # -- URL handling: the inner filesystem's paths are used unchanged -----------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        protocol, rest = _split_inner(str(path))
        if protocol == "file" and not str(path).startswith(_PREFIX) and "://" not in rest:
            return rest.rstrip("/") or rest  # an already stripped inner path (e.g. "/x/y")
        return fsspec.get_filesystem_class(protocol)._strip_protocol(rest)

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        protocol, rest = _split_inner(path)
        inner = fsspec.get_filesystem_class(protocol)._get_kwargs_from_urls(rest)
        return {"target_protocol": protocol, "target_options": inner}

    @property
    def local_file(self) -> bool:
        """True when the inner filesystem is local (the store then creates parent dirs)."""
        return bool(getattr(self.fs, "local_file", False))

    # -- fault injection -----------------------------------------------------------------

    def _gate(self, op: str, path: str, *, write: bool = False) -> None:
        self.stats["ops"] += 1
        if self.spec.latency_s:
            self._sleep(self.spec.latency_s)
        if write:
            self._write_attempts += 1
            self.stats["writes"] += 1
            done = self.stats["files_written"]
            if self.spec.stop_after_files is not None and done >= self.spec.stop_after_files:
                raise SimulatedCrash(f"simulated crash before writing {path} ({done} files written)")
            if self.spec.stalls_write(self._write_attempts) and not self._released.is_set():
                self.stats["stalls"] += 1
                self._released.wait(self.spec.stall_s)
            if self._write_attempts == self.spec.fail_write_k:
                if self.spec.fail_kind == "nospace":
                    raise OSError(errno.ENOSPC, f"No space left on device (injected): write #{self._write_attempts} {path}")
                if self.spec.fail_kind == "permanent":
                    raise PermissionError(f"injected permanent fault: write #{self._write_attempts} {path}")
                raise ConnectionResetError(f"injected transient fault: write #{self._write_attempts} {path}")
        if self.stats["ops"] == self.spec.fail_op_k:
            raise ConnectionResetError(f"injected transient fault in {op} {path} (operation #{self.stats['ops']})")
        if self.spec.transient_rate and self._rng.random() < self.spec.transient_rate:
            raise ConnectionResetError(f"injected transient fault in {op} {path}")

    # -- wrapped operations --------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        writing = any(c in mode for c in "wax")
        self._gate("open", path, write=writing)
        if not writing:
            self.stats["reads"] += 1
        return _CountedFile(self, self.fs.open(path, mode, **kwargs), writing)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self._gate("pipe_file", path, write=True)
        self.fs.pipe_file(path, value, **kwargs)
        self.stats["files_written"] += 1

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self._gate("cat_file", path)
        data = self.fs.cat_file(path, start=start, end=end, **kwargs)
        self.stats["reads"] += 1
        self.stats["bytes_read"] += len(data)
        return data

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._gate("ls", path)
        return self.fs.ls(path, detail=detail, **kwargs)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any) -> Any:
        self._gate("find", path)
        return self.fs.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._gate("info", path)
        return self.fs.info(path, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._gate("makedirs", path)
        self.fs.makedirs(path, exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self._gate("mkdir", path)
        self.fs.mkdir(path, create_parents=create_parents, **kwargs)

    def rm_file(self, path: str) -> None:
        self._gate("rm_file", path)
        self.fs.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._gate("rm", str(path))
        self.fs.rm(path, recursive=recursive, maxdepth=maxdepth)

    def rmdir(self, path: str) -> None:
        self._gate("rmdir", path)
        self.fs.rmdir(path)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        # A write attempt (a crash may hit between a temp write and its rename), but no
        # new file's bytes: files_written is not incremented.
        self._gate("mv", path2, write=True)
        self.fs.mv(path1, path2, **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)


class _CountedFile:
    """The inner file object, counting bytes read and completed writes."""

    def __init__(self, owner: FaultyFileSystem, inner: Any, writing: bool) -> None:
        self._owner = owner
        self._inner = inner
        self._writing = writing
        self._finished = False

    def read(self, *args: Any) -> bytes:
        data = self._inner.read(*args)
        self._owner.stats["bytes_read"] += len(data)
        return data

    def write(self, data: bytes) -> int:
        return self._inner.write(data)

    def discard(self) -> None:
        self._finished = True
        abandon_write(self._inner)

    def close(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._inner.close()
        if self._writing:
            self._owner.stats["files_written"] += 1

    @property
    def closed(self) -> bool:
        return self._finished

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
