"""The supervisor's signal installer: SIGTERM/SIGINT reach the callback; restore undoes it."""

from __future__ import annotations

import os
import signal

from resilient_train.supervisor.signals import NoSignals, ProcessSignals


def test_sigterm_and_sigint_call_back_by_name_and_restore_puts_back_the_previous_handlers():
    def previous(signum, frame):  # pragma: no cover - must never be called while installed
        raise AssertionError(signum)

    old = {sig: signal.signal(sig, previous) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        received: list[str] = []
        installer = ProcessSignals()
        installer.install(received.append)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert received == ["SIGTERM", "SIGINT"]
        installer.restore()
        assert [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)] == [previous, previous]
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def test_no_signals_keeps_the_callback_until_restored():
    received: list[str] = []
    installer = NoSignals()
    installer.install(received.append)
    installer.callback("SIGTERM")
    installer.restore()
    assert received == ["SIGTERM"] and installer.callback is None
