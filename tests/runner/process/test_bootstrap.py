"""The start-up every process of a run shares (runner/process/bootstrap.py ``worker_process``), in process.

The real processes (an MWMS worker, the parameter-server tier) are exercised end to end by
tests/integration; here the start-up's own promises: where it writes, what it binds, that
SIGTERM/SIGINT only set ``stop``, that ``until_exit`` closes before an error is recorded,
and that a bad ``RT_*`` variable is a one-line usage error with nothing created.
"""

from __future__ import annotations

import io
import json
import os
import signal
import tempfile

import pytest

from resilient_train.errors import EXIT_FAILURE, EXIT_USAGE
from resilient_train.job.config import JobConfig
from resilient_train.rundir import events
from resilient_train.rundir.errorfile import error_file_path, recording
from resilient_train.rundir.scratch import remove_private_tempdir
from resilient_train.runner.process.bootstrap import worker_process


@pytest.fixture()
def process_globals(monkeypatch):
    """What a process's start-up changes for good, put back after the test."""
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", tempfile.gettempdir()))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    remove_private_tempdir()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    import faulthandler

    faulthandler.unregister(signal.SIGUSR1)
    events.configure(None, console=None)


def test_worker_process_starts_the_process_of_the_run(tmp_path, process_globals):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"))
    environ = {"RT_ATTEMPT": "2", "RT_RUN_ID": "r-1"}
    with recording("resilient-train ps", err=io.StringIO()) as state:
        with worker_process(state, job, rank=1, role="worker", writes_group_events=False,
                            environ=environ) as process:
            attempt = tmp_path / "run" / "attempt-2"
            assert (state.attempt_dir, state.rank) == (attempt, 1)
            assert process.attempt_dir.path == attempt and attempt.is_dir()
            assert process.job.run_dir == job.run_dir and (process.launched.run_id, process.rank) == ("r-1", 1)
            scratch = process.run_dir.temp_dir(1)
            assert (tempfile.gettempdir(), os.environ["TMPDIR"]) == (str(scratch), str(scratch))
            assert process.attempt_dir.stacks(1).read_text().startswith("# resilient-train stacks: rank 1 pid ")
            events.emit("probe", group=True)  # not this process's to write: writes_group_events=False
            events.emit("probe", value=3)
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            assert process.stop.is_set()
            process.ignore_stop_signals()
            assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == [signal.SIG_IGN] * 2
    [record] = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert {k: record[k] for k in ("event", "value", "run_id", "attempt", "rank", "role")} == {
        "event": "probe", "value": 3, "run_id": "r-1", "attempt": 2, "rank": 1, "role": "worker"}


def test_until_exit_closes_before_the_error_is_recorded(tmp_path, process_globals):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"))
    seen = []
    with recording("resilient-train worker", err=io.StringIO()) as state:
        state.on_failure = lambda: seen.append(("on_failure", error_file_path(state.attempt_dir, 0).exists()))
        with worker_process(state, job, rank=0, role="chief", writes_group_events=True, environ={}) as process:
            process.until_exit.callback(lambda: seen.append(("closed", error_file_path(state.attempt_dir, 0).exists())))
            raise RuntimeError("boom")
    assert state.exit_code == EXIT_FAILURE
    assert seen == [("closed", False), ("on_failure", True)]


def test_a_bad_rt_variable_is_a_usage_error_and_nothing_is_created(tmp_path, process_globals):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"))
    err = io.StringIO()
    with recording("resilient-train ps", err=err) as state:
        with worker_process(state, job, rank=0, role="chief", writes_group_events=True, environ={"RT_ATTEMPT": "two"}):
            pytest.fail("the body ran")
    assert state.exit_code == EXIT_USAGE
    assert err.getvalue() == "resilient-train ps: Received RT_ATTEMPT='two'; expected an integer >= 1\n"
    assert not (tmp_path / "run").exists()
