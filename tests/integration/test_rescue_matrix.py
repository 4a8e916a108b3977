"""The memory tier's exactness matrix (issue 32 item 5): every rescued run ends with the
uninterrupted run's exact weights, and loses at most the snapshot interval.

Default suite: the chief killed with several steps per call (digits_cnn: a seeded Dropout),
the chief of a Keras-callbacks recipe killed (rank 1 commits the chief-only callbacks' state
from the newest commit: runner/state/saving.py _commit_rescue), and a torn rescue (the rescuer
SIGKILLed between its first uploaded file and the manifest: never restored), and the
supervisor SIGKILLed during a rescue, and BatchNormalization (whose moving statistics differ
between workers) with the chief killed: rank 1's rescue is skipped, the last commit restored.
RT_SLOW=1 adds rank 1 killed the same ways (for BatchNormalization: the chief rescues), the
indexed recipe and an unchanged model.fit script.

Saves every 50 steps, so only the epoch ends (every 10 steps) commit on their own.
"""

import json
import signal

import pytest

from tests.integration.conftest import DIGITS
from tests.integration.harness import (REPO, read_events, recipe_variant, run_job, run_job_until, stopped, survivors,
                                       worker_pids)
from tests.integration.test_keras import EPOCHS, KERAS, assert_ends_as
from tests.integration.test_rescue import manifest, reached
from resilient_train.errors import EXIT_OK
from resilient_train.runner.state.worker_agreement import divergence_reason

# The slow variants (RT_SLOW=1): the same rescue path as the default tests', on other models and inputs.
SLOW = pytest.mark.slow
SHORT = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32")
# Calls of 3 steps, also ending at every snapshot (4 steps after the last one or the last
# save): epoch 1 runs 10-13, 13-14 (snapshot 14), 14-17, 17-18 (snapshot 18), 18-20. A fault
# at step 16 fires at the end of the call that finished it: the group reached 17.
MULTI_STEP = ("--save-every-steps", "50", "--snapshot-every", "4", "--steps-per-execution", "3")
# What differs between the workers of digits_cnn with a BatchNormalization layer (its
# moving statistics, updated from each worker's own batches).
BN_STATS = ["sequential/batch_normalization/moving_mean", "sequential/batch_normalization/moving_variance"]
# One step per call, a snapshot every 3 steps: snapshots 13, 16, 19 in epoch 1.
ONE_STEP = ("--save-every-steps", "50", "--snapshot-every", "3", "--steps-per-execution", "1")


def assert_rescued(job, *, killed, rescuer, reached_step, rescued, interval, digest):
    """One rescue by ``rescuer`` of step ``rescued``, restored, at most ``interval`` steps lost."""
    assert job.returncode == EXIT_OK, job.output
    assert [(e["rank"], e["dead_ranks"]) for e in job.named("rescue_requested")] == [(rescuer, [killed])]
    assert [(e["global_step"], e["rank"], e["attempt"]) for e in job.named("rescue_committed")] == [(rescued, rescuer, 1)]
    assert job.named("rescue_skipped") == [] and job.named("rescue_abandoned") == []
    committed = job.run_dir / "checkpoints" / f"ckpt-{rescued:012d}"
    if committed.is_dir():  # (a longer run may have pruned it: --keep)
        assert manifest(job, rescued)["extra"]["rescue"]["rank"] == rescuer
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(rescued, 2)]
    assert reached(job, 1) == reached_step
    assert job.summary["lost_steps"] == reached_step - rescued <= interval
    assert job.summary["weights_sha256"] == digest


@pytest.mark.slow  # callbacks resumed exactly after a kill: tests/integration/test_keras.py; a chief's rescue: test_several_steps_per_call_with_dropout
@pytest.mark.parametrize("killed, rescuer", [
    pytest.param(0, 1, id="chief-killed"),
    pytest.param(1, 0, id="rank-1-killed", marks=SLOW),
])
def test_several_steps_per_call_with_dropout(tmp_path, digits_reference, killed, rescuer):
    job = run_job(DIGITS, tmp_path / "run", *SHORT, *MULTI_STEP,
                  faults=[{"point": "after_step", "global_step": 16, "rank": killed}])
    assert_rescued(job, killed=killed, rescuer=rescuer, reached_step=17, rescued=14, interval=4, digest=digits_reference)


def test_a_rescue_between_input_captures_replays_the_batches_since(tmp_path, digits_reference):
    # digits_cnn's input re-enters by its iterator state. Snapshots 13, 16, 19 in epoch 1;
    # the input is captured only every 6 steps: at 13 (the epoch's first snapshot) and 19,
    # so the snapshot of 16 carries the capture of 13. The chief dies after step 18; rank 1
    # commits 16, and the restart restores the state of 13 and replays 3 batches.
    config = tmp_path / "job.toml"
    config.write_text("snapshot_capture_every = 6\n")
    job = run_job(DIGITS, tmp_path / "run", *SHORT, *ONE_STEP, "--config", str(config),
                  faults=[{"point": "after_step", "global_step": 18, "rank": 0}])
    assert_rescued(job, killed=0, rescuer=1, reached_step=18, rescued=16, interval=3, digest=digits_reference)
    saved = manifest(job, 16)["extra"]["iterator_state"]
    assert (saved["epoch"], saved["entry_step"], saved["at_step"]) == (1, 0, 3)
    (restored,) = job.named("restored")
    assert restored["input_reentry"] == "iterator_state"
    assert restored["input_reentry_reason"].endswith("tf.data iterator state of step 3 and replays 3 batches")


