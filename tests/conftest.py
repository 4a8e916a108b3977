"""Session-wide fixtures: the real S3 server (SeaweedFS) for every test package."""

from tests.s3server import s3_server  # noqa: F401  (session fixture, started on first use)

import pytest
import structlog


@pytest.fixture(autouse=True)
def _fresh_event_context():
    """A test that runs the CLI in-process binds run_id/role; none may leak into the next."""
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()
