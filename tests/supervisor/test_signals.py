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


def test_an_installed_pause_ends_when_a_child_exits_and_restore_removes_the_wakeup():
    import subprocess
    import sys
    import time

    # A wake-up fd another test left set (the rescue listener's, rundir/rescue_signal.py) would
    # make the installer stand aside (the next test): take it off for this one, put it back after.
    left_over = signal.set_wakeup_fd(-1)
    installer = ProcessSignals()
    installer.install(lambda name: None)
    try:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        started = time.monotonic()
        installer.pause(30.0)  # SIGCHLD writes to the wake-up pipe: the pause ends with the child
        assert time.monotonic() - started < 30.0
        assert child.wait(timeout=60) == 0  # the exit code is still the caller's to read (not auto-reaped)
        installer.restore()
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        assert signal.set_wakeup_fd(-1) == -1  # restore took its pipe off
    finally:
        installer.restore()
        signal.set_wakeup_fd(left_over)


def test_a_wakeup_pipe_someone_else_set_is_left_alone_and_pauses_are_plain_sleeps():
    import time

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    left_over = signal.set_wakeup_fd(write_fd)
    try:
        installer = ProcessSignals()
        installer.install(lambda name: None)
        assert signal.set_wakeup_fd(write_fd) == write_fd  # still theirs
        started = time.monotonic()
        installer.pause(0.05)
        assert time.monotonic() - started >= 0.05
        installer.restore()
        assert signal.set_wakeup_fd(-1) == write_fd
    finally:
        signal.set_wakeup_fd(left_over)
        os.close(read_fd)
        os.close(write_fd)
