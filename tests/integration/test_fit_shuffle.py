"""A seeded shuffle reads the order plain Keras reads (issue 46, found by a session: it did not).

tests/recipes/fit_shuffled.py calls ``keras.utils.set_random_seed(3)`` and trains on
``from_tensor_slices(...).shuffle(2048, seed=7).repeat().batch(64)``. Such a shuffle reshuffles on
every iterator (TF's default ``reshuffle_each_iteration=True``), so any iterator made before the
training one moves its seed generator. The runner used to peek at the first batch (``take(1)``)
for the global batch size: the training iterator then read the shuffle's second order and the run
trained on other batches than plain Keras ``model.fit``. The batch size is now read from the
pipeline's graph (runner/keras_recipes/fitscript.py ``_global_batch_size``), no iterator made.

On one worker, against plain Keras ``model.fit`` of the same script (tests/recipes/plain_keras.py):
the trained weights are bit-identical (the same weights_sha256: the same batches, in the same order),
and every epoch's loss and accuracy equal Keras' to relative 1e-6 (the epoch's mean: Keras keeps
it in a float32 ``Mean``, the runner reports it in Python floats, 0.128125 against float32's
0.12812499701976776; measured within 5e-8). Before the fix the digest differed and the first epoch's loss was another number.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import REPO, environment, run_job

SCRIPT = str(REPO / "tests/recipes/fit_shuffled.py")
REL = 1e-6  # an epoch's mean: Keras' float32 Mean against the runner's Python float (see the module docstring)


def test_a_seeded_shuffle_trains_on_plain_keras_batches_on_one_worker(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "tests/recipes/plain_keras.py"), SCRIPT, str(tmp_path / "fit.json")],
                          cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout
    plain = json.loads((tmp_path / "fit.json").read_text())
    job = run_job(SCRIPT, tmp_path / "run", "--workers", "1", "--no-warm-standby", cwd=tmp_path)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 15
    epochs = job.named("epoch_finished")
    assert job.summary["weights_sha256"] == plain["weights_sha256"]
    ours = {"loss": [e["loss"] for e in epochs], "accuracy": [e["metrics"]["accuracy"] for e in epochs]}
    for key, values in ours.items():
        assert all(math.isclose(a, b, rel_tol=REL) for a, b in zip(values, plain["history"][key], strict=True)), key


FIT = "model.fit(dataset, epochs=3, steps_per_epoch=5)"


@pytest.mark.slow  # the same one-worker comparison with plain Keras as the test above, with validation in fit
def test_validation_steps_and_freq_give_plain_keras_val_logs_on_one_worker(tmp_path):
    # issue 46 item 2: fit(validation_data=<a finite dataset>, validation_steps=2, validation_freq=2)
    # evaluates after epochs 1 and 3 (0-based) over the dataset's first 2 batches, as Keras does:
    # the same val_loss and val_accuracy (relative 1e-6: Keras' float32 Mean against the runner's
    # mean of the batches' values), none after epochs 0 and 2; the weights bit for bit.
    source = Path(SCRIPT).read_text()
    assert FIT in source
    script = tmp_path / "fit_validated.py"
    script.write_text(source.replace(FIT, "val = tf.data.Dataset.from_tensor_slices((x[1500:], y[1500:])).batch(64)\n"
                                          "model.fit(dataset, epochs=4, steps_per_epoch=5, validation_data=val, "
                                          "validation_steps=2, validation_freq=2)"))
    proc = subprocess.run([sys.executable, str(REPO / "tests/recipes/plain_keras.py"), str(script),
                           str(tmp_path / "fit.json")], cwd=tmp_path, env=environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout
    plain = json.loads((tmp_path / "fit.json").read_text())
    job = run_job(str(script), tmp_path / "run", "--workers", "1", "--no-warm-standby", cwd=tmp_path)
    assert job.returncode == 0, job.output
    assert job.summary["weights_sha256"] == plain["weights_sha256"]
    epochs = job.named("epoch_finished")
    assert [e["epoch"] for e in epochs if "val_loss" in e] == [1, 3]
    assert [e["val_examples"] for e in epochs if "val_loss" in e] == [128, 128]
    ours = {"val_loss": [e["val_loss"] for e in epochs if "val_loss" in e],
            "val_accuracy": [e["val_metrics"]["accuracy"] for e in epochs if "val_loss" in e]}
    assert sorted(plain["history"]) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    for key, values in ours.items():
        assert all(math.isclose(a, b, rel_tol=REL) for a, b in zip(values, plain["history"][key], strict=True)), key
