"""Gang restart, graceful preemption, budgets, crash loops, root cause, orphans."""

import os
import signal

import pytest

from resilient_train.errors import EXIT_FAILURE, EXIT_FATAL, EXIT_PREEMPTED
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until, survivors, worker_pids

LINEAR = "recipes/linear_regression.py"
SLOW_DIGITS = "tests/recipes/slow_digits.py"  # digits_cnn, same weights, 0.15 s per step


def after_first_commit(events):
    return any(e["event"] == "checkpoint_committed" for e in events)


def test_sigterm_to_a_worker_preempts_with_zero_lost_steps(tmp_path, digits_reference):
    job = run_job_until(
        SLOW_DIGITS, tmp_path / "run", *DIGITS_FLAGS,
        when=after_first_commit,
        action=lambda proc, events: os.kill(worker_pids(events)[1], signal.SIGTERM),
    )
    assert job.returncode == 0, job.output
    preempted = job.named("preempted")
    restored = job.named("restored")
    assert len(preempted) == 1 and len(restored) == 1
    assert restored[0]["global_step"] == preempted[0]["global_step"]
    committed = [e["global_step"] for e in job.named("checkpoint_committed") if e["attempt"] == 1]
    assert committed[-1] == preempted[0]["global_step"]  # the agreed step was saved
    summary = job.summary
    assert (summary["lost_steps"], summary["preemptions"], summary["restarts"]) == (0, 1, 0)
    assert summary["weights_sha256"] == digits_reference
    exits = {e["rank"]: e.get("exit_code") for e in job.named("worker_exited") if e["attempt"] == 1}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}


def test_sigterm_to_the_supervisor_exits_retryable_and_rerun_loses_nothing(tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    job = run_job_until(
        SLOW_DIGITS, run_dir, *DIGITS_FLAGS,
        when=after_first_commit,
        action=lambda proc, events: proc.send_signal(signal.SIGTERM),
    )
    assert job.returncode == EXIT_PREEMPTED, job.output
    assert job.summary["status"] == "preempted"
    preempted = job.named("preempted")
    assert len(preempted) == 1
    assert job.named("preemption_requested")[0]["source"] == "supervisor:SIGTERM"

    rerun = run_job(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, "--set", "step_delay_s=0")
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [preempted[0]["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == digits_reference


@pytest.mark.slow  # SIGTERM to the supervisor: the same agreed save
def test_ctrl_c_to_the_whole_process_group_saves_and_exits_143(tmp_path, digits_reference):
    """A terminal's Ctrl-C reaches supervisor and workers alike: still one agreed save."""
    run_dir = tmp_path / "run"
    job = run_job_until(
        SLOW_DIGITS, run_dir, *DIGITS_FLAGS,
        when=after_first_commit,
        action=lambda proc, events: os.killpg(proc.pid, signal.SIGINT),
        new_session=True,
    )
    assert job.returncode == EXIT_PREEMPTED, job.output
    preempted = job.named("preempted")
    assert len(preempted) == 1
    exits = {e["rank"]: e.get("exit_code") for e in job.named("worker_exited")}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    rerun = run_job(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, "--set", "step_delay_s=0")
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [preempted[0]["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == digits_reference


def test_recipe_bug_at_a_fixed_step_is_a_crash_loop(tmp_path):
    job = run_job(LINEAR, tmp_path / "run", "--set", "fail_at_step=3", "--max-restarts", "5")
    assert job.returncode == EXIT_FAILURE, job.output
    loops = job.named("crash_loop_detected")
    assert len(loops) == 1 and loops[0]["attempt"] == 2
    assert job.summary["attempts"] == 2 and job.summary["restarts"] == 1
    assert "recipe bug: fail_at_step reached" in job.output
    assert job.summary["root_cause"]["global_step"] == 3
    assert job.named("restart_budget_exhausted") == []


def test_recipe_that_cannot_build_is_fatal_without_restart(tmp_path):
    job = run_job("recipes/mnist_cnn.py", tmp_path / "run", "--set", f"mnist_path={tmp_path}/absent.npz", "--max-restarts", "3")
    assert job.returncode == EXIT_FATAL, job.output
    assert "MNIST not found; looked at" in job.output and "absent.npz" in job.output
    assert job.named("gang_restart") == []
    assert job.summary["attempts"] == 1
    assert len(job.named("fatal_error")) == 1


def test_restart_budget_is_enforced(tmp_path):
    faults = [
        {"point": "after_step", "global_step": 4, "rank": 0, "attempt": 1},
        {"point": "after_step", "global_step": 8, "rank": 1, "attempt": 2},
    ]
    job = run_job(LINEAR, tmp_path / "run", "--max-restarts", "1", faults=faults)
    assert job.returncode == EXIT_FAILURE, job.output
    assert len(job.named("restart_budget_exhausted")) == 1
    assert [g["attempt"] for g in job.named("gang_restart")] == [2]
    assert (job.summary["attempts"], job.summary["restarts"]) == (2, 1)


def test_no_worker_outlives_a_sigkilled_supervisor(tmp_path):
    pids = {}

    def kill_supervisor(proc, events):
        pids.update(worker_pids(events))
        proc.send_signal(signal.SIGKILL)

    job = run_job_until(
        LINEAR, tmp_path / "run", "--epochs", "50",
        when=lambda events: any(e["event"] == "train_progress" for e in events),
        action=kill_supervisor,
    )
    assert job.returncode == -signal.SIGKILL
    assert sorted(pids) == [0, 1]
    assert survivors(pids.values(), within_s=10) == []


def test_checkpoint_of_another_model_is_a_fatal_named_mismatch(tmp_path):
    storage = tmp_path / "shared-checkpoints"
    first = run_job(LINEAR, tmp_path / "a", "--storage", str(storage), "--epochs", "1")
    assert first.returncode == 0, first.output
    # Another run dir is another run: it may use this storage only when told to.
    other = run_job(DIGITS, tmp_path / "b", "--storage", str(storage), "--force-storage", *DIGITS_FLAGS)
    assert other.returncode == EXIT_FATAL, other.output
    assert "does not fit recipe digits_cnn's model" in other.output
    assert "variable.shape=(3, 3, 1, 16), Received: value.shape=(2, 1)" in other.output
    assert "path=sequential/conv2d/kernel" in other.output  # names the variable
    assert other.named("gang_restart") == []
    # nothing committed was lost
    assert sorted(p.name for p in storage.glob("ckpt-*")) == ["ckpt-000000000005", "ckpt-000000000010"]
