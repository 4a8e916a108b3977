"""The supervisor's own stop signals: SIGTERM and SIGINT call back, and are put back after.

A scheduler preempts a job by sending SIGTERM to the supervisor (Ctrl-C sends SIGINT to the
whole process group). The supervisor does not act inside the handler: the callback only
records the request, and the loop forwards it to the workers on its next poll.

The supervisor takes its :class:`SignalInstaller` as a constructor argument, so tests
drive the loop without touching the process's real handlers (pass :class:`NoSignals`, or
record the callback and call it).
"""

from __future__ import annotations

import signal
from typing import Any, Callable, Protocol, Sequence

__all__ = ["SignalInstaller", "ProcessSignals", "NoSignals", "STOP_SIGNALS"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class SignalInstaller(Protocol):
    def install(self, callback: Callable[[str], None]) -> None:
        """From now on, call ``callback(signal_name)`` (e.g. ``"SIGTERM"``) on a stop signal."""

    def restore(self) -> None:
        """Put back whatever handled those signals before :meth:`install`."""


class ProcessSignals:
    """Real handlers for ``signals`` (SIGTERM, SIGINT) in this process.

    ``signal.signal`` works only in the main thread; elsewhere (a test driving the loop in
    a thread) installing is skipped, as it was before this class existed.
    """

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self._previous: dict[signal.Signals, Any] = {}

    def install(self, callback: Callable[[str], None]) -> None:
        def handler(signum: int, frame: Any) -> None:
            callback(signal.Signals(signum).name)

        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass

    def restore(self) -> None:
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class NoSignals:
    """Installs nothing; keeps the callback so a test can deliver a "signal" itself."""

    def __init__(self) -> None:
        self.callback: Callable[[str], None] | None = None

    def install(self, callback: Callable[[str], None]) -> None:
        self.callback = callback

    def restore(self) -> None:
        self.callback = None