@pytest.fixture(scope="module")
def keras_reference(keras_reference_run):
    """digits_keras uninterrupted (ReduceLROnPlateau, EarlyStopping, CSVLogger, ModelCheckpoint)."""
    assert [e["epoch"] for e in keras_reference_run.named("training_stopped")] == [3]
    return keras_reference_run


@pytest.mark.parametrize("killed, rescuer", [
    pytest.param(0, 1, id="chief-killed"),
    pytest.param(1, 0, id="rank-1-killed", marks=SLOW),
])
def test_stateful_keras_callbacks(tmp_path, keras_reference, killed, rescuer):
    # Killed after step 27, in epoch 2: epoch 1's end (step 20) committed the chief-only
    # callbacks' state (CSVLogger's size, ModelCheckpoint's best) that rank 1's rescue carries.
    job = run_job(KERAS, tmp_path / "run", *EPOCHS, *ONE_STEP,
                  faults=[{"point": "after_step", "global_step": 27, "rank": killed}])
    assert_rescued(job, killed=killed, rescuer=rescuer, reached_step=27, rescued=26, interval=3,
                   digest=keras_reference.summary["weights_sha256"])
    rescued = json.loads((job.run_dir / "checkpoints" / "ckpt-000000000026" / "callbacks.json").read_text())["callbacks"]
    # The chief-only callbacks as of epoch 1's end: CSVLogger's file held the header and 2 rows,
    # ModelCheckpoint's best is the better val_accuracy of epochs 0 and 1.
    csv_lines = (keras_reference.run_dir / "training_log.csv").read_bytes().splitlines(keepends=True)
    assert (rescued["2"]["class"], rescued["2"]["state"]["size"]) == ("CSVLogger", len(b"".join(csv_lines[:3])))
    accuracies = [e["val_metrics"]["accuracy"] for e in keras_reference.named("epoch_finished")]
    assert (rescued["3"]["class"], rescued["3"]["state"]["best"]) == ("ModelCheckpoint", max(accuracies[:2]))
    assert_ends_as(job, keras_reference)


def test_a_torn_rescue_is_never_restored(tmp_path, digits_reference):
    # The chief dies after step 17; rank 1's rescue of step 16 uploads its first file and is
    # SIGKILLed before the manifest. The restart restores epoch 0's end (step 10).
    job = run_job(DIGITS, tmp_path / "run", *SHORT, *ONE_STEP, faults=[
        {"point": "after_step", "global_step": 17, "rank": 0},
        {"point": "mid_upload", "global_step": 16, "rank": 1}])
    assert job.returncode == EXIT_OK, job.output
    assert [(e["rank"], e["dead_ranks"]) for e in job.named("rescue_requested")] == [(1, [0])]
    assert job.named("rescue_committed") == []
    torn = job.run_dir / "checkpoints" / "ckpt-000000000016"
    assert not (torn / "MANIFEST.json").exists()  # data without a manifest: not a checkpoint
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(10, 2)]
    assert [(e["global_step"], e["attempt"]) for e in job.named("checkpoint_committed")] == [(10, 1), (20, 2)]
    assert job.summary["lost_steps"] == 7
    assert job.summary["weights_sha256"] == digits_reference


def test_a_supervisor_sigkilled_during_a_rescue_leaves_no_stale_commit(tmp_path, digits_reference):
    # The chief dies after step 17; rank 1's rescue of step 16 freezes (SIGSTOP) after its
    # first uploaded file, and the supervisor waiting for it is SIGKILLed. Its workers die
    # with it (PR_SET_PDEATHSIG, the frozen rescuer too), and the re-run's group, a newer
    # generation, restores epoch 0's end (10): the half-written rescue is never a checkpoint.
    faults = [{"point": "after_step", "global_step": 17, "rank": 0},
              {"point": "mid_upload", "global_step": 16, "rank": 1, "signal": "SIGSTOP"}]
    run_dir = tmp_path / "run"

    def rescuer_frozen(events):
        pids = worker_pids(events, attempt=1)
        return any(e["event"] == "rescue_requested" for e in events) and 1 in pids and stopped(pids[1])

    killed = run_job_until(DIGITS, run_dir, *SHORT, *ONE_STEP, env={"RT_FAULTS": json.dumps(faults)},
                           when=rescuer_frozen, action=lambda proc, events: proc.send_signal(signal.SIGKILL))
    assert killed.returncode == -signal.SIGKILL
    assert survivors(worker_pids(read_events(run_dir), attempt=1).values(), within_s=60) == []
    torn = run_dir / "checkpoints" / "ckpt-000000000016"
    assert torn.is_dir() and not (torn / "MANIFEST.json").exists()

    rerun = run_job(DIGITS, run_dir, *SHORT, *ONE_STEP)
    assert rerun.returncode == EXIT_OK, rerun.output
    assert rerun.named("rescue_committed") == [] and not (torn / "MANIFEST.json").exists()
    claimed = [(e["generation"], e["attempt"]) for e in rerun.named("generation_claimed")]
    assert [g for g, _ in claimed] == [1, 2]
    assert [(e["global_step"], e["attempt"]) for e in rerun.named("checkpoint_committed")] == [(10, 1), (20, claimed[1][1])]
    assert [(r["global_step"], r["attempt"]) for r in rerun.named("restored")] == [(10, claimed[1][1])]
    assert rerun.summary["weights_sha256"] == digits_reference


