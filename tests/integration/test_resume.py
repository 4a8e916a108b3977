"""A killed run, re-run, resumes from the last committed step with exact weights.

These runs are without the memory tier (``NO_TIER``): on by default, it would have a survivor
commit its newer snapshot first (its rescue: tests/integration/test_rescue.py).
"""

import signal

import pytest

from resilient_train.commands.report_page import load_run
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until, worker_pids
from resilient_train.errors import EXIT_FAILURE


NO_TIER = ("--snapshot-every", "off")


def committed_steps(job, attempt):
    return [e["global_step"] for e in job.named("checkpoint_committed") if e["attempt"] == attempt]


def reached(job, attempt):
    return next(e["global_step"] for e in job.named("attempt_reached") if e["attempt"] == attempt)


def test_kill_chief_mid_epoch_then_rerun_resumes_exactly(tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    # SIGKILL the chief right after it committed step 4 (mid-epoch: 10 steps per epoch).
    # With async checkpointing the commit lands in the background, so the training
    # thread may have run a step or two further: those are the lost steps.
    killed = run_job(
        DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER, "--max-restarts", "0",
        faults=[{"point": "after_commit", "global_step": 4, "rank": 0}],
    )
    assert killed.returncode == EXIT_FAILURE, killed.output
    assert "root cause: worker 0" in killed.output and "killed by SIGKILL" in killed.output
    assert committed_steps(killed, 1) == [4]
    failed = killed.named("worker_failed")
    assert [(e["rank"], e.get("signal")) for e in failed][0] == (0, "SIGKILL")
    assert killed.summary["status"] == "failed" and killed.summary["root_cause"]["rank"] == 0

    rerun = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER)
    assert rerun.returncode == 0, rerun.output
    restored = rerun.named("restored")
    assert [(r["global_step"], r["epoch"], r["step_in_epoch"], r["attempt"]) for r in restored] == [(4, 0, 4, 2)]
    assert restored[0]["checkpoint"].endswith("ckpt-000000000004")
    assert rerun.summary["weights_sha256"] == digits_reference
    assert rerun.summary["lost_steps"] == reached(killed, 1) - 4


def test_kill_non_chief_gang_restart_is_exact(tmp_path, digits_reference):
    # The run's system temp dir: autograph writes a file there per traced function, and
    # workers leave by os._exit, so without their own TMPDIR (rundir/scratch.py) the files
    # stayed behind (3,364 after one suite run).
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    # One step per call, so the kill lands right after step 13 (a longer call would end at
    # the save point 16 first, which the chief may commit before it is stopped).
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, *NO_TIER, "--steps-per-execution", "1",
                  faults=[{"point": "after_step", "global_step": 13, "rank": 1}], env={"TMPDIR": str(system_tmp)})
    assert job.returncode == 0, job.output
    assert sorted(p.name for p in system_tmp.iterdir()) == []
    assert sorted(str(p) for p in (tmp_path / "run" / "local").glob("rank-*/tmp")) == []
    assert [g["attempt"] for g in job.named("gang_restart")] == [2]
    assert job.named("gang_restart")[0]["root_cause_rank"] == 1
    newest = committed_steps(job, 1)[-1]
    assert newest in (10, 12)  # 12 unless the kill beat its background commit
    assert [r["global_step"] for r in job.named("restored")] == [newest]
    assert job.summary["weights_sha256"] == digits_reference
    assert (job.summary["restarts"], job.summary["attempts"]) == (1, 2)
    assert job.summary["lost_steps"] == reached(job, 1) - newest
    # One definition of how far the attempt got: the root cause's step (from worker 0's error
    # file: worker 1 was SIGKILLed) is the step lost_steps counts from.
    assert job.summary["root_cause"]["global_step"] == reached(job, 1) == 13
    # Our collectives between calls (restore agreement, iterator-state sizes) run as
    # tf.functions: no eager-strategy advice (it filled the root cause's log tail), and no
    # tf.data warning about an argument without effect.
    logs = "".join(p.read_text() for p in sorted((tmp_path / "run").glob("attempt-*/worker-*.log")))
    assert logs.count("iterator_state_sized") >= 1  # the iterator-state gathers ran
    assert (logs.count("eagerly has significant overhead"), logs.count("`deterministic` argument")) == (0, 0)
    # Where the time went (issue 49; rundir/time_account.py): every second of the wall time in one
    # category; the kill's standstill and the steps it made the group run twice are there.
    account = job.summary["time_account"]
    assert sum(account["seconds"].values()) == pytest.approx(job.summary["wall_time_s"], rel=0.01)
    assert account["wall_s"] == job.summary["wall_time_s"]
    assert account["seconds"]["standstill"] > 0 and account["seconds"]["productive"] > 0
    assert {n: a["ended"] for n, a in account["attempts"].items()} == {"1": "failure", "2": "completed"}
    assert account["replayed_steps"] == account["attempts"]["1"]["replayed_steps"] == job.summary["lost_steps"]
    assert (account["seconds"]["replayed"] > 0) == (job.summary["lost_steps"] > 0)
    # goodput is rounded to 4 places and the seconds to the millisecond: the bound of those roundings
    # (a fixed 1e-4 failed in the suite of 2026-11-29: 0.0994 against 0.09929 for a ~8 s run)
    wall = job.summary["wall_time_s"]
    assert account["goodput"] == pytest.approx(account["seconds"]["productive"] / wall, abs=5e-5 + 1e-3 / wall)
    # the page's account is the same (it also sees run_finished, written after summary.json)
    page = load_run(tmp_path / "run").time_account()
    assert page.seconds["productive"] == pytest.approx(account["seconds"]["productive"], abs=2e-3)
    assert page.goodput == pytest.approx(account["goodput"], abs=1e-4)


