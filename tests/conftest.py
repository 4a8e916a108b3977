"""Session-wide fixtures: the real S3 server (SeaweedFS) and GCS emulator for every test package."""

from tests.support.gcsserver import gcs_server  # noqa: F401  (session fixture, started on first use)
from tests.support.s3server import s3_server  # noqa: F401  (session fixture, started on first use)

import os
import socket

import pytest
import structlog

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job


def _closed_loopback_port() -> int:
    with socket.socket() as probe:  # bound, then released: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Every worker a test starts watches its node's preemption notices (--preemption-notice auto,
# runner/process/preemption_notices.py). Its probes go to a loopback port nothing listens on (refused
# at once), never to 169.254.169.254: all traffic of the suite stays on loopback. A test that
# wants a metadata server passes its own endpoints (tests/support/metadata_server.py).
_NOWHERE = f"127.0.0.1:{_closed_loopback_port()}"
os.environ.setdefault("GCE_METADATA_HOST", _NOWHERE)
os.environ.setdefault("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://{_NOWHERE}")
os.environ.setdefault("RT_AZURE_METADATA_HOST", _NOWHERE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` scenarios run with RT_SLOW=1 (``make test-all``) or ``-m slow``.

    Each one is a variant whose guarantee a faster default-suite test already covers (its
    mark says which); the default suite stays within its time budget on 2 cores.
    """
    if os.environ.get("RT_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow scenario; set RT_SLOW=1 (make test-all) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_event_context():
    """A test that runs the CLI in-process binds run_id/role; none may leak into the next."""
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()


@pytest.fixture(scope="session")
def digits_reference_run(tmp_path_factory):
    """The uninterrupted run every interrupted one must match bit for bit (its Job). With the
    memory tier as users get it (auto), while the interrupted runs name their tier (off unless
    the test sets it: tests/integration/harness.py command): equal digests also say the tier
    changes no weight."""
    job = run_job(DIGITS, tmp_path_factory.mktemp("reference") / "run", *DIGITS_FLAGS, tier_default=True)
    assert job.returncode == 0, job.output
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", 20, 0)
    assert summary["stragglers"] == []  # a clean run names no slow worker (runner/health/stragglers.py)
    return job


@pytest.fixture(scope="session")
def keras_reference_run(tmp_path_factory):
    """recipes/digits_keras.py uninterrupted, 5 epochs (EarlyStopping ends it after epoch 3):
    the run tests/integration/test_keras.py and test_rescue_matrix.py compare with."""
    job = run_job("recipes/digits_keras.py", tmp_path_factory.mktemp("keras") / "reference", "--epochs", "5",
                  tier_default=True)
    assert job.returncode == 0, job.output
    assert job.summary["status"] == "completed"
    return job


@pytest.fixture(scope="session")
def digits_reference(digits_reference_run):
    """The uninterrupted run's final weights digest (computed, never hard-coded)."""
    return digits_reference_run.summary["weights_sha256"]
