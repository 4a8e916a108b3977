"""The rescue request: the supervisor's SIGUSR2 to a surviving worker, received off the main thread.

When a worker dies and the memory tier is on (``--snapshot-every``), the supervisor asks
the lowest-ranked survivor to commit its newest in-memory snapshot (runner/state/memory_tier.py).
The survivor's training thread is then usually blocked inside a collective that will only
fail seconds later (TensorFlow's heartbeat), and a Python signal handler runs only on the
main thread between bytecodes: a handler would run too late. So the request is received by
a daemon thread.

# Implementation:
#   install (main thread, at start-up, before the supervisor can ask)
#     a no-op Python handler for SIGUSR2 (its default action kills the process) and
#     signal.set_wakeup_fd(write end of a pipe): CPython's C-level handler writes the
#     signal number into the pipe at once, whatever the main thread is doing
#   listener thread (daemon)
#     blocks reading the pipe; on a SIGUSR2 byte it runs the registered target (the
#     Trainer's Rescuer, once the memory tier exists; before that: rescue_skipped)
#   before_exit (the worker's error path)
#     a worker whose own collective fails waits RESCUE_ARRIVAL_S for a request that may be
#     on its way, then for a rescue in progress (both bounded)
#
# One owner: the signal number and the event names are defined here, for the supervisor
# that sends and waits and for the worker that answers. No TensorFlow here.
"""

from __future__ import annotations

import contextvars
import os
import select
import signal
import threading
from typing import Callable

from resilient_train.rundir.events import emit as _default_emit

__all__ = ["rescue_hold_s", "rescue_deadline_s", "RESCUE_SIGNAL", "RESCUE_COMMITTED", "RESCUE_SKIPPED", "RESCUE_REQUESTED", "RESCUE_ABANDONED", "RESCUE_ARRIVAL_S",
           "RescueListener", "install", "listener"]

RESCUE_SIGNAL = signal.SIGUSR2  # SIGUSR1 is the stack dump's (rundir/stacks.py)
RESCUE_REQUESTED = "rescue_requested"  # the supervisor asked a survivor
RESCUE_COMMITTED = "rescue_committed"  # the survivor committed its snapshot
RESCUE_SKIPPED = "rescue_skipped"  # the survivor had nothing to commit, or its commit failed (reason)
RESCUE_ABANDONED = "rescue_abandoned"  # the supervisor's deadline passed without an answer
# How long a failing worker waits for a rescue request before it exits: the supervisor
# polls every 0.05 s, and a chief's death breaks a survivor's collective at once.
RESCUE_ARRIVAL_S = 2.0


def rescue_hold_s(storage_timeout: float) -> float:
    """How long a rescuer waits for its own snapshot or persist in progress to finish."""
    return min(10.0, storage_timeout)


def rescue_deadline_s(storage_timeout: float) -> float:
    """How long the supervisor waits for a rescue's answer before it stops the group
    without one: the rescuer's hold, one commit's storage allowance (--storage-timeout:
    a call that moves no bytes for that long fails), and 10 s for the commit's own work."""
    return rescue_hold_s(storage_timeout) + storage_timeout + 10.0


class RescueListener:
    """The daemon thread that turns a SIGUSR2 into a call of the registered target.

    ``target()``: the rescue (runs on the listener thread, in the context bound when the
    listener started, so its events carry run_id / attempt / rank / role).
    """

    def __init__(self, *, emit: Callable[..., None] = _default_emit) -> None:
        self._emit = emit
        self._target: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._requested = threading.Event()
        self._read_fd: int | None = None

    def install(self) -> None:
        """Main thread only: the handler, the wakeup pipe, the listener thread."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
        signal.signal(RESCUE_SIGNAL, lambda signum, frame: None)  # the work is the listener's
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._read_fd = read_fd
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(self._listen,), name="rt-rescue-listener", daemon=True).start()

    def set_target(self, target: Callable[[], None] | None) -> None:
        with self._lock:
            self._target = target

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a rescue in progress; True when none is."""
        return self._idle.wait(timeout_s)

    def before_exit(self, *, arrival_s: float, finish_s: float) -> bool:
        """A failing worker's last wait: a request may still be on its way (a chief's death
        breaks a survivor's collective at once, as fast as the supervisor sees it), so give
        it ``arrival_s`` to arrive, then a rescue in progress ``finish_s`` to end.
        True when no rescue is left running."""
        self._requested.wait(arrival_s)
        return self._idle.wait(finish_s)

    def _listen(self) -> None:
        assert self._read_fd is not None
        while True:
            select.select([self._read_fd], [], [])
            data = os.read(self._read_fd, 512)  # every Python-handled signal's number lands here
            if int(RESCUE_SIGNAL) in data:
                self.handle()

    def handle(self) -> None:
        """Run the rescue now (the listener thread's work; tests call it directly)."""
        with self._lock:
            target = self._target
            self._idle.clear()
            self._requested.set()
        try:
            if target is None:
                self._emit(RESCUE_SKIPPED, reason="no memory tier in this process yet (still starting)")
            else:
                target()
        finally:
            self._idle.set()


_LISTENER = RescueListener()


def listener() -> RescueListener:
    """This process's listener (one per process: there is one wakeup fd)."""
    return _LISTENER


def install() -> RescueListener:
    """Install this process's listener (main thread, once, at start-up); return it."""
    _LISTENER.install()
    return _LISTENER
