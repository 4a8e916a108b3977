"""Session-wide fixtures: the real S3 server (SeaweedFS) for every test package."""

from tests.s3server import s3_server  # noqa: F401  (session fixture, started on first use)
