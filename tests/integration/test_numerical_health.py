"""A NaN loss at a fixed step (RT_FAULTS ``nan_loss``, runner/health/injection.py) with real
workers: detected at that step, nothing non-finite ever committed (every committed checkpoint's
tensors are read). ``--on-anomaly stop``: the run stops with one line naming the step, the batch
and the values, and a re-run resumes from the newest (healthy) commit and ends exact.
``rollback`` (the default): a NaN of attempt 1 only is judged transient by the replay and the run
ends exact; a NaN at the same step in every attempt is judged deterministic and the run stops."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import EXIT_FATAL
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job

NO_TIER = ("--snapshot-every", "off")


def committed_tensors_are_finite(storage) -> list[int]:
    """The global steps of every committed checkpoint, after checking each one's tensors."""
    steps = []
    for manifest in sorted(storage.glob("ckpt-*/MANIFEST.json")):
        reader = tf.train.load_checkpoint(str(manifest.parent / "ckpt"))
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype.is_floating:
                assert np.isfinite(reader.get_tensor(name)).all(), f"{manifest.parent.name}: {name} is not finite"
        steps.append(int(manifest.parent.name.split("-")[1]))
    return steps


def stopped_at_step_6(run_dir):
    """The job with a NaN loss at global step 6 on rank 1 (its other worker's loss is finite:
    the agreed column still stops both), checked; a save every 4 steps commits step 4 first."""
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER, "--on-anomaly", "stop",
                  faults=[{"point": "nan_loss", "global_step": 6, "rank": 1}])
    assert job.returncode == EXIT_FATAL, job.output
    detected = job.named("anomaly_detected")
    assert [(e["global_step"], e["epoch"], e["step_in_epoch"], e["replicas"], e["action"], e["values"]["loss"])
            for e in detected] == [(6, 0, 5, 1, "stop", "nan")]
    assert "non-finite loss or gradients at global step 6 (epoch 0, batch 5 of the epoch)" in job.output
    assert "Traceback" not in job.output  # one line, no traceback
    assert [e["global_step"] for e in job.named("checkpoint_committed")] == [4]  # the save before it, waited for
    assert committed_tensors_are_finite(run_dir / "checkpoints") == [4]
    assert job.summary["status"] == "failed"
    return job


def test_a_nan_at_step_6_stops_the_run_there_and_commits_nothing_unhealthy(tmp_path):
    stopped_at_step_6(tmp_path / "run")


@pytest.mark.slow  # the stop above, then a re-run (~2 x 40 s)
def test_after_a_stop_a_rerun_without_the_poisoned_batch_resumes_from_the_healthy_commit_and_is_exact(
        tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    detected = stopped_at_step_6(run_dir).named("anomaly_detected")
    rerun = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER)
    assert rerun.returncode == 0, rerun.output
    assert [e["global_step"] for e in rerun.named("restored")] == [4]  # (events.jsonl holds both runs)
    assert rerun.named("anomaly_detected") == detected  # the first run's only
    assert rerun.summary["weights_sha256"] == digits_reference


