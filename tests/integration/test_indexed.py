"""The indexed input contract on real MultiWorkerMirroredStrategy workers.

recipes/digits_indexed.py with ``--record-indices``: 2 epochs x 10 steps of 128 examples
(1280 positions per epoch, 1500 examples: epoch 1 runs from pass 0 into pass 1). The
per-step index digests (attempt-<n>/step-indices.txt) come from the indices the workers
were fed, all-gathered by the training step.
"""

import pytest

from resilient_train.rundir.stepindices import read_step_indices, replayed_conflicts
from tests.integration.harness import run_job

DIGITS_INDEXED = "recipes/digits_indexed.py"
FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "128", "--save-every-steps", "5",
         "--record-indices", "--no-warm-standby")


@pytest.fixture(scope="module")
def indexed_reference(tmp_path_factory):
    """The uninterrupted 2-worker run: (weights sha256, step -> index digest)."""
    job = run_job(DIGITS_INDEXED, tmp_path_factory.mktemp("reference") / "run", *FLAGS)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 20
    digests = read_step_indices(job.run_dir)
    assert list(digests) == list(range(1, 21))
    assert len(set(digests.values())) == 20
    return job.summary["weights_sha256"], digests


def test_kill_mid_epoch_resumes_bit_exactly_with_the_same_examples_per_step(tmp_path, indexed_reference):
    weights, digests = indexed_reference
    job = run_job(DIGITS_INDEXED, tmp_path / "run", *FLAGS, "--steps-per-execution", "1",
                  faults=[{"point": "after_commit", "global_step": 15, "rank": 0}])
    assert job.returncode == 0, job.output
    assert [(r["epoch"], r["step_in_epoch"]) for r in job.named("restored")] == [(1, 5)]
    assert job.summary["weights_sha256"] == weights
    assert read_step_indices(job.run_dir) == digests
    assert replayed_conflicts(job.run_dir) == []


@pytest.mark.slow  # tests/integration/test_elastic.py proves the same across a 2 -> 1 -> 2 resize
def test_one_worker_trains_each_step_on_the_examples_of_two(tmp_path, indexed_reference):
    _, digests = indexed_reference
    job = run_job(DIGITS_INDEXED, tmp_path / "run", *FLAGS, "--workers", "1")
    assert job.returncode == 0, job.output
    assert read_step_indices(job.run_dir) == digests


def test_record_indices_with_a_dataset_recipe_is_refused_before_workers_start(tmp_path):
    job = run_job("recipes/digits_cnn.py", tmp_path / "run", "--record-indices")
    assert job.returncode == 2
    assert job.output.strip().splitlines()[-1].startswith(
        "resilient-train: error: Received --record-indices but recipe recipes/digits_cnn.py defines dataset")
    assert not (tmp_path / "run" / "attempt-1").exists()
