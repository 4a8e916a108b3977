"""The slot's long poll (issue 33), with real child processes and no Ray.

The "worker" is a shell script in place of the worker command (``Slot(python=...)``); the
slot's clock is stopped, so a long poll can end only at its worker's exit or its
replacement, never by its ``wait_s`` running out: a poll that returned proves it.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from resilient_train.job.config import JobConfig
from resilient_train.supervisor.launchers import _slot
from resilient_train.supervisor.launchers._slot import Slot, SlotReport

LOG = "attempt-1/worker-0.log"
_READS_BEFORE_GIVING_UP = 2000  # a wait reads the clock once per slice: its exit came long before


class _StoppedClock:
    """A clock that never moves; its first read (the wait's start) runs ``on_first_read``."""

    def __init__(self, on_first_read=lambda: None) -> None:
        self.on_first_read = on_first_read
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == 1:
            self.on_first_read()
        if self.reads > _READS_BEFORE_GIVING_UP:
            raise AssertionError(f"the long poll still waits after {self.reads} clock reads")
        return 0.0


@pytest.fixture(params=["pidfd", "reaping"])
def wait_kind(request, monkeypatch):
    """Both ways a poll waits: on a pidfd, and (where Linux has none) reaping every few ms."""
    if request.param == "reaping":
        monkeypatch.setattr(_slot, "_open_pidfd", lambda pid: None)
    return request.param


def _worker(tmp_path, body: str):
    script = tmp_path / "worker.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def _started(tmp_path, body: str, clock=None) -> tuple[Slot, int]:
    extra = {} if clock is None else {"clock": clock}
    slot = Slot(str(tmp_path / "node"), 0, python=_worker(tmp_path, body), **extra)
    job = JobConfig(recipe="recipes/digits_cnn.py", run_dir="runs/x", launcher="ray", storage="s3://b/p")
    return slot, slot.start(job.to_json(), 0, 1, {})["pid"]


def _fifo(tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    return fifo


def test_a_long_poll_answers_the_exit_of_its_worker_with_its_last_output(tmp_path, wait_kind):
    fifo = _fifo(tmp_path)

    def tell_it_to_exit():  # blocks until the worker opened the pipe: it waits there
        with open(fifo, "w") as pipe:
            pipe.write("go\n")

    clock = _StoppedClock(tell_it_to_exit)
    slot, _ = _started(tmp_path, f'read line < "{fifo}"\necho "told $line"\nexit 7', clock)
    report = slot.poll(wait_s=60)
    assert report.returncode == 7 and clock.reads >= 1  # told to exit only once the wait began
    assert [(c.path, c.data) for c in report.chunks] == [(LOG, b"told go\n")]  # read first, in the same reply
    slot.close()


def test_a_long_poll_whose_worker_is_closed_away_answers_nothing(tmp_path, wait_kind):
    fifo = _fifo(tmp_path)
    waiting = threading.Event()
    slot, _ = _started(tmp_path, f'read line < "{fifo}"', _StoppedClock(waiting.set))  # never told: runs on
    replies = []

    def poll():
        try:
            replies.append(slot.poll(wait_s=60))
        finally:
            waiting.set()

    poller = threading.Thread(target=poll)
    poller.start()
    waiting.wait()
    rest = slot.close()
    poller.join()
    assert replies == [SlotReport(None)] and rest == ()
    assert not slot.run_dir.exists()


def test_a_signal_for_another_pid_never_reaches_the_worker(tmp_path):
    fifo = _fifo(tmp_path)
    slot, pid = _started(tmp_path, f'read line < "{fifo}"', _StoppedClock())
    slot.signal(signal.SIGKILL, pid + 1)  # meant for an earlier attempt's worker
    slot.signal(signal.SIGTERM, pid)
    assert slot.poll(wait_s=60).returncode == -signal.SIGTERM
    slot.close()


def test_polls_and_close_at_once_send_each_byte_of_the_log_exactly_once(tmp_path, monkeypatch):
    """A poller thread long-polls a worker that writes numbered lines without pause, and
    the slot is closed while a poll reads the log: the replies, then close's rest, are the
    lines in order, none twice, none missing.

    The poll pauses in the middle of its read (the pump's ``open``, after it looked up the
    file's offset and before it moves it past what it read), and the slot is closed right
    then: a close that collected beside it would send the same bytes again."""
    import builtins
    import time

    replies, closed, reading = [], threading.Event(), threading.Event()
    poller = None  # the thread below

    def open_pausing_once(*args, **kwargs):
        handle = builtins.open(*args, **kwargs)
        if threading.current_thread() is poller and len(replies) >= 3 and not reading.is_set():
            reading.set()
            time.sleep(0.05)  # room for a close beside this read (none comes: the lock)
        return handle

    monkeypatch.setattr(_slot, "open", open_pausing_once, raising=False)
    slot, _ = _started(tmp_path, "i=0\nwhile :; do echo $i; i=$((i + 1)); done")

    def poll_until_closed():
        try:
            while not closed.is_set() and not any(r.returncode is not None for r in replies):
                replies.append(slot.poll(wait_s=0.01))
        finally:
            reading.set()

    poller = threading.Thread(target=poll_until_closed)
    poller.start()
    reading.wait()
    rest = slot.close()
    closed.set()
    poller.join()
    assert [r.returncode for r in replies] == [None] * len(replies)  # it wrote on until closed
    sent = [c for r in replies for c in r.chunks] + list(rest)
    assert {c.path for c in sent} == {LOG}
    lines = b"".join(c.data for c in sent).split(b"\n")
    assert lines[-1] == b"" and len(lines) > 3
    assert lines[:-1] == [b"%d" % i for i in range(len(lines) - 1)]


def test_a_negative_wait_is_refused(tmp_path):
    slot = Slot(str(tmp_path / "node"), 0, python="/bin/true")
    with pytest.raises(ValueError, match=r"Received wait_s=-1; expected a number of seconds >= 0"):
        slot.poll(wait_s=-1)
    slot.close()
