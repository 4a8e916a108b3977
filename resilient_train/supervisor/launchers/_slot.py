"""One worker slot on a node: the node-side half of the Ray launcher, without Ray.

A ``Slot`` lives inside a Ray actor (launchers/ray.py wraps it) on the node the placement
group gave it, and owns at most one worker process and one warm standby there. Nothing on
the node is shared with the supervisor but the checkpoint storage, so:

* the worker writes into a **node-local run dir** (``<base>/slot-<n>``): its job file says
  so (``run_dir`` replaced), and ``local/`` (the host cache, the ranks' work dirs) is a link
  to ``<base>/local``, one per node and run, so the host cache is per node;
* ``poll()`` returns what the worker wrote since the last poll (``FileChunk``s), and the
  supervisor side appends them to its own run dir (``apply_chunks``). ``events.jsonl`` and
  logs are *appended* (events only up to the last complete line, so a torn line never
  travels); step markers and error files are *replaced* whenever they changed;
* the exit code is read **before** the files in the same ``poll()``, so the reply that
  reports an exit also carries everything the worker wrote before it exited;
* ``poll(wait_s)`` is a **long poll**: it first waits until the worker exits or ``wait_s``
  passed, so the supervisor keeps one poll outstanding per slot and hears of an exit as
  soon as it happened (a pidfd on Linux: the wait ends at the exit itself), not at its
  next periodic poll;
* the chief's outputs come back the same way: ``tensorboard/`` event files are appended,
  and sent whole again when the chief rewrote one (a resumed attempt truncates the steps
  past its restore point: a new inode or a shorter file); ``model/`` (the export, renamed
  into place complete) is sent whole per changed file;
* a new slot 0 (a fresh placement after a lost node) is **seeded** with the supervisor's
  ``tensorboard/`` before its worker starts, so the chief truncates those files as it
  would on one host instead of leaving steps past the restore point in the copy;
* ``close()`` returns what the pump has not sent yet, then removes the slot's run dir; the
  last slot of the run on a node (``final``) removes the node's run directory too.

The worker is started exactly like a local one (``python -m resilient_train.runner --job``,
or a warm standby that gets the same argv and environment, see runner/process/warm_standby.py), with
the Linux parent-death signal: when the actor dies (``ray.kill``, a lost node, the
supervisor's driver going away), its worker and standby die with it.

Threads: the Ray actor is threaded (launchers/ray.py), so that ``signal``,
``prestart_standby`` and ``close`` are served while a long poll waits. One lock serializes
everything else: every public method that touches the worker, the standby or the pump holds ``_lock`` for its
whole body (the helpers with a leading underscore expect it held), and every reap of the
worker (``poll()``/``wait()``) happens under it. Only the wait of ``poll`` runs without
it: it captured the worker at entry and ends when that worker exited or is no longer the
slot's (``start`` replaces only an exited worker; ``close`` kills the one it replaces, so
the pidfd wakes the wait either way). The files are collected under the lock too, so a
poll and ``close`` never read the same bytes twice, and after ``close`` a poll answers
nothing (``SlotReport(None)``): the run dir is gone, and whatever was left went with
close's reply. A threaded actor may run two calls of one caller out of order, so
``signal`` names the worker's pid: a signal meant for an earlier attempt's worker never
reaches the next one. The parent-death signal is tied to the thread that started the
child: Ray's pool threads live as long as the actor, so that is the actor's life.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.job.config import JobConfig
from resilient_train.rundir.permissions import current_umask, directory_mode
from resilient_train.cluster.ports import free_ports
from resilient_train.rundir import layout
from resilient_train.rundir.atomic import is_temporary, write_atomic
from resilient_train.rundir.events import EventFile
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor._process import die_with_parent_hook
from resilient_train.supervisor.launchers.api import WorkerHandle
from resilient_train.cluster import entry_points

__all__ = ["FileChunk", "Slot", "SlotReport", "apply_chunks", "seed_chunks"]

_EVENTS = layout.EVENTS
_TENSORBOARD = layout.TENSORBOARD
_OUTPUT_DIRS = (_TENSORBOARD, layout.MODEL)  # the chief's outputs, written under the run dir
# A long poll's wait: with a pidfd, woken by the exit itself; the slice only bounds how
# late a replaced worker is noticed, which never happens without an exit (see the
# "Threads" in the module docstring). Without a pidfd, the worker is reaped every _EXIT_CHECK_S.
_PIDFD_SLICE_S = 0.05
_EXIT_CHECK_S = 0.005


@dataclass(frozen=True)
class FileChunk:
    """New bytes of one file under a run dir; ``replace``: the whole new content."""

    path: str  # relative to the run dir, e.g. "attempt-2/worker-1.log"
    data: bytes
    replace: bool = False


@dataclass(frozen=True)
class SlotReport:
    """One ``Slot.poll()``: the worker's exit code (None: running) and its new output."""

    returncode: int | None
    chunks: tuple[FileChunk, ...] = ()
    standby_ready: bool = False


