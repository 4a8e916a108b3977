"""What the test object stores share: one server process, its log, its session fixture.

tests/support/s3server.py (SeaweedFS) and gcsserver.py (fake-gcs-server) each say how to
start their binary and when it is ready; starting it with its output in a log, stopping it
(SIGTERM, then SIGKILL), handing out unique prefixes and sharing one server per session
are the same for both and live here.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StorageTarget", "ServerProcess", "shared_server"]


@dataclass(frozen=True)
class StorageTarget:
    """Where a test may write: ``url_prefix`` (``scheme://bucket/<unique>``) and the options."""

    url_prefix: str
    storage_options: dict[str, Any]
    endpoint_url: str
    bucket: str

    def cli_flags(self) -> list[str]:
        """``--storage`` and one ``--storage-option`` per option (a dict's entries as ``key.sub``),
        as a user would type them for ``resilient-train run``."""
        flags = ["--storage", self.url_prefix]
        for key, value in self.storage_options.items():
            pairs = value.items() if isinstance(value, dict) else [(None, value)]
            flags += [f"--storage-option={key}{'' if k is None else '.' + k}={v}" for k, v in pairs]
        return flags


class ServerProcess:
    """One server process whose output goes to ``log_path``; a subclass gives ``scheme``,
    ``storage_options``, ``endpoint_url`` and ``_wait_until_ready``."""

    scheme = ""
    name = "server"

    def __init__(self, work_dir: Path, *, bucket: str, startup_timeout_s: float, log_name: str) -> None:
        self.work_dir = Path(work_dir)
        self.bucket = bucket
        self.startup_timeout_s = startup_timeout_s
        self.log_path = self.work_dir / log_name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        raise NotImplementedError

    endpoint_url: str

    def _wait_until_ready(self) -> None:
        raise NotImplementedError

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``args`` with its output in the log, then wait until it is ready (or stop it)."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.work_dir, env=env)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; log:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (a server may ignore SIGTERM while draining)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        self._after_stop()

    def _after_stop(self) -> None:
        """What a server leaves behind that its stop must clean up (nothing by default)."""

    def target(self, name: str | None = None) -> StorageTarget:
        prefix = f"{self.scheme}://{self.bucket}/{name or uuid.uuid4().hex[:12]}"
        return StorageTarget(prefix, self.storage_options, self.endpoint_url, self.bucket)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> Any:
        raise NotImplementedError


def shared_server(shared: dict[str, Any], start: Callable[[], ServerProcess]) -> Iterator[StorageTarget]:
    """The body of a session fixture: one server for the session, started by the first user.

    Re-exported from several conftests, a fixture is registered more than once; the server
    is still started once (reference-counted in ``shared``) and stopped after its last
    user. Each use yields a unique prefix; tests needing isolation append their own.
    """
    if shared["server"] is None:
        shared["server"] = start()
    shared["users"] += 1
    try:
        yield shared["server"].target()
    finally:
        shared["users"] -= 1
        if shared["users"] == 0:
            server, shared["server"] = shared["server"], None
            server.stop()
