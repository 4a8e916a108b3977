"""Recipe bugs that every restart would hit again are fatal at once: exit 3
after one attempt, the root cause naming the fix, no restart spent."""

import pytest

from tests.integration.harness import recipe_variant as variant, run_job

FLAGS = ("--workers", "1", "--epochs", "1", "--steps-per-epoch", "10", "--global-batch-size", "4", "--no-warm-standby")



CASES = {
    "short_dataset": (".repeat()\n", "\n", "dataset() yielded 6 batches for epoch 0; steps_per_epoch is 10: add .repeat()"),
    "scalar_loss": ("tf.reduce_mean(tf.square(labels - predictions), axis=-1)", "tf.reduce_mean(tf.square(labels - predictions))",
                    "loss() must return one value per example, got shape ()"),
    "four_tuple": ("ds = ds.batch(", "ds = ds.map(lambda x, y: (x, y, y, y)).batch(",
                   "dataset() yielded a tuple of 4 elements; batches must be (features, labels) or (features, labels, sample_weight)"),
    "op_at_import": ("FEATURES = [", "ONE = tf.constant(1.0)\nFEATURES = [", "runs a TensorFlow op at import"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_deterministic_recipe_bug_is_fatal_with_its_fix(tmp_path, name):
    old, new, fragment = CASES[name]
    job = run_job(variant(tmp_path, name, old, new), tmp_path / "run", *FLAGS, "--max-restarts", "3")
    assert job.returncode == 3, job.output
    assert fragment in job.output
    assert job.summary["attempts"] == 1 and job.summary["restarts"] == 0
    assert fragment in job.summary["root_cause"]["message"]
    assert job.summary["root_cause"]["type"] == "resilient_train.errors.RecipeError"


def test_sample_weighted_batches_train(tmp_path):
    recipe = variant(tmp_path, "weighted", "ds = ds.batch(", "ds = ds.map(lambda x, y: (x, y, tf.constant(0.5))).batch(")
    job = run_job(recipe, tmp_path / "run", *FLAGS)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 10
