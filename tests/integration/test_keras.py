"""A compiled Keras model with fit-style callbacks survives a SIGKILL and a SIGTERM exactly.

recipes/digits_keras.py: optimizer, loss and metrics from ``compile``; ReduceLROnPlateau,
EarlyStopping(restore_best_weights), CSVLogger and ModelCheckpoint(save_best_only) from
``callbacks``. Uninterrupted (the module's one reference run), it halves the learning rate
after epoch 1, stops early after epoch 3 of 5 and saves ``best.weights.h5`` after epochs
0-2 (epoch 3's val_accuracy is worse). Each interrupted run must end as the reference did:
same weights digest, same CSV bytes (no duplicated or missing row), same learning-rate
sequence, same early-stop epoch, same ModelCheckpoint best value and best weights.

* SIGKILL: the chief is killed at the worst moment for the callbacks: after epoch 2's end
  ran them (the CSV row is on disk, the counters have moved) and before that epoch end's
  checkpoint committed. The restarted group resumes from step 28, mid-epoch 2.
* SIGTERM: the supervisor is told to stop once epoch 2 has ended; the workers agree on a
  step inside epoch 3, save it and exit 143, and so does the supervisor. A re-run resumes
  there with zero lost steps. Stopping after epoch 3 then needs EarlyStopping's best from
  epoch 2, and not saving epoch 3 needs ModelCheckpoint's: both come from the checkpoint.
"""

import csv
import json
import signal

import h5py
import pytest

from resilient_train.checkpoint.store import CheckpointStore
from resilient_train.errors import EXIT_PREEMPTED
from resilient_train.rundir.layout import CHECKPOINTS
from resilient_train.runner.keras_recipes.callbacks import STATE_FILE
from tests.integration.harness import run_job, run_job_until

KERAS = "recipes/digits_keras.py"
# digits_keras whose epoch 3 (the last) runs at 1 s per step: time for a signal to land in it.
SLOW_KERAS = "tests/recipes/slow_digits_keras.py"
# The recipe's defaults (10 steps per epoch, global batch 32, a save every 4 steps), with
# --epochs given: a run that EarlyStopping ends before epoch 5 still counts as completed.
EPOCHS = ("--epochs", "5")
MODEL_CHECKPOINT = 3  # index of ModelCheckpoint in digits_keras.callbacks()
BEST_WEIGHTS = "best.weights.h5"


def learning_rates(run_dir):
    with open(run_dir / "training_log.csv", newline="") as handle:
        return [float(row["learning_rate"]) for row in csv.DictReader(handle)]


def epoch_results(job):
    return [(e["epoch"], e["loss"], json.dumps(e["metrics"], sort_keys=True), e.get("val_loss"))
            for e in job.named("epoch_finished")]


def final_callback_state(job):
    """callbacks.json of the run's final checkpoint."""
    path = job.run_dir / CHECKPOINTS / CheckpointStore.dir_name(job.summary["global_step"]) / STATE_FILE
    return json.loads(path.read_text())["callbacks"]


def saved_weights(path):
    """name -> bytes of every array in a Keras .weights.h5 file."""
    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: arrays.__setitem__(name, item[()].tobytes())
                          if isinstance(item, h5py.Dataset) else None)
    return arrays


@pytest.fixture(scope="module")
def reference(keras_reference_run):
    """The uninterrupted run (tests/conftest.py: one per session, test_rescue_matrix.py's too)."""
    job = keras_reference_run
    assert [e["epoch"] for e in job.named("training_stopped")] == [3]  # EarlyStopping ended the run early
    rates = learning_rates(job.run_dir)
    assert len(rates) == 4 and len(set(rates)) > 1  # ReduceLROnPlateau acted
    checkpoint = final_callback_state(job)[str(MODEL_CHECKPOINT)]
    assert checkpoint["class"] == "ModelCheckpoint"
    # ModelCheckpoint's best is epoch 2's val_accuracy, and epoch 3's is worse: a resume that
    # lost the best would save epoch 3's weights over epoch 2's.
    accuracies = [e["val_metrics"]["accuracy"] for e in job.named("epoch_finished")]
    assert checkpoint["state"]["best"] == accuracies[2] == max(accuracies) > accuracies[3]
    assert saved_weights(job.run_dir / BEST_WEIGHTS)  # the chief wrote it into the run dir
    return job


def assert_ends_as(job, reference):
    assert job.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (job.run_dir / "training_log.csv").read_bytes() == (reference.run_dir / "training_log.csv").read_bytes()
    assert learning_rates(job.run_dir) == learning_rates(reference.run_dir)
    assert [e["epoch"] for e in job.named("training_stopped")] == [3]
    checkpoint = final_callback_state(job)[str(MODEL_CHECKPOINT)]["state"]
    assert checkpoint == final_callback_state(reference)[str(MODEL_CHECKPOINT)]["state"]
    assert saved_weights(job.run_dir / BEST_WEIGHTS) == saved_weights(reference.run_dir / BEST_WEIGHTS)


def test_kill_chief_before_an_epoch_end_commit_resumes_callbacks_exactly(tmp_path, reference):
    killed = run_job(KERAS, tmp_path / "killed", *EPOCHS,
                     faults=[{"point": "before_commit", "global_step": 30, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [r["global_step"] for r in killed.named("restored")] == [28]
    assert_ends_as(killed, reference)
    # Epoch 2 finished twice (before the kill and after it); both times with the same numbers.
    assert sorted(set(epoch_results(killed))) == sorted(epoch_results(reference))


def after_epoch_2(events):
    return any(e["event"] == "epoch_finished" and e["epoch"] == 2 for e in events)


@pytest.mark.slow  # SIGTERM's agreed save and zero lost steps: tests/integration/test_supervisor.py; callbacks resumed exactly: the kill test above
def test_sigterm_after_an_epoch_end_saves_exits_143_and_rerun_resumes_callbacks_exactly(tmp_path, reference):
    run_dir = tmp_path / "run"
    preempted = run_job_until(SLOW_KERAS, run_dir, *EPOCHS, when=after_epoch_2,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    assert preempted.summary["status"] == "preempted"
    [stop] = preempted.named("preempted")
    assert 30 < stop["global_step"] < 40  # inside epoch 3, after epoch 2's end
    exits = {e["rank"]: e.get("exit_code") for e in preempted.named("worker_exited")}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}

    rerun = run_job(SLOW_KERAS, run_dir, *EPOCHS, "--set", "step_delay_s=0")
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert_ends_as(rerun, reference)
