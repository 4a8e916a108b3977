"""Exact resume with an unseeded shuffle, and the resume check.

The runner reseeds TensorFlow from (seed, epoch) before each dataset() call, so a
recipe whose shuffle() has no seed resumes bit-exactly in epoch 1. Input the runner
cannot make deterministic (numpy's global RNG) is detected after the restore: an
input_mismatch event and a warning, or exit 3 with --strict-resume.
"""

from tests.integration.harness import recipe_variant as variant, run_job

FLAGS = ("--workers", "1", "--epochs", "3", "--steps-per-epoch", "10", "--global-batch-size", "4",
         "--save-every-steps", "5", "--max-restarts", "2")
KILL_IN_EPOCH_1 = [{"point": "after_commit", "global_step": 15, "rank": 0}]  # epoch 1, step_in_epoch 5



def unseeded_shuffle(tmp_path):
    return variant(tmp_path, "unseeded", "ds.shuffle(len(features), seed=seed * 1000 + epoch)", "ds.shuffle(len(features))")


def numpy_order(tmp_path):
    return variant(tmp_path, "numpy_order", "features = np.tile(", "order = np.random.permutation(24)\n    features = np.tile(")


def test_unseeded_shuffle_killed_in_epoch_1_ends_with_the_reference_digest(tmp_path):
    recipe = unseeded_shuffle(tmp_path)
    reference = run_job(recipe, tmp_path / "reference", *FLAGS)
    assert reference.returncode == 0, reference.output
    killed = run_job(recipe, tmp_path / "killed", *FLAGS, faults=KILL_IN_EPOCH_1)
    assert killed.returncode == 0, killed.output
    assert [(r["epoch"], r["global_step"]) for r in killed.named("restored")] == [(1, 15)]
    assert killed.named("input_mismatch") == []
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]


def test_input_the_runner_cannot_seed_is_reported_after_the_restore(tmp_path):
    recipe = numpy_order(tmp_path)
    (tmp_path / "numpy_order.py").write_text(
        (tmp_path / "numpy_order.py").read_text().replace(
            "ds = tf.data.Dataset.from_tensor_slices((features, labels))",
            "ds = tf.data.Dataset.from_tensor_slices((features[order], labels[order]))"))
    job = run_job(recipe, tmp_path / "run", *FLAGS, faults=KILL_IN_EPOCH_1)
    assert job.returncode == 0, job.output
    mismatches = job.named("input_mismatch")
    assert [(m["epoch"], m["checkpoint"], m["strict"]) for m in mismatches] == [(1, "ckpt-000000000015", False)]
    assert mismatches[0]["expected_sha256"] != mismatches[0]["found_sha256"]

    strict = run_job(recipe, tmp_path / "strict", *FLAGS, "--strict-resume", faults=KILL_IN_EPOCH_1)
    assert strict.returncode == 3, strict.output
    assert "the first batch of epoch 1 differs from the one recorded" in strict.summary["root_cause"]["message"]
    assert "(--strict-resume)" in strict.output
