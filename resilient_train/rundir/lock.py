"""One supervisor per run dir: an ``flock`` on ``<run-dir>/supervisor.lock``.

Why a kernel lock and not a pid file: the realistic collision is a requeued job starting
while the old one still runs (or was SIGKILLed a moment ago). A pid file outlives a
killed supervisor and needs guessing ("is pid 1234 still ours?"); an ``flock`` is released
by the kernel the moment its holder dies, however it dies, so a stale lock cannot exist.
The file's content (pid, host, start time, run id as JSON) is only for the message a
second run prints; the lock itself is the open file description.

The lock is taken before anything in the run dir is read or written (run.json,
attempt-<n>/, events.jsonl, summary.json) and held until the supervisor returns. Worker
processes never inherit it: Python opens files close-on-exec and workers are exec'd.

``flock`` is advisory and local to one kernel (and to NFS servers that emulate it):
two hosts that share a run dir over a network filesystem without lock support are not
protected. The storage-side fences (``OWNER.json`` and generations, see
``supervisor/ownership.py`` and ``checkpoint/fence.py``) cover checkpoints in that case.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from resilient_train.errors import RunDirLockedError
from resilient_train.rundir.layout import LOCK

__all__ = ["RunDirLock", "LOCK_NAME"]

LOCK_NAME = LOCK  # rundir/layout.py


class RunDirLock:
    """Exclusive, non-blocking ownership of one run dir for the life of this object's holder.

    Use as a context manager; :meth:`acquire` raises RunDirLockedError naming the holder
    when another live process has it. :meth:`record` adds facts (the run id) to the
    holder record once they are known.
    """

    def __init__(self, run_dir: Path, *, pid: int | None = None, host: str | None = None) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None
        self._holder: dict[str, Any] = {
            "pid": pid if pid is not None else os.getpid(),
            "host": host or socket.gethostname(),
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunDirLock":
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the umask decides (rundir/permissions.py)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirLockedError(self._locked_message(read_holder(self.path))) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._write_holder()
        return self

    def record(self, **facts: Any) -> None:
        """Add ``facts`` (e.g. ``run_id``) to the holder record a second run would print."""
        self._holder.update(facts)
        if self._fd is not None:
            self._write_holder()

    def release(self) -> None:
        """Unlock and close. The file stays: deleting it would race a third run's open()."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _write_holder(self) -> None:
        if self._fd is None:
            return
        data = (json.dumps(self._holder, sort_keys=True) + "\n").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def _locked_message(self, holder: dict[str, Any] | None) -> str:
        run_dir = self.path.parent
        if holder:
            who = (
                f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, "
                f"started {holder.get('started_at', '?')}"
                + (f", run id {holder['run_id']}" if holder.get("run_id") else "")
            )
        else:
            who = "a process that has not written its details yet"
        return (
            f"run dir {run_dir} is in use by another resilient-train run ({who}).\n"
            "Wait for it to finish or stop it (a re-run then resumes), or pass another --run-dir."
        )


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder record in a lock file, or None when it is empty, half-written or unreadable."""
    try:
        holder = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
