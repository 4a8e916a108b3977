"""Held-out evaluation, TensorBoard and the exported model after a kill.

One killed-and-resumed digits run (the chief SIGKILLs itself after step 15; the supervisor
restarts the group from the newest committed checkpoint) against the session's
uninterrupted reference run:

* the evaluation numbers of every epoch equal the reference's to the last digit,
* the TensorBoard files, read back, hold each step exactly once in increasing order,
* the exported model's weights digest is the checkpoint's weights_sha256 and the
  reloaded model (Keras file and SavedModel) predicts what the recipe's model predicts,
* `resilient-train export` exports an earlier committed checkpoint with its digest.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import REPO, environment, run_job

HELD_OUT = 1797 - 1500  # recipes/digits_cnn.py: TRAIN_IMAGES


def validations(job):
    return [(e["epoch"], e["global_step"], e["val_loss"], e["val_metrics"], e["val_examples"])
            for e in job.named("epoch_finished")]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("outputs") / "run"
    config = run_dir.parent / "progress.toml"
    config.write_text("progress_every_s = 0\n")  # a train_progress event (and scalar) at every step
    # One step per call: a progress event (and scalar) at every step, and the fault at step
    # 15 fires right after it (with longer calls both happen at call ends only).
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS, "--config", str(config), "--steps-per-execution", "1",
                  faults=[{"point": "after_step", "global_step": 15, "rank": 0}])
    assert job.returncode == 0, job.output
    assert (job.summary["restarts"], job.summary["attempts"]) == (1, 2)
    return job


def test_evaluation_after_a_kill_equals_the_uninterrupted_run(killed_run, digits_reference_run):
    reference = validations(digits_reference_run)
    assert [(epoch, step, examples) for epoch, step, _, _, examples in reference] == [(0, 10, HELD_OUT), (1, 20, HELD_OUT)]
    assert validations(killed_run) == reference  # exact floats, not approximately
    assert killed_run.summary["weights_sha256"] == digits_reference_run.summary["weights_sha256"]
    final = {k: killed_run.summary[k] for k in ("val_epoch", "val_loss", "val_metrics", "val_examples")}
    assert final == {"val_epoch": 2, "val_loss": reference[-1][2], "val_metrics": reference[-1][3], "val_examples": HELD_OUT}
    assert f"val_loss {reference[-1][2]:.4f}  val_accuracy {reference[-1][3]['accuracy']:.4f}" in killed_run.output


def test_tensorboard_steps_after_a_kill_are_each_written_once(killed_run, digits_reference_run):
    from resilient_train.runner.outputs.tensorboard import read_scalars

    restored = killed_run.named("restored")[0]["global_step"]
    dead_reached = max(e["global_step"] for e in killed_run.named("train_progress") if e["attempt"] == 1)
    # The kill fires after step 15's progress event. Commits: 4, 8, the epoch end 10 (waited
    # for), 12 (async: may not have landed before the kill).
    assert restored in (10, 12) and dead_reached == 15  # the dead attempt logged steps the resumed one redid

    scalars = read_scalars(killed_run.run_dir / "tensorboard")
    assert [step for step, _ in scalars["train/loss"]] == list(range(1, 21))
    assert scalars["run/restarts"] == [(0, 0.0), (restored, 1.0)]
    committed = sorted({e["global_step"] for e in killed_run.named("checkpoint_committed")})
    assert [step for step, _ in scalars["checkpoint/commit_s"]] == committed
    reference = validations(digits_reference_run)
    assert scalars["eval/loss"] == [(step, float(np.float32(loss))) for _, step, loss, _, _ in reference]
    assert scalars["eval/accuracy"] == [(step, float(np.float32(m["accuracy"]))) for _, step, _, m, _ in reference]


def test_exported_model_matches_the_checkpoint_and_predicts_like_it(killed_run, tmp_path):
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from resilient_train.checkpoint import CheckpointStore

    from resilient_train.runner.outputs.model_export import exported_weights_sha256
    from resilient_train.job.recipe import load_recipe

    model_dir = killed_run.run_dir / "model"
    info = json.loads((model_dir / "export.json").read_text())
    digest = killed_run.summary["weights_sha256"]
    assert (info["weights_sha256"], info["global_step"]) == (digest, 20)
    assert [e["weights_sha256"] for e in killed_run.named("model_exported")] == [digest]

    loaded = keras.models.load_model(model_dir / "model.keras")
    assert exported_weights_sha256(loaded, model_dir) == digest
    # The recipe's model restored from the final committed checkpoint is what we compare with.
    store = CheckpointStore(str(killed_run.run_dir / "checkpoints"))
    _, local_dir = store.fetch(20, tmp_path / "cache")
    from_checkpoint = load_recipe(DIGITS).build_model({"dropout": 0.25})
    tf.train.Checkpoint(model=from_checkpoint).read(str(local_dir / "ckpt")).expect_partial()
    batch = (load_digits().images[1500:1532] / 16.0).astype(np.float32)[..., None]
    expected = from_checkpoint(batch, training=False).numpy()
    np.testing.assert_array_equal(loaded(batch, training=False).numpy(), expected)
    serving = tf.saved_model.load(str(model_dir / "saved_model"))
    np.testing.assert_array_equal(serving.serve(batch).numpy(), expected)


def test_export_command_exports_an_earlier_checkpoint(killed_run, tmp_path):
    from resilient_train.checkpoint import CheckpointStore

    store = CheckpointStore(str(killed_run.run_dir / "checkpoints"))
    earliest = store.list()[0].manifest
    proc = subprocess.run(
        [sys.executable, "-m", "resilient_train", "export", str(killed_run.run_dir / "checkpoints"),
         "--recipe", DIGITS, "--step", str(earliest.global_step), "--out", str(tmp_path / "m"), "--format", "keras"],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "m" / "export.json").read_text())
    assert (info["global_step"], info["weights_sha256"], info["files"]) == (
        earliest.global_step, earliest.weights_sha256, {"keras": "model.keras"})
    assert f"Exported global step {earliest.global_step} (weights_sha256 {earliest.weights_sha256})" in proc.stdout
