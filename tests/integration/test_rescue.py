"""The memory tier (--snapshot-every): a worker killed between saves costs the steps since the
last snapshot, not since the last save (runner/state/memory_tier.py, supervisor/rescue.py).

Saves every 50 steps (so only the epoch ends, 10 and 20, commit on their own), a snapshot
every 3 steps, one step per call (so a kill at the end of step 17 lands right after it):
snapshots at 13, 16, 19 in the second epoch. Every run must end with the uninterrupted
run's exact weights.
"""

import json
import math

import pytest

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job
from resilient_train.errors import EXIT_OK

RESCUE_FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "50",
                "--snapshot-every", "3", "--steps-per-execution", "1")


def reached(job, attempt):
    return next(e["global_step"] for e in job.named("attempt_reached") if e["attempt"] == attempt)


def manifest(job, step):
    return json.loads((job.run_dir / "checkpoints" / f"ckpt-{step:012d}" / "MANIFEST.json").read_text())


@pytest.mark.parametrize("killed, rescuer", [(1, 0), (0, 1)], ids=["rank-1-killed", "chief-killed"])
def test_a_worker_killed_between_saves_is_rescued_by_the_lowest_survivor(tmp_path, digits_reference, killed, rescuer):
    job = run_job(DIGITS, tmp_path / "run", *RESCUE_FLAGS,
                  faults=[{"point": "after_step", "global_step": 17, "rank": killed}])
    assert job.returncode == EXIT_OK, job.output
    tiers = job.named("memory_tier")
    assert sorted((e["attempt"], e["rank"], e["every_steps"]) for e in tiers) == [
        (1, 0, 3), (1, 1, 3), (2, 0, 3), (2, 1, 3)]
    assert len({e["twin_bytes"] for e in tiers}) == 1 and tiers[0]["twin_bytes"] > 0
    requested = job.named("rescue_requested")
    assert [(e["rank"], e["dead_ranks"], e["attempt"]) for e in requested] == [(rescuer, [killed], 1)]
    committed = job.named("rescue_committed")
    assert [(e["global_step"], e["rank"], e["attempt"]) for e in committed] == [(16, rescuer, 1)]
    assert committed[0]["snapshot_age_s"] >= 0 and committed[0]["seconds"] >= 0
    assert job.named("rescue_skipped") == [] and job.named("rescue_abandoned") == []
    # An ordinary commit (manifest last, the live attempt's generation), marked as a rescue.
    rescued = manifest(job, 16)
    assert rescued["extra"]["rescue"]["rank"] == rescuer
    assert rescued["extra"]["generation"] == 1
    assert [(e["global_step"], e["rank"]) for e in job.named("checkpoint_committed") if e["attempt"] == 1] == [
        (10, 0), (16, rescuer)]
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(16, 2)]
    assert reached(job, 1) == 17
    assert job.summary["lost_steps"] == 1  # not 7: the last save was step 10
    assert job.summary["weights_sha256"] == digits_reference
    assert (job.summary["restarts"], job.summary["attempts"]) == (1, 2)


@pytest.mark.parametrize("step, reason, restored", [
    (2, "no snapshot yet", []),
    # RT_SLOW: the reason is tested in tests/runner/state/test_memory_tier.py, and the fall-back to the
    # last commit end to end by the case above
    pytest.param(11, "snapshot of step 10 is not newer than the last commit (step 10)", [10], marks=pytest.mark.slow),
], ids=["before-the-first-snapshot", "right-after-a-save"])
def test_nothing_to_rescue_restores_the_last_commit_as_before(tmp_path, digits_reference, step, reason, restored):
    job = run_job(DIGITS, tmp_path / "run", *RESCUE_FLAGS,
                  faults=[{"point": "after_step", "global_step": step, "rank": 1}])
    assert job.returncode == EXIT_OK, job.output
    assert [(e["rank"], e["dead_ranks"]) for e in job.named("rescue_requested")] == [(0, [1])]
    assert [(e["rank"], e["reason"], e["attempt"]) for e in job.named("rescue_skipped")] == [(0, reason, 1)]
    assert job.named("rescue_committed") == []
    assert [r["global_step"] for r in job.named("restored")] == restored
    assert [e["attempt"] for e in job.named("fresh_start")] == ([1, 2] if not restored else [1])
    assert job.summary["lost_steps"] == step - (restored[0] if restored else 0)
    assert job.summary["weights_sha256"] == digits_reference


