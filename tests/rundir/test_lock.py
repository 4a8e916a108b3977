"""The run-dir lock: one holder at a time, released by the kernel when the holder dies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resilient_train.errors import RunDirLockedError
from resilient_train.rundir.lock import LOCK_NAME, RunDirLock, read_holder

HOLD = textwrap.dedent(
    """
    import sys
    from resilient_train.rundir.lock import RunDirLock
    lock = RunDirLock(sys.argv[1]).acquire()
    lock.record(run_id="run-held")
    print("held", flush=True)
    sys.stdin.read()  # hold until the test closes stdin or kills us
    """
)


def hold_in_child(run_dir: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "held\n"  # blocks until the lock is really held
    return child


def test_the_holder_record_names_pid_host_start_and_run_id(tmp_path):
    with RunDirLock(tmp_path, pid=4242, host="node-a") as lock:
        lock.record(run_id="abc123")
        holder = read_holder(tmp_path / LOCK_NAME)
    assert holder is not None
    assert (holder["pid"], holder["host"], holder["run_id"]) == (4242, "node-a", "abc123")
    assert holder["started_at"].endswith("+00:00")


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with RunDirLock(tmp_path, pid=4242, host="node-a") as first:
        first.record(run_id="abc123")
        with pytest.raises(RunDirLockedError) as info:
            RunDirLock(tmp_path).acquire()
    message = str(info.value)
    assert f"run dir {tmp_path} is in use by another resilient-train run (pid 4242 on host node-a, started " in message
    assert ", run id abc123)" in message
    assert "pass another --run-dir" in message
    assert len(message.splitlines()) == 2


def test_release_lets_the_next_run_in_and_keeps_the_file(tmp_path):
    first = RunDirLock(tmp_path, pid=1).acquire()
    first.release()
    with RunDirLock(tmp_path, pid=2) as second:
        assert second.held
    assert read_holder(tmp_path / LOCK_NAME)["pid"] == 2
    assert not second.held


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_is_killed(tmp_path):
    child = hold_in_child(tmp_path)
    try:
        with pytest.raises(RunDirLockedError, match=rf"\(pid {child.pid} on host .*, run id run-held\)"):
            RunDirLock(tmp_path).acquire()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    # No cleanup by the dead holder: the kernel released the lock with its descriptor.
    with RunDirLock(tmp_path) as lock:
        assert lock.held
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] != child.pid


def test_an_unreadable_holder_record_still_refuses(tmp_path):
    with RunDirLock(tmp_path):
        (tmp_path / LOCK_NAME).write_text("{not json")
        with pytest.raises(RunDirLockedError, match="a process that has not written its details yet"):
            RunDirLock(tmp_path).acquire()