@pytest.mark.parametrize("tier", [NO_TIER, pytest.param((), marks=pytest.mark.slow)], ids=["no-tier", "tier-default"])
def test_a_nan_once_is_rolled_back_judged_transient_and_the_run_ends_exact(tmp_path, digits_reference, tier):
    # With the memory tier as users get it, the workers' exit must not have a survivor commit
    # a snapshot of the anomalous step: the rollback restores the same healthy commit.
    run_dir = tmp_path / "run"
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *tier, tier_default=not tier,
                  faults=[{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": 1}])
    assert job.returncode == 0, job.output
    assert [(e["global_step"], e["action"], e["attempt"]) for e in job.named("anomaly_detected")] == [
        (6, "rollback", 1)]
    rolled_back = [(e["global_step"], e["anomaly_step"], e["attempt"]) for e in job.named("rolled_back")]
    # (with the tier, a survivor may rescue-commit its healthy snapshot of step 5 as the workers leave)
    assert rolled_back in ([[(4, 6, 2)]] if tier else [[(4, 6, 2)], [(5, 6, 2)]])
    assert [(e["global_step"], e["verdict"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (6, "transient", 2)]
    committed = committed_tensors_are_finite(run_dir / "checkpoints")
    assert committed[-1] == 20
    assert job.summary["weights_sha256"] == digits_reference
    assert job.summary["restarts"] == 1


POISONED_TWICE = [{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": attempt} for attempt in (1, 2)]


def skipped_at_step_6(run_dir, *, faults=(), **settings):
    """A NaN at step 6 in attempts 1 and 2 (a poisoned batch, as the replay sees it): rolled
    back, judged deterministic, rolled back again, and attempt 3 replays without that batch."""
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER, faults=[*POISONED_TWICE, *faults], **settings)
    assert job.returncode == 0, job.output
    assert [(e["global_step"], e["verdict"], e["action"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (6, "deterministic", "skip", 2)]
    assert "that batch is skipped: rolling back to replay without it" in job.output
    return job


def test_a_nan_back_at_the_same_step_is_deterministic_and_its_batch_is_skipped_in_the_next_replay(tmp_path):
    run_dir = tmp_path / "run"
    job = skipped_at_step_6(run_dir)
    assert [(e["global_step"], e["epoch"], e["step_in_epoch"], e["attempt"]) for e in job.named("batch_skipped")] == [
        (6, 0, 5, 3)]
    assert "skipped the batch of global step 6 (epoch 0, batch 5 of the epoch)" in job.output
    assert [(e["global_step"], e["attempt"]) for e in job.named("restored")] == [(4, 2), (4, 3)]
    assert committed_tensors_are_finite(run_dir / "checkpoints") == [12, 16, 20]  # (retention keeps 3)
    manifest = json.loads((run_dir / "checkpoints" / "ckpt-000000000020" / "MANIFEST.json").read_text())
    assert manifest["extra"]["skipped_steps"] == [6]  # a resume from any later commit skips it too
    epoch_0 = [e for e in job.named("epoch_finished") if e["epoch"] == 0]
    assert len(epoch_0) == 1 and np.isfinite(epoch_0[0]["loss"])  # the epoch's mean without the skipped batch
    assert [(a["global_step"], a["verdict"], a["skipped"]) for a in job.summary["anomalies"]] == [
        (6, "deterministic", True)]
    assert (job.summary["restarts"], job.summary["global_step"]) == (2, 20)


@pytest.mark.slow  # two more runs (~2 x 50 s); the skip itself: the test above
def test_a_run_that_skipped_a_batch_is_exact_across_a_kill_during_the_replay_and_a_rerun(tmp_path):
    first = skipped_at_step_6(tmp_path / "first").summary["weights_sha256"]
    killed = skipped_at_step_6(tmp_path / "killed", faults=[
        {"point": "after_step", "global_step": 9, "rank": 0, "attempt": 3, "signal": "SIGKILL"}])
    assert [(e["global_step"], e["attempt"]) for e in killed.named("batch_skipped")] == [(6, 3), (6, 4)]
    assert killed.summary["weights_sha256"] == first


@pytest.mark.slow  # ~40-70 s; --loss-spike is off by default: its logic and the window a checkpoint carries are
# tests/runner/health/test_spikes.py's, the rollback and skip path the NaN tests' above
def test_a_loss_spike_back_in_the_replay_is_found_with_the_window_the_commit_carried_and_skipped(tmp_path):
    # --loss-spike 10 (runner/health/spikes.py): its 100-step window is full from step 100 on; a
    # batch whose loss is 100x (RT_FAULTS loss_spike) at step 110 in attempts 1 and 2. The replay
    # from the commit of step 100 finds it again only because that commit carries the window
    # (a fresh window would still be warming up and call it transient).
    run_dir = tmp_path / "run"
    job = run_job(DIGITS, run_dir, "--epochs", "2", "--steps-per-epoch", "60", "--global-batch-size", "32",
                  "--save-every-steps", "20", *NO_TIER, "--loss-spike", "10",
                  faults=[{"point": "loss_spike", "global_step": 110, "rank": 1, "attempt": attempt}
                          for attempt in (1, 2)])
    assert job.returncode == 0, job.output
    detected = job.named("anomaly_detected")
    assert [(e["kind"], e["global_step"], e["epoch"], e["step_in_epoch"], e["attempt"]) for e in detected] == [
        ("spike", 110, 1, 49, 1)]  # nothing in the 109 healthy steps before it
    assert detected[0]["values"]["loss"] > detected[0]["threshold"] > detected[0]["median"] > 0
    assert [(e["global_step"], e["anomaly_step"], e["attempt"]) for e in job.named("rolled_back")] == [(100, 110, 2)]
    assert [(e["global_step"], e["verdict"], e["action"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (110, "deterministic", "skip", 2)]
    assert [(e["global_step"], e["attempt"]) for e in job.named("batch_skipped")] == [(110, 3)]
    manifest = json.loads((run_dir / "checkpoints" / "ckpt-000000000120" / "MANIFEST.json").read_text())
    assert (manifest["extra"]["skipped_steps"], len(manifest["extra"]["loss_window"])) == ([110], 100)


@pytest.mark.slow  # ~40 s; --deterministic-anomaly stop's one line: stopped_at_step_6 (--on-anomaly stop) and
# tests/runner/health/test_health.py cover the same path
def test_a_nan_at_the_same_step_in_every_attempt_is_judged_deterministic_and_stops(tmp_path):
    run_dir = tmp_path / "run"
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER, "--deterministic-anomaly", "stop",
                  faults=POISONED_TWICE)
    assert job.returncode == EXIT_FATAL, job.output
    assert [(e["global_step"], e["verdict"], e["action"], e["values"]["loss"], e["values_before"]["loss"])
            for e in job.named("replay_verdict")] == [(6, "deterministic", "stop", "nan", "nan")]
    assert "came back when replayed from the newest commit (deterministic" in job.output
    assert committed_tensors_are_finite(run_dir / "checkpoints") == [4]


def test_a_flipped_bit_in_the_chiefs_weights_is_found_at_the_next_check_rolled_back_and_the_run_ends_exact(
        tmp_path, digits_reference):
    # Silent data corruption (runner/health/replicas.py): after the save of step 8 the chief's
    # copy of one weight doubles or halves (RT_FAULTS bitflip), every value still finite. The
    # check riding the call that ends at the next save (10, the epoch end) finds the replicas
    # differ, before that save; the newest commit (8) is healthy; the replay is clean (transient).
    # Were it missed, the chief would commit the flipped weights and the digest would differ.
    run_dir = tmp_path / "run"
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER,
                  faults=[{"point": "bitflip", "global_step": 8, "rank": 0, "attempt": 1}])
    assert job.returncode == 0, job.output
    assert [(e["kind"], e["global_step"], e["epoch"], e["step_in_epoch"], e["replicas"], e["ranks"], e["action"],
             e["attempt"]) for e in job.named("anomaly_detected")] == [
        ("replicas", 10, 0, 9, 2, [0, 1], "rollback", 1)]  # two replicas: neither is a majority, both named
    assert "the replicas' trainable weights differ at global step 10 (epoch 0, batch 9 of the epoch)" in job.output
    assert [(e["global_step"], e["anomaly_step"], e["attempt"]) for e in job.named("rolled_back")] == [(8, 10, 2)]
    assert [(e["global_step"], e["verdict"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (10, "transient", 2)]
    assert [(e["global_step"], e["attempt"]) for e in job.named("checkpoint_committed")] == [
        (4, 1), (8, 1), (10, 2), (12, 2), (16, 2), (20, 2)]  # nothing of attempt 1 after the flip
    assert job.summary["anomalies"][0]["ranks"] == [0, 1]
    assert job.summary["weights_sha256"] == digits_reference
    assert job.summary["restarts"] == 1


def test_a_host_with_repeated_transient_anomalies_is_suspected_saved_and_stopped_and_the_rerun_ends_exact(
        tmp_path, digits_reference):
    # Two flips on the chief, in attempts 1 and 2, each found by the replicas' check and each
    # judged transient by its replay: with --max-transients-per-host 2, the second verdict makes
    # the only host (127.0.0.1) a suspect. The chief writes the suspect-hardware notice markers
    # and votes to stop: the group saves at an agreed step and exits 143, and the supervisor stops
    # the local run (runner/health/anomaly_policy.py, HostSuspicion). A re-run elsewhere (here: the
    # same host, without the faults) resumes from that save and ends exact.
    run_dir = tmp_path / "run"
    flips = [{"point": "bitflip", "global_step": 4, "rank": 0, "attempt": 1},
             {"point": "bitflip", "global_step": 8, "rank": 0, "attempt": 2}]
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER, "--max-transients-per-host", "2", faults=flips)
    assert job.returncode == 143, job.output
    assert [(e["kind"], e["global_step"], e["attempt"]) for e in job.named("anomaly_detected")] == [
        ("replicas", 8, 1), ("replicas", 10, 2)]  # the saves of 8 and 10 checked first: neither committed
    assert [(e["global_step"], e["verdict"], e["hosts"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (8, "transient", ["127.0.0.1"], 2), (10, "transient", ["127.0.0.1"], 3)]
    assert [(e["host"], e["ranks"], e["transients"], e["limit"], e["attempt"])
            for e in job.named("host_suspected")] == [("127.0.0.1", [0, 1], 2, 2, 3)]
    markers = sorted((run_dir / "attempt-3").glob("notice-*.json"))
    assert [(p.name, json.loads(p.read_text())) for p in markers] == [
        (f"notice-{rank}.json", {"provider": "suspect-hardware", "kind": "transient-anomalies", "host": "127.0.0.1"})
        for rank in (0, 1)]
    assert "host 127.0.0.1 had 2 transient anomalies" in job.output
    assert "this host is suspected of faulty hardware" in job.output
    [saved] = job.named("preempted")
    assert job.summary["status"] == "preempted" and job.summary["global_step"] == saved["global_step"] > 10

    rerun = run_job(DIGITS, run_dir, *DIGITS_FLAGS, *NO_TIER)
    assert rerun.returncode == 0, rerun.output
    assert [e["global_step"] for e in rerun.named("restored") if e["attempt"] == 4] == [saved["global_step"]]
    assert rerun.summary["weights_sha256"] == digits_reference


POISONED_ALWAYS = [{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": "all"}]  # a poisoned batch
KILL_IN_THE_REPLAY = {"point": "after_step", "global_step": 5, "rank": 0, "attempt": 2, "signal": "SIGKILL"}


@pytest.mark.slow  # ~2 x 60 s; the default suite covers the rollback (test_a_nan_once_is_rolled_back_judged_transient
# _and_the_run_ends_exact) and a kill after the skip (the slow test above); this is a kill inside the replay itself
@pytest.mark.parametrize("poison", ["once", "every-attempt"])
def test_a_kill_during_the_replay_before_the_anomalys_step_replays_again_and_ends_exact_with_the_right_verdict(
        tmp_path, digits_reference, poison):
    # Attempt 2 restores step 4 and replays towards the NaN of step 6; kill -9 of the chief after
    # step 5 (one step per call: the kill lands after the restore, before the anomaly's step). No
    # verdict was written, so attempt 3 restores 4 and replays again (a second rolled_back) and
    # judges: a NaN of attempt 1 only is transient and the run ends with the uninterrupted digest;
    # a poisoned batch (every attempt) is deterministic, attempt 4 skips it, and the run ends with
    # the digest of the same job never killed.
    faults = ([{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": 1}] if poison == "once"
              else POISONED_ALWAYS)
    flags = (*DIGITS_FLAGS, *NO_TIER, "--steps-per-execution", "1")
    job = run_job(DIGITS, tmp_path / "killed", *flags, faults=[*faults, KILL_IN_THE_REPLAY])
    assert job.returncode == 0, job.output
    assert [(e["global_step"], e["action"], e["attempt"]) for e in job.named("anomaly_detected")] == [
        (6, "rollback", 1)]
    [killed] = [e for e in job.named("worker_exited") if e["attempt"] == 2 and e["rank"] == 0]
    assert killed["signal"] == "SIGKILL"
    assert [(e["global_step"], e["anomaly_step"], e["attempt"]) for e in job.named("rolled_back")] == [
        (4, 6, 2), (4, 6, 3)]  # the replay began twice; the kill fell inside the first
    committed = committed_tensors_are_finite(tmp_path / "killed" / "checkpoints")
    assert committed[-1] == 20
    if poison == "once":
        assert [(e["global_step"], e["verdict"], e["attempt"]) for e in job.named("replay_verdict")] == [
            (6, "transient", 3)]
        assert job.summary["weights_sha256"] == digits_reference
        assert job.summary["restarts"] == 2
        return
    assert [(e["global_step"], e["verdict"], e["action"], e["attempt"]) for e in job.named("replay_verdict")] == [
        (6, "deterministic", "skip", 3)]
    assert [(e["global_step"], e["attempt"]) for e in job.named("batch_skipped")] == [(6, 4)]
    never_killed = run_job(DIGITS, tmp_path / "never-killed", *flags, faults=POISONED_ALWAYS)
    assert never_killed.returncode == 0, never_killed.output
    assert [(e["verdict"], e["attempt"]) for e in never_killed.named("replay_verdict")] == [("deterministic", 2)]
    assert job.summary["weights_sha256"] == never_killed.summary["weights_sha256"] != digits_reference
