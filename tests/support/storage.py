"""Fixtures for the checkpoint store's tests: backends, captured events, checkpoint dirs.

``backend`` is parametrized over memory://, a local directory, a real S3 server
(SeaweedFS) and a GCS emulator (fake-gcs-server through gcsfs), so every contract test runs once per backend (fsspec's abstract-test
pattern). Sleep is always fake: no test waits for a backoff.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest

from resilient_train.checkpoint import CheckpointStore, RetryPolicy
from resilient_train.chaos.faultfs import FaultyFileSystem
from tests.support.gcsserver import GCSTarget, gcs_server  # noqa: F401  (gcs_server: session fixture)
from tests.support.s3server import S3Target, s3_server  # noqa: F401  (s3_server: session fixture)

FILES = {  # relative path -> size; >= 3 files including one in a subdirectory
    "ckpt.index": 300,
    "ckpt.data-00000-of-00001": 20_000,
    "assets/vocab.txt": 1_000,
}
DATA_FILE = "ckpt.data-00000-of-00001"
WEIGHTS = "ab" * 32


class Events:
    """An ``emit`` that records events as dicts, for exact assertions."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, event: str, *, group: bool = False, **fields: Any) -> None:
        self.records.append({"event": event, "group": group, **fields})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == event]


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def write_ckpt_dir(path: Path, seed: int) -> Path:
    """A fake TF checkpoint directory whose bytes depend on ``seed``."""
    for rel, size in FILES.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        pattern = f"{rel}|{seed}|".encode()
        target.write_bytes((pattern * (size // len(pattern) + 1))[:size])
    return path


@dataclass
class Backend:
    """Makes stores on one backend, each under a fresh unique root."""

    name: str
    base: str
    options: dict[str, Any]
    tmp_path: Path
    events: Events = field(default_factory=Events)
    sleep: FakeSleep = field(default_factory=FakeSleep)

    def new_url(self) -> str:
        return f"{self.base}/{uuid.uuid4().hex[:10]}"

    def store(self, url: str | None = None, *, faults: dict[str, Any] | None = None,
              retry: RetryPolicy | None = None) -> CheckpointStore:
        url = url or self.new_url()
        fs = None
        if faults is not None:
            inner, _ = fsspec.core.url_to_fs(url, **self.options)
            fs = FaultyFileSystem(fs=inner, **faults)
        return CheckpointStore(url, self.options, emit=self.events, fs=fs,
                               retry=retry or RetryPolicy(sleep=self.sleep))

    def commit(self, store: CheckpointStore, global_step: int, *, seed: int | None = None,
               extra: dict[str, Any] | None = None) -> Any:
        local = write_ckpt_dir(self.tmp_path / f"stage-{uuid.uuid4().hex[:8]}", seed if seed is not None else global_step)
        return store.commit(local, run_id="run-1", epoch=global_step // 10, step_in_epoch=global_step % 10,
                            global_step=global_step, world_size=2, weights_sha256=WEIGHTS,
                            tf_version="2.21.0", extra=extra)

    def raw_fs(self, store: CheckpointStore) -> tuple[Any, str]:
        """The plain filesystem and root under ``store`` (to tamper with files)."""
        options = {"auto_mkdir": True} if self.name == "local" else self.options
        return fsspec.core.url_to_fs(store.url, **options)


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("gcs", marks=pytest.mark.gcs)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "memory":
        return Backend("memory", f"memory://rt-tests/{uuid.uuid4().hex[:8]}", {}, tmp_path)
    if request.param == "local":
        return Backend("local", str(tmp_path / "store"), {}, tmp_path)
    if request.param == "gcs":
        gcs: GCSTarget = request.getfixturevalue("gcs_server")
        return Backend("gcs", gcs.url_prefix, gcs.storage_options, tmp_path)
    target: S3Target = request.getfixturevalue("s3_server")
    return Backend("s3", target.url_prefix, target.storage_options, tmp_path)


@pytest.fixture
def memory_backend(tmp_path: Path) -> Backend:
    return Backend("memory", f"memory://rt-tests/{uuid.uuid4().hex[:8]}", {}, tmp_path)
