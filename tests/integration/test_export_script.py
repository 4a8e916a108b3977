"""``resilient-train export`` of a model.fit script's checkpoints (issue 46 item 6).

tests/recipes/fit_export.py trains a functional model with a seeded Dropout on arrays, one
worker, 2 epochs of 8 steps, saving every 4 steps (all kept), and writes the trained model's outputs on
40 probe inputs after fit(). ``export RUN/checkpoints --recipe fit_export.py`` rebuilds the
script's model (the script runs up to fit(), nothing trained) and restores the newest
checkpoint into it: the exported ``model.keras`` and SavedModel give exactly those outputs (the
same float32 values: the same weights and the same ops). ``--step 4`` exports a mid-run commit
with that commit's weights digest. Before this, both were refused: "... is a model.fit script,
not a recipe ... this command needs a recipe".
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from resilient_train.checkpoint import CheckpointStore
from tests.integration.harness import REPO, environment, run_job

SCRIPT = str(REPO / "tests/recipes/fit_export.py")


def export(*args, cwd):
    return subprocess.run([sys.executable, "-m", "resilient_train.cli", "export", *args], cwd=cwd, env=environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit_export")
    job = run_job(SCRIPT, root / "run", "--workers", "1", "--no-warm-standby", "--save-every-steps", "4", "--keep", "8",
                  env={"FIT_SCRIPT_OUT": str(root)}, cwd=root)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 16
    return root, job


def test_export_of_a_scripts_newest_checkpoint_predicts_as_the_trained_model(trained):
    import keras
    import tensorflow as tf

    root, job = trained
    proc = export(str(root / "run/checkpoints"), "--recipe", SCRIPT, "--out", str(root / "exported"), cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Exported global step 16 (weights_sha256 {job.summary['weights_sha256']}) to ")
    assert "building the model" in proc.stderr  # the script's print, kept off the command's one line
    record = json.loads((root / "exported/export.json").read_text())
    assert (record["recipe"], record["global_step"], record["weights_sha256"]) == (
        "fit_export", 16, job.summary["weights_sha256"])
    probe = np.random.default_rng(3)
    probe.normal(size=(256, 6)), probe.normal(size=6)
    probe = probe.normal(size=(40, 6)).astype("float32")  # the script's probe inputs (same generator, same draws)
    expected = np.load(root / "predictions.npy")
    loaded = keras.models.load_model(root / "exported/model.keras")
    assert np.array_equal(loaded(probe, training=False).numpy(), expected)
    served = tf.saved_model.load(str(root / "exported/saved_model"))
    assert np.array_equal(served.serve(probe).numpy(), expected)


def test_export_of_a_scripts_mid_run_checkpoint_has_that_commits_digest(trained):
    root, _ = trained
    committed = CheckpointStore(str(root / "run/checkpoints")).list()
    [mid] = [info for info in committed if info.global_step == 4]
    proc = export(str(root / "run/checkpoints"), "--recipe", SCRIPT, "--out", str(root / "step4"), "--step", "4",
                  "--format", "keras", cwd=root)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((root / "step4/export.json").read_text())
    assert (record["global_step"], record["files"]) == (4, {"keras": "model.keras"})
    assert record["weights_sha256"] == mid.manifest.weights_sha256


def test_set_with_a_script_is_refused_in_one_line(trained):
    root, _ = trained
    proc = export(str(root / "run/checkpoints"), "--recipe", SCRIPT, "--out", str(root / "x"), "--set", "lr=1",
                  cwd=root)
    assert proc.returncode == 2
    assert proc.stderr == (f"resilient-train export: --set lr with the fit() script {SCRIPT}: a script has no "
                           "parameters\n")
