"""A deadline on storage calls that stop making progress (a stalled object store).

Why: fsspec calls block. An S3 or GCS request that never answers (a half-open TCP
connection, a gateway that accepted the request and went quiet, an NFS mount that hangs)
would block the committing thread forever: a sync save would freeze training, an async
save would freeze the next save that waits for it, and neither would ever become an event.
The backends' own socket timeouts (checkpoint/options.py ``with_backend_timeouts``) catch
most of this, but not every layer has one (a FUSE or NFS mount, a client's own retry loop
around a timeout), so the store also bounds every call itself.

# Implementation:
#   caller (training or persist thread)          a daemon call thread, reused from call to call
#     hand fn to an idle call thread      -------->    fn()   (calls progress() after each
#     wait until it is done, or until                  chunk it moves: each is "progress")
#       timeout_s passed since the last
#       progress: raise TimeoutError
#     (the call thread is abandoned, not killed: Python cannot cancel a blocking call;
#      it rejoins the idle threads if the call ever returns)
#
# Call threads are kept, not started per call: a commit makes ~16 storage calls (listings,
# fence checks, uploads, the manifest), and starting a thread for each cost ~1 ms of a
# busy core per call, paid on every save (measured: 0.45 s over 30 saves of digits_cnn).
#
# The deadline measures silence, not duration: a 20 GB upload that keeps moving chunks is
# never cut, one that moves nothing for ``timeout_s`` is. A call that moves no chunks
# (a PUT of a manifest, a listing) must finish within ``timeout_s``.
#
# Why abandoning is safe for the commit protocol (checkpoint/store.py): the TimeoutError is
# transient, so the RetryPolicy retries the same operation, which writes the same bytes to
# the same name (an abandoned upload that wakes up later writes those bytes again). The
# manifest is started only after every upload RETURNED, so a late manifest PUT can only
# commit a checkpoint whose files are all there; a fenced manifest is created create-only
# (a retry that finds the late PUT's bytes confirms them). An abandoned call dies with its
# process at the latest: a save that still fails after the retries ends the worker.
#
# What remains: a save reported failed may still turn out committed, complete, if its late
# manifest PUT lands (readers take it like any commit). And where a write is not one atomic
# PUT (a local or NFS store on another filesystem than the staging files, memory://), an
# abandoned upload that wakes up after its retry succeeded rewrites the file in place: until
# it finishes, a reader can see a short file, which fails its size or sha256 check and is
# reported and skipped (checkpoint_rejected), never restored.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from typing import Callable, TypeVar, cast

__all__ = ["call_with_deadline", "progress"]

T = TypeVar("T")

_current = threading.local()  # .watch: the _Watch of the storage call running on this thread


class _Watch:
    """When the call last made progress, and whether it has finished (with what).

    ``lock`` settles a race between the call finishing and the caller giving up on it:
    exactly one of them decides whether the call thread returns to the idle ones.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last = clock()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.abandoned = False
        self.result: object = None
        self.error: BaseException | None = None

    def beat(self) -> None:
        self.last = self._clock()


class _CallThread:
    """One daemon thread running storage calls, one at a time, for as long as it lives."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[contextvars.Context, Callable[[], None]]] = queue.SimpleQueue()
        thread = threading.Thread(target=self._serve, name="rt-storage-call", daemon=True)
        thread.start()
        self.ident = thread.ident

    def run(self, context: contextvars.Context, call: Callable[[], None]) -> None:
        self._calls.put((context, call))

    def _serve(self) -> None:
        while True:
            context, call = self._calls.get()
            context.run(call)


_idle: list[_CallThread] = []
_idle_lock = threading.Lock()


def _take() -> _CallThread:
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _CallThread()


def _give_back(worker: _CallThread) -> None:
    with _idle_lock:
        _idle.append(worker)


def _forget_threads_after_fork() -> None:  # a forked child has none of its parent's threads
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


def progress() -> None:
    """Tell the deadline of the storage call running on this thread that it moved bytes.

    A no-op outside :func:`call_with_deadline` (no deadline, or a call without one).
    """
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.beat()


def call_with_deadline(
    fn: Callable[[], T],
    timeout_s: float,
    *,
    what: str,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``fn()`` on a call thread; TimeoutError once it made no progress for ``timeout_s``.

    ``what`` names the call in the error (``upload s3://b/run/ckpt-.../ckpt.index``).
    Exceptions of ``fn``, ``BaseException`` included (the fault injector's SimulatedCrash),
    are re-raised here unchanged.
    """
    if not timeout_s > 0:
        raise ValueError(f"Received timeout_s={timeout_s!r}; expected a number of seconds > 0")
    watch = _Watch(clock)
    worker = _take()

    def run() -> None:
        _current.watch = watch
        try:
            watch.result = fn()
        except BaseException as exc:  # handed to the caller, never swallowed
            watch.error = exc
        finally:
            _current.watch = None
            with watch.lock:
                watch.done.set()
                if watch.abandoned:  # the caller gave up; the thread is free again
                    _give_back(worker)

    worker.run(contextvars.copy_context(), run)  # events emitted inside keep the bound run/rank
    remaining = timeout_s
    while not watch.done.wait(remaining):
        silent = clock() - watch.last
        if silent >= timeout_s:
            with watch.lock:
                if not watch.done.is_set():
                    watch.abandoned = True
                    raise TimeoutError(f"{what} made no progress for {timeout_s:g} s (storage stalled)")
            break  # it finished just now
        remaining = timeout_s - silent
    _give_back(worker)
    if watch.error is not None:
        error, watch.error = watch.error, None
        raise error
    return cast(T, watch.result)
