"""The real supervisor and local launcher with 64 workers: stand-ins (tests/support/standin_worker.py),
real processes that speak the worker side of the run-dir contract without TensorFlow.

One is SIGKILLed mid-run; the group is torn down, restarted from the last commit, and
finishes. Exact outcomes only: exit code, attempts, the root cause's rank, signal and step,
the events of every rank, the final step and digest. (How long each phase takes as the
group grows is benchmarks/supervisor_scaling.py's job.)
"""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from resilient_train.errors import EXIT_GROUP_BROKEN, EXIT_OK
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import read_events
from resilient_train.supervisor.launchers.local import LocalLauncher
from resilient_train.supervisor.supervisor import Supervisor
from tests.support.standin_worker import StandinOptions, StandinSpawner

WORKERS = 64
VICTIM = 37
DIES_AT = 6  # after the chief's commit at step 4: the restart restores step 4
OPTIONS = StandinOptions(steps=8, step_s=0.05, save_every=4, die_at=(VICTIM, DIES_AT))


@pytest.mark.slow  # the supervisor's restart at scale: benchmarks/supervisor_scaling.py; a kill and restart: every kill test
def test_64_standins_one_killed_restart_and_finish(tmp_path):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers=WORKERS,
                    warm_standby=False, max_restarts=1)
    launcher = LocalLauncher(job, spawner=StandinSpawner(OPTIONS))

    code = Supervisor(job, out=io.StringIO(), launcher=launcher, backoff_initial_s=0.01).run()

    assert code == EXIT_OK
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["attempts"], summary["restarts"]) == ("completed", 2, 1)
    assert (summary["root_cause"]["rank"], summary["root_cause"]["exit"], summary["root_cause"]["attempt"]) == (
        VICTIM, "killed by SIGKILL", 1)
    assert summary["global_step"] == 8
    assert summary["weights_sha256"] == hashlib.sha256(b"stand-in weights at step 8\n").hexdigest()

    records = read_events(tmp_path / "run" / "events.jsonl")
    started = [(r["attempt"], r["rank"]) for r in records if r["event"] == "worker_started"]
    assert sorted(started) == [(a, rank) for a in (1, 2) for rank in range(WORKERS)]
    failed = {r["rank"]: r.get("signal", r.get("exit_code")) for r in records
              if r["event"] == "worker_failed" and r["attempt"] == 1}
    # The victim was killed; each survivor left as a broken group's member does (exit 4), or
    # was SIGKILLed by the teardown if it had not left yet: no rank of attempt 1 exited 0.
    assert failed[VICTIM] == "SIGKILL"
    assert set(failed) == set(range(WORKERS))
    assert all(code in (EXIT_GROUP_BROKEN, "SIGKILL") for rank, code in failed.items() if rank != VICTIM)
    exited_2 = {r["rank"]: r.get("exit_code") for r in records if r["event"] == "worker_exited" and r["attempt"] == 2}
    assert exited_2 == {rank: EXIT_OK for rank in range(WORKERS)}
    restart = next(r for r in records if r["event"] == "gang_restart")
    assert (restart["attempt"], restart["root_cause_rank"]) == (2, VICTIM)
    restored = next(r for r in records if r["event"] == "restored")
    assert (restored["attempt"], restored["global_step"]) == (2, 4)
    finished = next(r for r in records if r["event"] == "run_finished")
    assert (finished["status"], finished["global_step"], finished["restarts"]) == ("completed", 8, 1)