def _is_pumped(relative: str) -> bool:
    """Events, each attempt's logs, markers and errors, and the chief's outputs."""
    if relative == _EVENTS:
        return True
    parts = relative.split("/")
    if is_temporary(parts[-1]):
        return False
    if parts[0] in _OUTPUT_DIRS:
        return len(parts) > 1
    return len(parts) == 2 and layout.attempt_number(parts[0]) is not None and parts[1] != layout.JOB


def _replaced(relative: str) -> bool:
    """Sent whole whenever changed: small markers, and the export (written once)."""
    name = relative.rsplit("/", 1)[-1]
    return name.startswith(("step-", "phase-", "error-")) or relative.startswith("model/")


def _rewritable(relative: str) -> bool:
    """Appended, but sent whole again when rewritten (TensorBoard truncation on resume)."""
    return relative.startswith(_TENSORBOARD + "/")


class _Pump:
    """Remembers how much of each file under ``root`` was already sent."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._offsets: dict[str, int] = {}
        self._inodes: dict[str, int] = {}
        self._stamps: dict[str, tuple[int, int, int]] = {}

    def collect(self) -> tuple[FileChunk, ...]:
        chunks = [self._read(rel) for rel in self._files()]
        return tuple(c for c in chunks if c is not None)

    def mark_sent(self, relative: str) -> None:
        """``relative`` is already on the supervisor's side as it is here (a seeded file)."""
        stat = (self.root / relative).stat()
        self._offsets[relative] = stat.st_size
        self._inodes[relative] = stat.st_ino

    def _files(self) -> list[str]:
        outputs = [p for name in _OUTPUT_DIRS for p in sorted((self.root / name).rglob("*"))]
        found = []
        attempts = [p for attempt in RunDir(self.root).attempts() for p in sorted(attempt.path.iterdir())]
        for path in [self.root / _EVENTS, *attempts, *outputs]:
            relative = path.relative_to(self.root).as_posix()
            if _is_pumped(relative) and path.is_file():
                found.append(relative)
        return found

    def _read(self, relative: str) -> FileChunk | None:
        path = self.root / relative
        try:
            if _replaced(relative):
                stat = path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                if self._stamps.get(relative) == stamp:
                    return None
                data = path.read_bytes()
                self._stamps[relative] = stamp
                return FileChunk(relative, data, replace=True)
            offset = self._offsets.get(relative, 0)
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                if _rewritable(relative) and relative in self._inodes and (
                    stat.st_ino != self._inodes[relative] or stat.st_size < offset
                ):
                    data = handle.read()
                    self._offsets[relative], self._inodes[relative] = len(data), stat.st_ino
                    return FileChunk(relative, data, replace=True)
                handle.seek(offset)
                data = handle.read()
                self._inodes[relative] = stat.st_ino
        except OSError:
            return None
        if relative == _EVENTS:
            data = data[: data.rfind(b"\n") + 1]  # whole lines only
        if not data:
            return None
        self._offsets[relative] = offset + len(data)
        return FileChunk(relative, data)


def apply_chunks(run_dir: Path, chunks: tuple[FileChunk, ...] | list[FileChunk]) -> None:
    """Supervisor side: write what a slot sent into the supervisor's run dir."""
    for chunk in chunks:
        target = Path(run_dir) / chunk.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if chunk.path == _EVENTS:
            for line in chunk.data.splitlines():
                try:
                    EventFile(target).append(json.loads(line))
                except ValueError:
                    continue  # not an event line; never expected (whole lines only)
        elif chunk.replace:
            write_atomic(target, chunk.data)
        else:
            with open(target, "ab") as handle:
                handle.write(chunk.data)


