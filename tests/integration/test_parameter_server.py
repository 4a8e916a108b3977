"""The parameter-server tier with real processes on loopback (docs/parameter_server.md).

A coordinator, one ps and two workers train the migration guide's linear regression
(recipes/linear_regression.py) under the real ParameterServerStrategy. Updates are
asynchronous, so no test compares a digest with an uninterrupted run: each asserts what
the tier guarantees instead (exact final global_step, where training resumed, which
process was restarted and at which address, exit codes, summary.json).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.integration.harness import REPO, run_job, run_job_until, worker_pids

RECIPE = "recipes/linear_regression.py"
FLAGS = ("--strategy", "parameter-server", "--workers", "2", "--ps", "1",
         "--epochs", "2", "--steps-per-epoch", "100", "--save-every-steps", "20")
TOTAL_STEPS = 200
PS_RANK, WORKER_RANK = 1, 3  # rank 0 is the coordinator, 1 the ps, 2..3 the workers


def committed(events, attempt=None):
    return [e["global_step"] for e in events if e["event"] == "checkpoint_committed"
            and (attempt is None or e["attempt"] == attempt)]


def after_commit(step):
    return lambda events: any(s >= step for s in committed(events))


def manifest(run_dir, step):
    return json.loads((run_dir / "checkpoints" / f"ckpt-{step:012d}" / "MANIFEST.json").read_text())


def test_killed_worker_is_restarted_in_place_and_training_completes_without_a_restore(tmp_path):
    def kill_worker(proc, events):
        os.kill(worker_pids(events)[WORKER_RANK], signal.SIGKILL)

    job = run_job_until(RECIPE, tmp_path / "run", *FLAGS, when=after_commit(20), action=kill_worker,
                        tier_default=True)

    assert job.returncode == 0, job.output
    # The memory tier's default (auto) turns itself off here, and says why, once.
    assert [(e["setting"], e["every_steps"], e["reason"], e["rank"]) for e in job.named("memory_tier")] == [
        ("auto", "off", "strategy='parameter-server': no worker holds the whole state", 0)]
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["attempts"], summary["restarts"]) == (
        "completed", TOTAL_STEPS, 1, 0)
    assert summary["worker_restarts"] == 1
    original = [e for e in job.named("worker_started") if e["rank"] == WORKER_RANK]
    (restarted,) = job.named("worker_restarted")
    assert (restarted["rank"], restarted["attempt"], restarted["previous_exit"]) == (WORKER_RANK, 1, -signal.SIGKILL)
    assert restarted["address"] == original[0]["address"]  # same host:port, as ClusterCoordinator needs
    assert job.named("restored") == [] and len(job.named("fresh_start")) == 1
    steps = committed(job.events)
    assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS  # no step counted twice
    final = manifest(job.run_dir, TOTAL_STEPS)
    assert final["extra"]["completed"] is True and final["extra"]["updates_applied"] >= TOTAL_STEPS
    verify = subprocess.run([sys.executable, "-m", "resilient_train", "verify", str(job.run_dir / "checkpoints"),
                             "--deep"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"global_step {TOTAL_STEPS}: consistent" in verify.stdout


def test_killed_ps_restarts_coordinator_and_ps_from_the_last_commit(tmp_path, monkeypatch):
    def kill_ps(proc, events):
        os.kill(worker_pids(events)[PS_RANK], signal.SIGKILL)

    # The job's system temp dir: the coordinator's autograph files go to its own TMPDIR
    # under the run dir (rundir/scratch.py), also when the gang restart stops it.
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    job = run_job_until(RECIPE, tmp_path / "run", *FLAGS, when=after_commit(40), action=kill_ps)

    assert job.returncode == 0, job.output
    assert sorted(p.name for p in system_tmp.iterdir()) == []
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["attempts"], summary["restarts"]) == (
        "completed", TOTAL_STEPS, 2, 1)
    assert (summary["root_cause"]["rank"], summary["root_cause"]["attempt"]) == (PS_RANK, 1)
    (restored,) = job.named("restored")
    assert (restored["attempt"], restored["global_step"]) == (2, max(committed(job.events, attempt=1)))
    assert {e["rank"] for e in job.named("worker_started") if e["attempt"] == 2} == {0, 1, 2, 3}
    assert committed(job.events)[-1] == TOTAL_STEPS


@pytest.mark.slow  # two runs; the SIGTERM path is the MWMS supervisor's, covered there by default
def test_sigterm_saves_exits_143_and_a_rerun_resumes_there(tmp_path):
    def stop(proc, events):
        proc.send_signal(signal.SIGTERM)

    run_dir = tmp_path / "run"
    job = run_job_until(RECIPE, run_dir, *FLAGS, when=after_commit(40), action=stop)

    assert job.returncode == 143, job.output
    saved = committed(job.events)[-1]
    assert (job.summary["status"], job.summary["global_step"]) == ("preempted", saved)
    assert [e["global_step"] for e in job.named("preempted")] == [saved]
    rerun = run_job(RECIPE, run_dir, *FLAGS)
    assert rerun.returncode == 0, rerun.output
    (restored,) = rerun.named("restored")
    assert (restored["attempt"], restored["global_step"]) == (2, saved)
    assert rerun.summary["global_step"] == TOTAL_STEPS


@pytest.mark.slow  # 90-130 s on 2 busy cores (two attempts of 4 processes plus the 10 s timeout)
def test_a_hung_coordinator_is_named_by_the_watchdog_and_the_run_restores_the_last_commit(tmp_path):
    """The coordinator's main thread blocks forever after scheduling step 30 (an RT_FAULTS
    HANG): it is alive, the servers idle. The watchdog watches the coordinator only, names
    it after --hang-timeout 10 s, and the gang restart resumes from the commit at 20."""
    hang = {"point": "after_step", "global_step": 30, "rank": 0, "attempt": 1, "signal": "HANG"}
    flags = ("--strategy", "parameter-server", "--workers", "2", "--ps", "1", "--epochs", "1",
             "--steps-per-epoch", "40", "--save-every-steps", "10", "--hang-timeout", "10")
    job = run_job(RECIPE, tmp_path / "run", *flags, faults=[hang])

    assert job.returncode == 0, job.output
    [detected] = job.named("hang_detected")
    assert (detected["attempt"], detected["rank"], detected["global_step"], detected["steps"]) == (1, 0, 30, {"0": 30})
    (gang,) = job.named("gang_restart")
    assert (gang["attempt"], gang["root_cause_rank"]) == (2, 0)
    (restored,) = job.named("restored")
    assert (restored["attempt"], restored["global_step"]) == (2, 20)  # it hung after scheduling 30, before saving it
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", 40, 1)
    assert (summary["root_cause"]["type"], summary["root_cause"]["rank"]) == ("Hang", 0)
