"""Warm standbys forked from one template process instead of each importing TensorFlow.

The pool (supervisor/standby_pool.py) asks a ``StandbySpawner`` for each standby. This one
starts one template (runner/process/standby_template.py, at the first attempt's start: it replaces
the pool's N imports by one) and, once it is ready, has it fork each standby: a refill costs
a fork (10-50 ms) instead of 3.5-5 CPU-s that, at idle priority on busy cores, often had not
finished by the next restart (docs/checkpointing.md, "Fast recovery").

The supervisor's side of each standby is what it is for a spawned one: it creates the
standby's stdin and status pipes and opens its log, and passes those fds to the template
with the fork request (SCM_RIGHTS, cluster/template_wire.py). So the pipes, the log's
ownership and mode, and every error opening them stay on the supervisor's side, exactly as
for ``subprocess.Popen``, and the template needs no access to the run dir.

The template is the children's parent (runner/process/standby_template.py says why, rather than a
double fork under a subreaper): it reaps each one and reports its real exit code, which
``ForkedStandby.poll`` returns; signals go through the pidfd the template sent with the
pid (a reaped pid may be reused, a pidfd never is). Nothing outlives the supervisor: the
template has the parent-death signal like every child of the supervisor, its children
theirs towards the template.

Fallbacks, each visible in events (docs/events.md):

* the template is still importing: ``__call__`` returns None and the pool asks again at its
  next poll (after telling an idle-priority template to hurry). Spawned standbys beside it
  would import the same modules again and, on busy cores, still be importing at the next
  restart; the template is seconds from ready.
* the template said it is unusable (its pre-warm ran an op): UnusableStandbyError, and the
  pool disables itself (``standby_disabled``), as for a spawned standby.
* the template exited (``standby_template_lost``): standbys are spawned, each importing
  (``PopenStandby``, ``standby_started.forked: false``), for the rest of the run.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from resilient_train.cluster import template_wire
from resilient_train.rundir import events
from resilient_train.supervisor._process import die_with_parent_hook
from resilient_train.supervisor.standby_pool import PopenStandby, StatusPipe, UnusableStandbyError

__all__ = ["ForkServerSpawner", "ForkedStandby", "StandbyTemplate", "TemplateState", "FORK_ANSWER_S"]

# How long the supervisor waits for the template's answer to a fork request (its answer
# takes 10-50 ms; a template that does not answer in this time is treated as lost).
FORK_ANSWER_S = 10.0


class TemplateState(str, Enum):
    """The template's life. Transitions:

    IMPORTING -> READY      its ready message said ok
    IMPORTING -> UNUSABLE   its ready message said not ok (the pool disables itself)
    IMPORTING|READY -> LOST it exited, closed its socket or stopped answering
    """

    IMPORTING = "importing"
    READY = "ready"
    UNUSABLE = "unusable"
    LOST = "lost"


class StandbyTemplate:
    """The template process and the supervisor's end of its socket."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, *,
                 emit: Callable[..., None] = events.emit, clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.clock = clock
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with open(log_path, "ab") as log:
                self.popen = subprocess.Popen(
                    argv,
                    env={**env, template_wire.TEMPLATE_FD: str(theirs.fileno())},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    preexec_fn=die_with_parent_hook(),
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock: socket.socket | None = ours
        self.pid = self.popen.pid
        self.state = TemplateState.IMPORTING
        self.reason: str | None = None  # why UNUSABLE
        self.exits: dict[int, int] = {}  # pid -> exit code, as the template reported them
        self._started = clock()
        self._hurried = False
        self._answers: list[tuple[int, int | None]] = []  # forked answers not yet taken: (pid, pidfd)
        emit("standby_template_started", pid=self.pid, log=str(log_path))

    # ------------------------------------------------------------ messages
    def pump(self) -> None:
        """Take in every message already there (non-blocking); notice a lost template."""
        while self.sock is not None:
            try:
                message = template_wire.receive(self.sock)
            except BlockingIOError:
                break
            except ConnectionResetError:
                continue  # the template left with messages of ours unread: its own are still queued
            except OSError:
                message = None
            if message is None:
                self._lose("its socket closed")
                break
            self._take(*message)
        if self.state in (TemplateState.IMPORTING, TemplateState.READY) and self.popen.poll() is not None:
            self._lose("it exited")

    def _take(self, record: dict[str, Any], fds: list[int]) -> None:
        """One message; a ``forked`` answer (and its pidfd) waits in ``_answers`` for ``fork``."""
        kind = record.get("kind")
        if kind == "exited":
            self.exits[int(record["pid"])] = int(record["code"])
        elif kind == "ready" and self.state is TemplateState.IMPORTING:
            if record.get("ok"):
                self.state = TemplateState.READY
                self.emit("standby_template_ready", pid=self.pid, prewarm_s=record.get("prewarm_s"),
                          wait_s=round(self.clock() - self._started, 3))
            else:
                self.state = TemplateState.UNUSABLE
                self.reason = str(record.get("reason"))
        elif kind == "forked":
            self._answers.append((int(record["pid"]), fds.pop(0) if fds else None))
        for fd in fds:
            os.close(fd)

    def wait_ready(self, timeout_s: float) -> None:
        """Block while the template imports, at most ``timeout_s`` (hurrying an idle-priority one)."""
        deadline = self.clock() + timeout_s
        self.pump()
        if self.state is TemplateState.IMPORTING:
            self.hurry()
        while self.state is TemplateState.IMPORTING and self.sock is not None:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            select.select([self.sock], [], [], min(remaining, 0.5))
            self.pump()

    def hurry(self) -> None:
        """Ask an idle-priority import to go on at normal priority (once)."""
        if self._hurried or self.sock is None:
            return
        self._hurried = True
        try:
            template_wire.send(self.sock, {"kind": "hurry"})
        except OSError:
            self.pump()

    def fork(self, stdin_fd: int, log_fd: int, status_fd: int) -> tuple[int, int | None] | None:
        """A new child with these fds as its stdin, log and status: (pid, pidfd), or None (lost)."""
        if self.sock is None or self.state is not TemplateState.READY:
            return None
        self._answers = []
        try:
            template_wire.send(self.sock, {"kind": "fork"}, [stdin_fd, log_fd, status_fd])
        except OSError:
            self._lose("it stopped reading its socket")
            return None
        deadline = self.clock() + FORK_ANSWER_S
        while not self._answers and self.sock is not None:
            remaining = deadline - self.clock()
            if remaining <= 0:
                self._lose(f"no answer to a fork request within {FORK_ANSWER_S} s")
                return None
            select.select([self.sock], [], [], remaining)
            self.pump()
        return self._answers.pop(0) if self._answers else None

    def wait_for_exit(self, pid: int) -> None:
        """Block until the template reported ``pid``'s exit, or is gone."""
        while pid not in self.exits and self.sock is not None:
            select.select([self.sock], [], [], 0.5)
            self.pump()

    # ------------------------------------------------------------ its end
    def _lose(self, why: str) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.state in (TemplateState.IMPORTING, TemplateState.READY):
            self.state = TemplateState.LOST
            if self.popen.poll() is None:  # alive but useless: its children die with it
                self.popen.kill()
            code = self.popen.wait()
            fields: dict[str, Any] = {"pid": self.pid, "log": str(self.log_path), "reason": why}
            if code < 0:
                fields["signal"] = signal.Signals(-code).name
            else:
                fields["exit_code"] = code
            self.emit("standby_template_lost", **fields)

    def close(self) -> None:
        """Close the socket (the template exits on EOF, its children with it) and reap it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


class ForkedStandby(StatusPipe):
    """A standby forked by the template: a ``StandbyProcess`` and, once assigned, a worker handle."""

    forked = True

    def __init__(self, template: StandbyTemplate, pid: int, pidfd: int | None, stdin_fd: int, status_fd: int) -> None:
        super().__init__(status_fd)
        self.template = template
        self.pid = pid
        self._pidfd = pidfd
        self._stdin: int | None = stdin_fd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.template.pump()
            if self.pid in self.template.exits:
                self.returncode = self.template.exits.pop(self.pid)
                self._close_pidfd()
            elif self.template.sock is None and not self._alive():
                # The template is gone without reporting it: its death's signal killed it.
                self.returncode = -signal.SIGKILL
                self._close_pidfd()
        return self.returncode

    def _alive(self) -> bool:
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], 0)  # readable once it exited
            return not readable
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass  # exited; its report is on the way

    def assign(self, assignment: dict[str, Any]) -> bool:
        """Write the assignment; False when the process is already gone."""
        self._close_status()
        if self._stdin is None or self.poll() is not None:
            return False
        try:
            os.write(self._stdin, (json.dumps(assignment) + "\n").encode())
        except OSError:
            return False
        finally:
            self._close_stdin()
        return True

    def release(self) -> None:
        self._close_status()
        self._close_stdin()
        if self.poll() is None:
            self.send_signal(signal.SIGKILL)
            self.template.wait_for_exit(self.pid)
            self.poll()

    def _close_stdin(self) -> None:
        if self._stdin is not None:
            os.close(self._stdin)
            self._stdin = None

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class ForkServerSpawner:
    """A ``StandbySpawner``: forks from the template while it lives, spawns once it is lost.

    ``template_argv``/``env`` start the template; ``start()`` starts it (the launcher, with
    the first attempt), ``close()`` ends it after the pool released its standbys.
    """

    def __init__(self, template_argv: list[str], env: dict[str, str], log_path: Path, *,
                 emit: Callable[..., None] = events.emit) -> None:
        self.template_argv = list(template_argv)
        self.env = dict(env)
        self.log_path = log_path
        self.emit = emit
        self.template: StandbyTemplate | None = None

    def start(self) -> None:
        if self.template is None:
            self._start()

    def _start(self) -> StandbyTemplate:
        self.template = StandbyTemplate(self.template_argv, self.env, self.log_path, emit=self.emit)
        return self.template

    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> PopenStandby | ForkedStandby | None:
        template = self.template or self._start()
        template.pump()
        if template.state is TemplateState.UNUSABLE:
            template.close()
            raise UnusableStandbyError(f"the standby template {template.pid} is unusable: {template.reason}")
        if template.state is TemplateState.IMPORTING:
            template.hurry()
            return None
        if template.state is TemplateState.READY:
            forked = self._fork(template, log_path)
            if forked is not None:
                return forked
        return PopenStandby(argv, env, log_path)  # the template is lost: today's spawned standby

    def _fork(self, template: StandbyTemplate, log_path: Path) -> ForkedStandby | None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        stdin_r, stdin_w = os.pipe()
        status_r, status_w = os.pipe()
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            answer = template.fork(stdin_r, log_fd, status_w)
        finally:
            for fd in (stdin_r, log_fd, status_w):  # the child has its own copies now
                os.close(fd)
        if answer is None:
            os.close(stdin_w)
            os.close(status_r)
            return None
        pid, pidfd = answer
        return ForkedStandby(template, pid, pidfd, stdin_w, status_r)

    def close(self) -> None:
        if self.template is not None:
            self.template.close()
