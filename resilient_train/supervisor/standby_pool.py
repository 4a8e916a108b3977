"""The warm standby pool: worker processes that have imported TensorFlow, waiting for a job.

A gang restart used to spawn N cold processes, each paying the TensorFlow/Keras import
(2.7-4 s on an idle 2-core machine) before its strategy could even start. The pool keeps N
processes (runner/process/warm_standby.py) that have already done everything that does not depend on
TF_CONFIG; ``hand_over`` gives one of them a worker's argv, environment and log path, and
from then on it *is* that worker: the supervisor watches and signals it exactly like a cold
one, and ``worker_started`` carries its real pid.

Invariants:

* A standby joins a group only by ``hand_over``, and only while it is alive: dead standbys
  are reaped (``standby_lost``) before every hand-over, and a standby whose pipe is already
  broken when the assignment is written is dropped and the next one (or a cold spawn) is used.
  A process that died while waiting is never part of any attempt.
* The pool refills itself in the background, but not at once: right after a hand-over the
  freshly assigned workers are restoring and tracing their first step, and on a small
  machine N new TensorFlow imports would compete with them for the CPU (measured: with
  load ~10 on 2 cores, refilling during the restart doubled the time to the first step).
  So refill waits until the supervisor says the group is training (``maintain(refill=True)``,
  the chief's first step of the attempt) or ``replenish_delay_s`` passed since the last
  hand-over (or since the pool was created), whichever comes first. A spawner whose
  standbys are forks of one warm template (supervisor/forked_standbys.py) makes a standby cost
  milliseconds, so the launcher fills the pool at once before each start (``fill_now``): the
  first attempt's workers are forks too (supervisor/launchers/local.py).
* A standby that reports itself unusable (its pre-warm initialized the eager context, see
  runner/process/warm_standby.py) disables the pool for the run (``standby_disabled``): every later
  attempt is cold, which is always correct. So does a pool whose standbys keep dying before
  they are ready (``MAX_LOST_PER_SLOT`` per slot without one becoming ready).
* Standbys get the parent-death signal like workers (same spawner code), and ``close``
  kills and reaps whatever is left, so none outlives the supervisor.

# Implementation:
# Single-threaded: the supervisor's loop calls ``maintain()`` every poll (reap the dead,
# read ready lines from non-blocking pipes, spawn what is missing once the hold is over) and
# ``hand_over()`` from its start path. Each standby's life is one StandbyState.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Protocol

from resilient_train.cluster.environment import STANDBY_READY_FD
from resilient_train.rundir import events
from resilient_train.supervisor._process import die_with_parent_hook

__all__ = ["StandbyPool", "StandbyState", "PopenStandby", "PopenStandbySpawner", "StatusPipe", "UnusableStandbyError",
           "MAX_LOST_PER_SLOT"]

MAX_LOST_PER_SLOT = 3


class StandbyState(str, Enum):
    """One standby's life. Transitions:

    STARTING -> READY       its status line said ok (imports done, context untouched)
    STARTING -> UNUSABLE    its status line said not ok (disables the pool)
    STARTING|READY -> LOST      it exited while waiting (reaped, replaced)
    STARTING|READY -> ASSIGNED  handed over: it is a worker now, no longer the pool's
    STARTING|READY -> RELEASED  the pool was closed (killed and reaped)
    """

    STARTING = "starting"
    READY = "ready"
    ASSIGNED = "assigned"
    LOST = "lost"
    UNUSABLE = "unusable"
    RELEASED = "released"


class StandbyProcess(Protocol):
    pid: int
    forked: bool  # forked from the standby template (supervisor/forked_standbys.py), not spawned

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def status(self) -> dict[str, Any] | None: ...
    def assign(self, assignment: dict[str, Any]) -> bool: ...
    def release(self) -> None: ...


class StandbySpawner(Protocol):
    """Starts one standby (``argv``/``env``: a spawned standby's; a spawner may make it otherwise).

    Returns None when it cannot start one yet (a fork template still importing: the pool asks
    again at its next ``maintain``); raises UnusableStandbyError when no standby it could start
    would be usable (the template's pre-warm initialized the eager context).
    """

    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> StandbyProcess | None: ...


class UnusableStandbyError(RuntimeError):
    """Every standby this spawner would start is unusable; the message says why."""


class StatusPipe:
    """The read end of a standby's status pipe: its one status line, read without blocking."""

    def __init__(self, read_fd: int) -> None:
        os.set_blocking(read_fd, False)
        self._status_fd: int | None = read_fd
        self._buffer = b""
        self._status: dict[str, Any] | None = None

    def status(self) -> dict[str, Any] | None:
        """The standby's status line once it arrived (non-blocking)."""
        while self._status is None and self._status_fd is not None:
            try:
                chunk = os.read(self._status_fd, 4096)
            except BlockingIOError:
                break  # nothing more yet
            self._buffer += chunk
            if b"\n" in self._buffer:
                line = self._buffer.split(b"\n", 1)[0]
                try:
                    self._status = json.loads(line)
                except json.JSONDecodeError:
                    self._status = {"ok": False, "reason": f"unreadable status line {line[:80]!r}"}
            if b"\n" in self._buffer or not chunk:  # got the line, or EOF
                self._close_status()
        return self._status

    def _close_status(self) -> None:
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None


class PopenStandby(StatusPipe):
    """A real standby process: assignment pipe on its stdin, status pipe on a passed fd."""

    forked = False

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:

        log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        env = {**env, STANDBY_READY_FD: str(write_fd)}
        try:
            with open(log_path, "ab") as log:
                self.popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    preexec_fn=die_with_parent_hook(),
                )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        super().__init__(read_fd)
        self.pid = self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def assign(self, assignment: dict[str, Any]) -> bool:
        """Write the assignment; False when the process is already gone."""
        self._close_status()
        stdin = self.popen.stdin
        if stdin is None or self.popen.poll() is not None:
            return False
        try:
            stdin.write((json.dumps(assignment) + "\n").encode())
            stdin.close()
        except (BrokenPipeError, OSError):
            return False
        return True

    def release(self) -> None:
        self._close_status()
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        self.popen.wait()


class PopenStandbySpawner:
    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> PopenStandby:
        return PopenStandby(argv, env, log_path)


@dataclass
class _Standby:
    seq: int
    process: StandbyProcess
    log_path: Path
    state: StandbyState = StandbyState.STARTING
    started: float = 0.0


@dataclass
class StandbyPool:
    """Keeps ``size`` standbys alive and warm; see the module docstring.

    ``argv``/``env`` start one standby process; ``log_dir`` holds their logs until they are
    assigned (then they write to the worker's log).
    """

    size: int
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    spawner: StandbySpawner = field(default_factory=PopenStandbySpawner)
    clock: Callable[[], float] = time.monotonic
    replenish_delay_s: float = 10.0
    emit: Callable[..., None] = events.emit

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"Received size={self.size!r}; expected an int >= 1")
        if not self.replenish_delay_s >= 0:
            raise ValueError(f"Received replenish_delay_s={self.replenish_delay_s!r}; expected >= 0")
        self._waiting: list[_Standby] = []
        self._seq = 0
        # pid -> whether the standby had finished its imports (READY) when it was handed over
        self.handed_over_warm: dict[int, bool] = {}
        self._hold_until = self.clock() + self.replenish_delay_s
        self._lost_since_ready = 0
        self.disabled: str | None = None

    # ------------------------------------------------------------ public
    @property
    def waiting(self) -> list[StandbyProcess]:
        """Live standbys in the pool (starting or ready), oldest first."""
        return [s.process for s in self._waiting]

    def ready_count(self) -> int:
        return sum(1 for s in self._waiting if s.state is StandbyState.READY)

    def maintain(self, *, refill: bool = False) -> None:
        """Reap the dead, take in status lines; refill when ``refill`` or the hold is over."""
        self._reap()
        if refill:
            self._hold_until = min(self._hold_until, self.clock())
        if self.disabled is None and self.clock() >= self._hold_until:
            while self.disabled is None and len(self._waiting) < self.size and self._spawn():
                pass

    def fill_now(self, *, ready_within_s: float) -> None:
        """Spawn what is missing now, hold or not, and wait up to ``ready_within_s`` for every
        standby to say ready: for a spawner whose standbys are forks of a warm template (ready in
        milliseconds), so a start takes warm processes instead of importing cold ones."""
        self.maintain(refill=True)
        deadline = self.clock() + ready_within_s
        while self.disabled is None and any(s.state is StandbyState.STARTING for s in self._waiting):
            if self.clock() >= deadline:
                return
            time.sleep(0.005)
            self._reap()

    def hand_over(self, worker_argv: list[str], env: dict[str, str], log_path: Path) -> StandbyProcess | None:
        """Make a live standby the worker (``worker_argv`` as runner.process.worker_main.main's argv).

        Returns its process, or None when the pool has no live standby (the caller starts
        a cold one). Ready standbys are preferred over ones still importing.
        """
        self._reap()
        if self.disabled is not None:
            return None
        self._hold_until = self.clock() + self.replenish_delay_s
        candidates = sorted(self._waiting, key=lambda s: (s.state is not StandbyState.READY, s.seq))
        assignment = {"argv": list(worker_argv), "env": dict(env), "log": str(log_path)}
        for standby in candidates:
            self._waiting.remove(standby)
            if standby.process.assign(assignment):
                # A standby still importing when handed over pays the rest of its import on the
                # restart's path (found on 2 cores: two workers training flat out leave an idle-
                # priority import no CPU, so a restart 15 s later took a standby that was not warm).
                self.handed_over_warm[standby.process.pid] = standby.state is StandbyState.READY
                standby.state = StandbyState.ASSIGNED
                return standby.process
            self._lost(standby, standby.process.poll())
            standby.process.release()
        return None

    def close(self) -> None:
        """Kill and reap every standby still waiting."""
        for standby in self._waiting:
            standby.state = StandbyState.RELEASED
            standby.process.release()
        self._waiting = []

    # ------------------------------------------------------------ internals
    def _spawn(self) -> bool:
        """Start one standby; False when the spawner cannot now (or never: then disabled)."""
        log_path = self.log_dir / f"standby-{self._seq + 1}.log"
        try:
            process = self.spawner(list(self.argv), dict(self.env), log_path)
        except UnusableStandbyError as exc:
            self._disable(str(exc))
            return False
        if process is None:
            return False
        self._seq += 1
        self._waiting.append(_Standby(self._seq, process, log_path, started=self.clock()))
        self.emit("standby_started", pid=process.pid, log=str(log_path), forked=process.forked)
        return True

    def _reap(self) -> None:
        for standby in list(self._waiting):
            # poll() before the status read: a standby that wrote its status line and then
            # exited (an unusable one does exactly that) has the line in the pipe already, so
            # reading after poll() never mistakes "reported, then exited" for "died".
            code = standby.process.poll()
            if standby.state is StandbyState.STARTING:
                self._take_status(standby)
                if self.disabled is not None:
                    return
            if code is not None:
                self._waiting.remove(standby)
                standby.process.release()
                self._lost(standby, code)
        if self.disabled is None and self._lost_since_ready >= MAX_LOST_PER_SLOT * self.size:
            self._disable(f"{self._lost_since_ready} standbys exited before becoming ready (see {self.log_dir})")

    def _take_status(self, standby: _Standby) -> None:
        status = standby.process.status()
        if status is None:
            return
        if status.get("ok"):
            standby.state = StandbyState.READY
            self._lost_since_ready = 0
            self.emit("standby_ready", pid=standby.process.pid, prewarm_s=status.get("prewarm_s"),
                      wait_s=round(self.clock() - standby.started, 3))
        else:
            standby.state = StandbyState.UNUSABLE
            self._disable(f"standby {standby.process.pid} is unusable: {status.get('reason')}")

    def _lost(self, standby: _Standby, code: int | None) -> None:
        standby.state = StandbyState.LOST
        self._lost_since_ready += 1
        fields: dict[str, Any] = {"pid": standby.process.pid, "log": str(standby.log_path)}
        if code is not None and code < 0:
            fields["signal"] = signal.Signals(-code).name
        else:
            fields["exit_code"] = code
        self.emit("standby_lost", **fields)

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.emit("standby_disabled", reason=reason)
        self.close()
