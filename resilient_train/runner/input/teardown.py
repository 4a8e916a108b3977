"""Epoch ends without TensorFlow's iterator teardown on the training thread.

Every epoch trains from a new input pipeline (runner/input/data.py: the input of epoch ``e`` is a
pure function of ``(seed, e)``), so every epoch end drops the old iterator. Dropping it is
not free: TensorFlow tears the pipeline down synchronously in the thread that drops the
last reference, and for a tf.data pipeline that has run for a while that blocked for
**tens of seconds** at an epoch end, with the process idle (measured on this project's
2-worker digits run, 5 x 4000 steps: 20-61 s pauses at most epoch ends; TensorFlow's own
tutorial loop, a new iterator per epoch and ``del it``, spent 12-100 s in that ``del``). Its
stacks were in C code under the line that left the epoch. One rank stalling stalls the
group: its peers wait for it in the next collective.

# Implementation:
# The training thread hands a finished epoch's iterator to :class:`IteratorReaper` and
# goes on with the next epoch at once. One daemon thread takes the iterators in order
# and drops them; the C++ teardown runs there (TensorFlow releases the GIL while it
# deletes a tensor handle, pywrap_tensor.cc EagerTensor_dealloc), so the training thread
# keeps running. Memory stays bounded: at most ``max_pending`` retired iterators exist at
# once (the one being torn down and those queued); a retire beyond that waits for room, so
# a retired pipeline's buffers (a shuffle buffer, prefetched batches) never pile up over
# hundreds of short epochs. Each wait is reported to ``on_wait``, each teardown's duration
# to ``on_teardown`` (on the reaper thread, which runs in the retiring thread's contextvars,
# so its events carry the worker's run id and rank).
#
# At exit nothing waits for the reaper: a worker leaves by ``os._exit`` (runner/process/worker_main.py),
# which abandons whatever is still queued, as it abandons every other TensorFlow teardown.
# A preempted epoch's iterator is not retired at all (runner/input/reentry.py keeps it past
# the preemption save, for the same reason).
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from typing import Any, Callable

__all__ = ["IteratorReaper"]


class IteratorReaper:
    """Drops retired iterators on a thread of its own, at most ``max_pending`` at a time."""

    def __init__(self, *, max_pending: int = 2, on_wait: Callable[[float], None] | None = None,
                 on_teardown: Callable[[Any, float], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if max_pending < 1:
            raise ValueError(f"Received max_pending={max_pending}; expected >= 1")
        self._room = threading.Semaphore(max_pending)  # released when one is torn down
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._on_wait = on_wait
        self._on_teardown = on_teardown
        self._clock = clock
        self._thread: threading.Thread | None = None
        self.retired = 0  # iterators handed over (training thread)
        self.torn_down = 0  # of those, dropped by the reaper thread

    def retire(self, iterator: Any, label: Any = None) -> float:
        """Hand ``iterator`` over (the caller must keep no other reference to it); the
        seconds the caller waited for room (0.0 unless ``max_pending`` were still pending).
        ``label`` (e.g. the epoch) is passed to ``on_teardown``."""
        if self._thread is None:  # only the training thread retires: no race here
            context = contextvars.copy_context()
            self._thread = threading.Thread(target=context.run, args=(self._run,), name="iterator-reaper", daemon=True)
            self._thread.start()
        waited = 0.0
        if not self._room.acquire(blocking=False):
            started = self._clock()
            self._room.acquire()
            waited = self._clock() - started
            if self._on_wait is not None:
                self._on_wait(waited)
        self.retired += 1
        self._queue.put((iterator, label))
        return waited

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every retired iterator is torn down (for tests); False on timeout."""
        deadline = self._clock() + timeout_s
        while self.torn_down < self.retired:
            if self._clock() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        while True:
            iterator, label = self._queue.get()
            started = self._clock()
            del iterator  # the last reference: TensorFlow's teardown runs here, on this thread
            seconds = self._clock() - started
            self.torn_down += 1
            self._room.release()
            if self._on_teardown is not None:
                self._on_teardown(label, seconds)