@pytest.mark.slow  # the chaos CI scenario seeds-experiment runs the same kill
def test_seeds_scenario_kill_chief_at_step_7_resumes_at_7(tmp_path, digits_reference):
    """The seed notes' experiment: checkpoint every step, kill the chief at step 7."""
    run_dir = tmp_path / "run"
    flags = (*DIGITS_FLAGS[:-1], "1")  # --save-every-steps 1
    flags = (*flags, *NO_TIER)
    killed = run_job(DIGITS, run_dir, *flags, "--max-restarts", "0", faults=[{"point": "after_commit", "global_step": 7, "rank": 0}])
    assert killed.returncode == EXIT_FAILURE, killed.output
    assert committed_steps(killed, 1) == [1, 2, 3, 4, 5, 6, 7]
    rerun = run_job(DIGITS, run_dir, *flags)
    assert rerun.returncode == 0, rerun.output
    assert [(r["global_step"], r["step_in_epoch"]) for r in rerun.named("restored")] == [(7, 7)]
    assert rerun.summary["weights_sha256"] == digits_reference
    assert rerun.summary["lost_steps"] == reached(killed, 1) - 7


@pytest.mark.slow  # sync saves: test_steps_per_execution's mid-call kill
def test_seeds_scenario_in_sync_mode_loses_nothing(tmp_path, digits_reference):
    """Synchronous saves commit before the next step: killed right after the commit of 7,
    the chief has run no step past it."""
    run_dir = tmp_path / "run"
    flags = (*DIGITS_FLAGS[:-1], "1", "--checkpoint-mode", "sync", "--max-restarts", "1")
    job = run_job(DIGITS, run_dir, *flags, faults=[{"point": "after_commit", "global_step": 7, "rank": 0}])
    assert job.returncode == 0, job.output
    assert reached(job, 1) == 7
    assert [r["global_step"] for r in job.named("restored")] == [7]
    assert job.summary["lost_steps"] == 0
    assert job.summary["weights_sha256"] == digits_reference


def test_external_sigkill_of_chief_restores_newest_commit(tmp_path, digits_reference):
    def first_commit(events):
        return any(e["event"] == "checkpoint_committed" for e in events)

    def kill_chief(proc, events):
        import os

        os.kill(worker_pids(events)[0], signal.SIGKILL)

    job = run_job_until("tests/recipes/slow_digits.py", tmp_path / "run", *DIGITS_FLAGS, *NO_TIER, when=first_commit,
                        action=kill_chief)
    assert job.returncode == 0, job.output
    before_kill = committed_steps(job, 1)
    restored = job.named("restored")
    assert len(restored) == 1 and restored[0]["global_step"] == before_kill[-1]
    assert job.summary["weights_sha256"] == digits_reference


def test_rerunning_a_completed_run_trains_nothing(tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    first = run_job(DIGITS, run_dir, *DIGITS_FLAGS)
    assert first.returncode == 0
    again = run_job(DIGITS, run_dir, *DIGITS_FLAGS)
    assert again.returncode == 0, again.output
    assert "already completed at global step 20" in again.output
    assert len(again.named("run_already_complete")) == 1
    assert sorted(p.name for p in run_dir.glob("attempt-*")) == ["attempt-1"]
    assert again.summary["weights_sha256"] == digits_reference
