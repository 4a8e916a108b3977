import pytest

from tests.integration.harness import run_job

DIGITS = "recipes/digits_cnn.py"
# Small enough for CI (2 epochs x 10 steps, a seeded Dropout in the model), big enough
# to kill mid-epoch after a committed checkpoint.
DIGITS_FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "4")


@pytest.fixture(scope="session")
def digits_reference_run(tmp_path_factory):
    """The uninterrupted run every interrupted one must match bit for bit (its Job)."""
    job = run_job(DIGITS, tmp_path_factory.mktemp("reference") / "run", *DIGITS_FLAGS)
    assert job.returncode == 0, job.output
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", 20, 0)
    return job


@pytest.fixture(scope="session")
def digits_reference(digits_reference_run):
    """The uninterrupted run's final weights digest (computed, never hard-coded)."""
    return digits_reference_run.summary["weights_sha256"]