def test_auto_is_the_default_and_leaves_the_training_math_unchanged(tmp_path, digits_reference_run):
    # The uninterrupted reference run (no --snapshot-every): auto. Every worker adopts the
    # chief's proposal at the same call; the chief says what it measured.
    tiers = digits_reference_run.named("memory_tier")
    assert sorted(e["rank"] for e in tiers) == [0, 1]
    assert {e["setting"] for e in tiers} == {"auto"}
    [every] = {e["every_steps"] for e in tiers}
    [chief] = [e for e in tiers if e["rank"] == 0]
    assert (chief["budget"], chief["capture_budget"]) == (0.02, 0.02) and chief["snapshot_ms"] > chief["capture_ms"] > 0 and chief["step_ms"] > 0
    # digits_cnn re-enters by its iterator state: its captures have a budget of their own (2%),
    # the rest 3/4 of the snapshots' (the event's figures are rounded to the microsecond: either side of a ceil)
    rest_ms, capture_ms = chief["snapshot_ms"] - chief["capture_ms"], chief["capture_ms"]
    call = chief["call_steps"]  # (whole calls: a snapshot never cuts one in two)
    assert every in {call * math.ceil(math.ceil(rest_ms / (0.015 * chief["step_ms"]) + d) / call) for d in (-0.01, 0.01)}
    [capture_every] = {e["capture_every_steps"] for e in tiers}
    assert capture_every % every == 0
    assert capture_every in {every * max(1, math.ceil(math.ceil(capture_ms / (0.02 * chief["step_ms"]) + d) / every))
                             for d in (-0.01, 0.01)}
    assert json.loads((digits_reference_run.run_dir / "attempt-1" / "job.json").read_text())["snapshot_every"] == "auto"
    # Snapshots and the calls they end never change what is trained: the same weights as without the tier.
    off = run_job(DIGITS, tmp_path / "off", *DIGITS_FLAGS, "--snapshot-every", "off")
    assert off.returncode == EXIT_OK, off.output
    assert off.named("memory_tier") == []
    assert off.summary["weights_sha256"] == digits_reference_run.summary["weights_sha256"]


def test_a_hang_between_snapshots_is_rescued_by_a_peer_of_the_stuck_rank(tmp_path, digits_reference):
    # Rank 1's training thread stops after step 17 (alive, heartbeats on); rank 0 waits in
    # step 18's collective. The watchdog names rank 1; rank 0 commits its snapshot of 16.
    job = run_job(DIGITS, tmp_path / "run", *RESCUE_FLAGS, "--hang-timeout", "5",
                  faults=[{"point": "after_step", "global_step": 17, "rank": 1, "signal": "HANG"}])
    assert job.returncode == EXIT_OK, job.output
    [hang] = job.named("hang_detected")
    assert (hang["rank"], hang["attempt"]) == (1, 1)
    requested = job.named("rescue_requested")
    assert [(e["rank"], e["stuck_rank"], e["dead_ranks"], e["attempt"]) for e in requested] == [(0, 1, [], 1)]
    committed = job.named("rescue_committed")
    assert [(e["global_step"], e["rank"], e["attempt"]) for e in committed] == [(16, 0, 1)]
    assert job.named("rescue_skipped") == [] and job.named("rescue_abandoned") == []
    assert manifest(job, 16)["extra"]["rescue"]["rank"] == 0
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(16, 2)]
    assert job.summary["lost_steps"] == 1  # at most the interval (--snapshot-every 3), not 7
    assert job.summary["weights_sha256"] == digits_reference
    assert (job.summary["restarts"], job.summary["attempts"]) == (1, 2)