def seed_chunks(run_dir: Path) -> tuple[FileChunk, ...]:
    """Supervisor side: its ``tensorboard/`` files, whole, to seed a new chief's slot."""
    root = Path(run_dir)
    chunks = []
    for path in sorted((root / _TENSORBOARD).rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and _is_pumped(relative):
            chunks.append(FileChunk(relative, path.read_bytes(), replace=True))
    return tuple(chunks)


class Slot:
    """A worker slot on this node; see the module docstring.

    ``base`` is the node-local directory for this run (created if missing); ``index``
    names this slot's run dir under it.
    """

    def __init__(
        self, base: str, index: int, *, python: str = sys.executable, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base = Path(base)
        self.run_dir = self.base / f"slot-{index}"
        self.python = python
        self.clock = clock
        # A new slot never inherits files: a predecessor here sent its files and removed
        # them, or died (lost) with them; a fresh pump would send them a second time.
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        shared_local = RunDir(self.base).local  # one per node, shared by its slots
        shared_local.mkdir(parents=True, exist_ok=True)
        local = RunDir(self.run_dir).local
        if not local.exists():
            local.symlink_to(shared_local, target_is_directory=True)
        self._pump = _Pump(self.run_dir)
        self._worker: subprocess.Popen | Any | None = None
        self._standby: Any = None
        self._standby_seq = 0
        self._lock = threading.Lock()  # see "Threads" in the module docstring
        self._closed = False

    # ------------------------------------------------------------ placement
    def free_port(self, host: str) -> int:
        """A port free on this node now (the worker binds it moments later).

        ``host`` is the node's address; portpicker checks every interface of the node.
        """
        return free_ports(1)[0]

    # ------------------------------------------------------------ workers
    def start(
        self, job_json: str, rank: int, attempt: int, env: Mapping[str, str], seed: tuple[FileChunk, ...] = ()
    ) -> dict[str, Any]:
        """Start rank ``rank`` of ``attempt``: the warm standby when one is ready, else cold.

        ``seed``: the supervisor's copy of files the worker resumes (``tensorboard/``),
        written into this slot's run dir first and counted as already sent.
        """
        with self._lock:
            return self._start(job_json, rank, attempt, env, seed)

    def _start(
        self, job_json: str, rank: int, attempt: int, env: Mapping[str, str], seed: tuple[FileChunk, ...] = ()
    ) -> dict[str, Any]:
        if self._worker is not None and self._worker.poll() is None:
            raise RuntimeError(f"slot {self.run_dir} still runs a worker (pid {self._worker.pid})")
        _narrow_umask(env, (self.base, self.run_dir))  # before anything of the attempt is written here
        apply_chunks(self.run_dir, seed)
        for chunk in seed:
            self._pump.mark_sent(chunk.path)
        job = JobConfig.from_json(job_json)
        job = dataclasses.replace(job, run_dir=str(self.run_dir))
        attempt_dir = RunDir(self.run_dir).attempt(attempt)
        attempt_dir.path.mkdir(parents=True, exist_ok=True)
        job_path = attempt_dir.job
        job_path.write_text(job.to_json())
        log_path = attempt_dir.log(rank)
        full_env = {**os.environ, **env}
        argv = ["--job", str(job_path)]
        standby = self._take_standby()
        warm = standby is not None and bool((standby.status() or {}).get("ok"))  # (None: still importing)
        if standby is not None and standby.assign({"argv": argv, "env": full_env, "log": str(log_path)}):
            self._worker = standby
            return {"pid": standby.pid, "standby": True, "standby_warm": warm}
        if standby is not None:
            standby.release()
        with open(log_path, "ab") as log:
            self._worker = subprocess.Popen(
                [self.python, "-m", entry_points.WORKER, *argv],
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent_hook(),
            )
        return {"pid": self._worker.pid, "standby": False}

    def poll(self, wait_s: float = 0.0) -> SlotReport:
        """The worker's exit code (read first) and everything it wrote since the last poll.

        ``wait_s`` > 0: a long poll. While the worker runs, first wait until it exits (or is
        no longer this slot's worker), at most ``wait_s``; then answer as above. After
        ``close``: ``SlotReport(None)``, nothing more comes from this slot.
        """
        if not wait_s >= 0:
            raise ValueError(f"Received wait_s={wait_s!r}; expected a number of seconds >= 0")
        worker = self._worker
        if wait_s > 0 and worker is not None:
            self._wait(worker, wait_s)
        with self._lock:
            if self._closed:
                return SlotReport(None)
            code = self._worker.poll() if self._worker is not None else None
            ready = self._standby_ready()
            return SlotReport(code, self._pump.collect(), ready)

    def _wait(self, worker: WorkerHandle, wait_s: float) -> None:
        """Return once ``worker`` exited or was replaced, or ``wait_s`` passed (no lock held)."""
        with self._lock:  # no reap between the check and the pidfd: the pid is still the worker's
            if self._worker is not worker or worker.poll() is not None:
                return
            pidfd = _open_pidfd(worker.pid)
        exited = select.poll()
        if pidfd is not None:
            exited.register(pidfd, select.POLLIN)
        deadline = self.clock() + wait_s
        try:
            while self._worker is worker and (left := deadline - self.clock()) > 0:
                if pidfd is not None:
                    if exited.poll(1000 * min(left, _PIDFD_SLICE_S)):
                        return  # it exited (reaped by the answer, under the lock)
                    continue
                with self._lock:
                    if worker.poll() is not None:
                        return
                time.sleep(min(left, _EXIT_CHECK_S))
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def signal(self, sig: int, pid: int | None = None) -> None:
        """Send ``sig`` to the worker, if it still runs (and is ``pid``, when given)."""
        with self._lock:
            worker = self._worker
            if worker is None or (pid is not None and worker.pid != pid) or worker.poll() is not None:
                return
            try:
                worker.send_signal(sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------ standby
    def prestart_standby(self, recipe: str) -> int | None:
        """Start a warm standby (TensorFlow and ``recipe`` imported) unless one is alive."""
        with self._lock:
            if self._closed:
                return None  # a late call (a threaded actor): the slot's dir is gone
            if self._standby is not None and self._standby.poll() is None:
                return self._standby.pid
            from resilient_train.supervisor.standby_pool import PopenStandby

            self._standby_seq += 1
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            self._standby = PopenStandby(
                [self.python, "-m", entry_points.WARM_STANDBY, "--recipe", recipe],
                env,
                self.run_dir / "standby" / f"standby-{self._standby_seq}.log",
            )
            return self._standby.pid

    def _standby_ready(self) -> bool:
        if self._standby is None or self._standby.poll() is not None:
            return False
        status = self._standby.status()
        return bool(status and status.get("ok"))

    def _take_standby(self) -> Any:
        """The standby if it is alive and reported itself usable; else None (released)."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if standby.poll() is None and standby.status() is None:
            return standby  # still importing: taking it beats a cold start from nothing
        if standby.poll() is None and (standby.status() or {}).get("ok"):
            return standby
        standby.release()
        return None

    # ------------------------------------------------------------ teardown
    def close(self, final: bool = False) -> tuple[FileChunk, ...]:
        """Kill what is left, return what was not sent yet, and remove this slot's run dir.

        ``final`` (the launcher is closing): also remove the node's run directory (the host
        cache in ``local/``) once no other slot of this run is left in it on this node.
        """
        with self._lock:
            self._closed = True
            return self._close(final)

    def _close(self, final: bool) -> tuple[FileChunk, ...]:
        if self._standby is not None:
            self._standby.release()
            self._standby = None
        worker, self._worker = self._worker, None
        if isinstance(worker, subprocess.Popen):
            if worker.poll() is None:
                worker.kill()
            worker.wait()
        elif worker is not None:  # a standby that became the worker
            worker.release()
        rest = self._pump.collect()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if final and not any(self.base.glob("slot-*")):
            shutil.rmtree(self.base, ignore_errors=True)  # best effort: a slot closing beside us may race
        return rest


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of the child ``pid`` (readable once it exited), or None where Linux has none
    (before 5.3, or a seccomp filter refuses it): then the wait checks every _EXIT_CHECK_S."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _narrow_umask(env: Mapping[str, str], dirs: tuple[Path, ...]) -> None:
    """Take the supervisor's run-dir umask (``RT_UMASK``) in this actor, and give ``dirs`` its mode.

    The actor process was started by Ray with the node's umask, and it created the slot's
    directories before it knew the run's; what it and its worker write from here on is as
    private as the supervisor's run dir.
    """
    mask = WorkerEnvironment.from_environ(env).umask
    if mask is None:
        return
    os.umask(current_umask() | mask)
    for path in dirs:
        path.chmod(directory_mode())
