"""The supervisor's own stop signals: SIGTERM and SIGINT call back, and are put back after.

A scheduler preempts a job by sending SIGTERM to the supervisor (Ctrl-C sends SIGINT to the
whole process group). The supervisor does not act inside the handler: the callback only
records the request, and the loop forwards it to the workers on its next poll.

The installer also gives the loop its pause between polls (``pause``). Installed for real, a
pause ends early when a child process exits (SIGCHLD) or a stop signal arrives: CPython's
C-level handler writes the signal to a wake-up pipe (``signal.set_wakeup_fd``) that the pause
selects on. A local worker's death then reaches the loop without waiting for its next 50 ms
poll, twice per restart (the death, then the survivors' exit after their SIGKILL): measured,
detection 0.030 s against 0.053 s median and the old group's stop 0.043 s against
0.051-0.104 s (benchmarks/README.md).

The supervisor takes its :class:`SignalInstaller` as a constructor argument, so tests
drive the loop without touching the process's real handlers (pass :class:`NoSignals`, or
record the callback and call it).
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any, Callable, Protocol, Sequence

__all__ = ["SignalInstaller", "ProcessSignals", "NoSignals", "StopRequest", "STOP_SIGNALS"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The run's request to stop, from whichever source came first: the installed handler's
    signal name (``SIGTERM``), the launcher (``launcher:<name>``), a preemption notice
    (``notice:<provider>``, or this host's doomed node).

    The one input that can arrive in any state of the loop (a signal handler sets it between
    two polls), so it is not carried by a transition (supervisor/attempt.py): the loop reads
    it where it matters, and a request that comes while the group is already stopping is
    still honoured (forwarded, and the run ends PREEMPTED).
    """

    def __init__(self) -> None:
        self.source: str | None = None

    def request(self, source: str) -> bool:
        """Record ``source`` unless a request came first; True when this one is the request."""
        if self.source is not None:
            return False
        self.source = source
        return True


class SignalInstaller(Protocol):
    def install(self, callback: Callable[[str], None]) -> None:
        """From now on, call ``callback(signal_name)`` (e.g. ``"SIGTERM"``) on a stop signal."""

    def restore(self) -> None:
        """Put back whatever handled those signals before :meth:`install`."""

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when something the loop must see happened."""


class ProcessSignals:
    """Real handlers for ``signals`` (SIGTERM, SIGINT) in this process, and pauses that a
    child's exit ends early.

    ``signal.signal`` works only in the main thread; elsewhere (a test driving the loop in
    a thread) installing is skipped, as it was before this class existed, and a pause is a
    plain sleep. So it is where another wake-up pipe is already set (an event loop's).
    """

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self._previous: dict[signal.Signals, Any] = {}
        self._wakeup: _Wakeup | None = None

    def install(self, callback: Callable[[str], None]) -> None:
        def handler(signum: int, frame: Any) -> None:
            callback(signal.Signals(signum).name)

        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                return
        self._wakeup = _Wakeup.install()

    def restore(self) -> None:
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def pause(self, seconds: float) -> None:
        if self._wakeup is None:
            time.sleep(seconds)
        else:
            self._wakeup.wait(seconds)


def _child_exited(signum: int, frame: Any) -> None:
    """SIGCHLD's Python handler: nothing to do, the wake-up pipe already woke the pause.
    (Never SIG_IGN: that would reap the children before Popen.poll could see their codes.)"""


class _Wakeup:
    """The wake-up pipe: every signal with a Python handler (SIGCHLD, the stop signals) writes
    a byte to it, and a pause selects on its read end."""

    def __init__(self, read_fd: int, write_fd: int, previous_chld: Any) -> None:
        self._read_fd, self._write_fd, self._previous_chld = read_fd, write_fd, previous_chld

    @classmethod
    def install(cls) -> _Wakeup | None:
        """The wake-up pipe, or None where another one is set (left alone: plain sleeps)."""
        read_fd, write_fd = os.pipe()
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)  # set_wakeup_fd requires it; the drain must not block
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous_fd != -1:
            signal.set_wakeup_fd(previous_fd)
            os.close(read_fd)
            os.close(write_fd)
            return None
        return cls(read_fd, write_fd, signal.signal(signal.SIGCHLD, _child_exited))

    def wait(self, seconds: float) -> None:
        select.select([self._read_fd], [], [], max(0.0, seconds))
        try:
            while os.read(self._read_fd, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.signal(signal.SIGCHLD, self._previous_chld)
        signal.set_wakeup_fd(-1)
        os.close(self._read_fd)
        os.close(self._write_fd)


class NoSignals:
    """Installs nothing; keeps the callback so a test can deliver a "signal" itself."""

    def __init__(self) -> None:
        self.callback: Callable[[str], None] | None = None

    def install(self, callback: Callable[[str], None]) -> None:
        self.callback = callback

    def restore(self) -> None:
        self.callback = None

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)
