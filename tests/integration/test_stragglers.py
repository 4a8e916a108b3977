"""A slow worker, for real (RT_FAULTS ``slow``, runner/health/injection.py): rank 1's host loop
sleeps twice each call's time, so the group trains about 3 times slower; the straggler detector
(runner/health/stragglers.py), fed by every rank's host time in the step's packed all-reduce
(runner/training/control_row.py), names rank 1 exactly, once, with its host and its cost; the
console says it, summary.json lists it, and training goes on (warn) to the end."""

from __future__ import annotations

from tests.integration.conftest import DIGITS
from tests.integration.harness import run_job


def test_a_worker_three_times_slower_is_named_as_the_straggler_and_the_run_goes_on(tmp_path):
    # One save (the epoch end), so no save's shared standstill dilutes the window's buckets; 360
    # steps, so the window (3 buckets of 1 s) fits with calls to spare after start-up (at 240 steps,
    # when the replicas' check still traced a variant of its own at step 100, not counted, a quiet
    # machine at 65 steps/s named it in the last call: steps_left 0).
    job = run_job(DIGITS, tmp_path / "run", "--epochs", "1", "--steps-per-epoch", "360", "--global-batch-size", "32",
                  "--save-every-steps", "360", "--straggler-window", "3", standby=False,
                  faults=[{"point": "slow", "global_step": 0, "rank": 1, "factor": 3}])
    assert job.returncode == 0, job.output
    [named] = job.named("straggler_detected")
    assert (named["rank"], named["host"], named["attempt"], named["action"], named["window_s"], named["evidence"]) == (
        1, "127.0.0.1", 1, "warn", 3.0, "host_time")  # its host loop sleeps: no stall (runner/health/stall_probe.py)
    assert named["slower"] > 1.5  # past the default threshold (0.5); about 3 (the factor) on a quiet machine
    assert named["busy_ms_per_step"] > named["others_ms_per_step"] > 0
    assert named["steps_per_s_without"] > named["steps_per_s"] > 0
    assert named["steps_left"] == 360 - named["global_step"] and named["time_lost_s"] > 0
    assert f"rank 1 (127.0.0.1) is a straggler: busy {named['slower']}x as long per step" in job.output
    assert [(s["rank"], s["attempt"], s["global_step"]) for s in job.summary["stragglers"]] == [
        (1, 1, named["global_step"])]
    assert (job.summary["status"], job.summary["global_step"], job.summary["restarts"]) == ("completed", 360, 0)
