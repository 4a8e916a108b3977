"""A compiled Keras model with fit-style callbacks survives a SIGKILL of the chief exactly.

recipes/digits_keras.py: optimizer, loss and metrics from ``compile``; ReduceLROnPlateau,
EarlyStopping(restore_best_weights) and CSVLogger from ``callbacks``. The chief is killed
at the worst moment for the callbacks: after epoch 2's end ran them (the CSV row is on
disk, the plateau and patience counters have moved) and before that epoch end's
checkpoint committed. The restarted group resumes from step 28, mid-epoch 2, and must end
as the uninterrupted run did: same weights digest, same CSV bytes (no duplicated or
missing row), same learning-rate sequence, same early-stop epoch.
"""

import csv
import json

from tests.integration.harness import run_job

KERAS = "recipes/digits_keras.py"
# The recipe's defaults (10 steps per epoch, global batch 32, a save every 4 steps), with
# --epochs given: a run that EarlyStopping ends before epoch 8 still counts as completed.
EPOCHS = ("--epochs", "8")


def learning_rates(run_dir):
    with open(run_dir / "training_log.csv", newline="") as handle:
        return [float(row["learning_rate"]) for row in csv.DictReader(handle)]


def epoch_results(job):
    return [(e["epoch"], e["loss"], json.dumps(e["metrics"], sort_keys=True), e.get("val_loss"))
            for e in job.named("epoch_finished")]


def test_kill_chief_before_an_epoch_end_commit_resumes_callbacks_exactly(tmp_path):
    reference = run_job(KERAS, tmp_path / "reference", *EPOCHS)
    assert reference.returncode == 0, reference.output
    stopped = reference.named("training_stopped")
    assert len(stopped) == 1 and stopped[0]["epoch"] < 7  # EarlyStopping ended the run early
    assert reference.summary["status"] == "completed"
    rates = learning_rates(reference.run_dir)
    assert len(rates) == stopped[0]["epoch"] + 1 and len(set(rates)) > 1  # ReduceLROnPlateau acted

    killed = run_job(KERAS, tmp_path / "killed", *EPOCHS,
                     faults=[{"point": "before_commit", "global_step": 30, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [r["global_step"] for r in killed.named("restored")] == [28]
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (killed.run_dir / "training_log.csv").read_bytes() == (reference.run_dir / "training_log.csv").read_bytes()
    assert learning_rates(killed.run_dir) == rates
    assert [e["epoch"] for e in killed.named("training_stopped")] == [stopped[0]["epoch"]]
    # Epoch 2 finished twice (before the kill and after it); both times with the same numbers.
    assert sorted(set(epoch_results(killed))) == sorted(epoch_results(reference))