@pytest.fixture(scope="module")
def bn_reference(tmp_path_factory):
    """digits_cnn with a BatchNormalization layer, uninterrupted: (recipe, final digest)."""
    tmp_path = tmp_path_factory.mktemp("bn")
    recipe = recipe_variant(tmp_path, "digits_bn", 'keras.layers.Dense(64, activation="relu"),',
                            'keras.layers.Dense(64, activation="relu"),\n            keras.layers.BatchNormalization(),',
                            base="recipes/digits_cnn.py")
    reference = run_job(recipe, tmp_path / "reference", *SHORT)
    assert reference.returncode == EXIT_OK, reference.output
    return recipe, reference.summary["weights_sha256"]


def test_batch_normalization_chief_killed_falls_back_to_the_last_commit(tmp_path, bn_reference):
    # BatchNormalization's moving statistics are updated by each worker from its own
    # batches: rank 1's snapshot is not the run's state (the chief's), so it is never
    # committed; the restart restores the epoch-end commit of step 10, exactly.
    recipe, digest = bn_reference
    job = run_job(recipe, tmp_path / "run", *SHORT, *MULTI_STEP,
                  faults=[{"point": "after_step", "global_step": 16, "rank": 0}])
    assert job.returncode == EXIT_OK, job.output
    differ = job.named("workers_differ")
    assert [(e["global_step"], e["variables"]) for e in differ] == [(4, BN_STATS), (14, BN_STATS)]  # attempts 1, 2: their first snapshots
    reason = divergence_reason(BN_STATS)
    assert [(e["rank"], e["dead_ranks"]) for e in job.named("rescue_requested")] == [(1, [0])]
    assert [(e["rank"], e["reason"]) for e in job.named("rescue_skipped")] == [(1, reason)]
    assert job.named("rescue_committed") == []
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(10, 2)]
    assert reached(job, 1) == 17 and job.summary["lost_steps"] == 7
    assert job.summary["weights_sha256"] == digest


@SLOW  # the chief's rescue of the same model: exact (its snapshot is the run's state)
def test_batch_normalization_rank_1_killed_the_chief_rescues(tmp_path, bn_reference):
    recipe, digest = bn_reference
    job = run_job(recipe, tmp_path / "run", *SHORT, *MULTI_STEP,
                  faults=[{"point": "after_step", "global_step": 16, "rank": 1}])
    assert_rescued(job, killed=1, rescuer=0, reached_step=17, rescued=14, interval=4, digest=digest)


@SLOW  # the same, with the indexed input's position
def test_the_indexed_recipe(tmp_path):
    flags = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "128", "--no-warm-standby")
    reference = run_job("recipes/digits_indexed.py", tmp_path / "reference", *flags)
    assert reference.returncode == EXIT_OK, reference.output
    for killed, rescuer in ((0, 1), (1, 0)):
        job = run_job("recipes/digits_indexed.py", tmp_path / f"killed-{killed}", *flags, *MULTI_STEP,
                      faults=[{"point": "after_step", "global_step": 16, "rank": killed}])
        assert_rescued(job, killed=killed, rescuer=rescuer, reached_step=17, rescued=14, interval=4,
                       digest=reference.summary["weights_sha256"])


@SLOW  # test_stateful_keras_callbacks' rescue, through model.fit
def test_an_unchanged_fit_script(tmp_path):
    script = str(REPO / "tests/recipes/fit_script.py")

    def run(name, *flags, **kwargs):
        out = tmp_path / f"out-{name}"
        out.mkdir()
        return run_job(script, tmp_path / name, *flags, env={"FIT_SCRIPT_OUT": str(out)}, cwd=out, **kwargs), out

    reference, reference_out = run("reference")
    assert reference.returncode == EXIT_OK, reference.output
    # Rank 1's death once logged a second rescue_requested (rank 1 asked, for rank 0) after
    # the chief's; not reproduced in 5 runs since (2026-11-26): assert_rescued would catch it.
    for killed, rescuer in ((0, 1), (1, 0)):
        job, out = run(f"killed-{killed}", *ONE_STEP, faults=[{"point": "after_step", "global_step": 27, "rank": killed}])
        assert_rescued(job, killed=killed, rescuer=rescuer, reached_step=27, rescued=26, interval=3,
                       digest=reference.summary["weights_sha256"])
        assert (out / "training_log.csv").read_bytes() == (reference_out / "training_log.csv").read_bytes()
