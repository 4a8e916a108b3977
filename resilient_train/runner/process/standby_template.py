"""The standby template: one process imports TensorFlow once, then forks every warm standby.

A spawned standby (runner/process/warm_standby.py) imports TensorFlow, Keras, the loop and the recipe
itself: 3.5-5 CPU-seconds each. At idle priority on cores that the workers keep busy it gets
almost none of them, so a restart soon after the previous one was handed standbys still
importing (issue 45: kill -> first step ~2 s instead of ~0.8 s); at normal priority each
restart would take ~7 CPU-s from training. The template does the same ``prewarm`` once per
run, with the same eager-context check, and then a standby costs one ``fork()`` (10-50 ms):
a child of a process that ran no op starts with the eager context uninitialized, and forms
a MultiWorkerMirroredStrategy group like a spawned one (tests/supervisor/test_forked_standbys.py,
tests/integration/test_fast_recovery.py).

Protocol (cluster/template_wire.py has the messages):

    spawn   python -m resilient_train.runner.process.standby_template [--recipe R] [--priority idle|normal]
            RT_STANDBY_TEMPLATE_FD: its end of a SOCK_SEQPACKET socket pair with the supervisor
    warm    ``prewarm(R)`` (at idle priority: promoted to normal when a message arrives, the
            supervisor's ``hurry`` or a ``fork``); then ``ready`` (ok or the reason not).
            Not ok: the template exits; the supervisor disables its pool.
    serve   each ``fork`` (with the standby's stdin, log and status fds) -> one child, and the
            answer ``forked`` with its pid and a pidfd; each child that exits -> ``exited``
            with its pid and exit code, then SIGCHLD to the supervisor so its pause ends at
            once, as it does for its own children. EOF on the socket -> the template exits.
    child   the parent-death signal (SIGKILL when the template dies), the template's fds
            closed, fds 0/1/2 := stdin/log/log, then ``warm_standby.serve``: the same ready
            line, the same one assignment on stdin, runner.process.worker_main.main. It never returns
            into the template's loop (``os._exit``).

Why the template reaps its children and reports their exit codes, instead of a double fork
that reparents each child to the supervisor (PR_SET_CHILD_SUBREAPER): the subreaper would
adopt every orphan below the supervisor, and reaping those without ``waitpid(-1)`` (which
would steal the exit codes of the supervisor's own Popen children) needs a scan of
/proc; a parent-death signal set before the reparenting fires at the reparenting itself. The
template is the children's parent, so ``waitpid`` gives the real exit code (root cause and
EXIT_FATAL read it) and the parent-death chain holds: the supervisor dies -> the template
(its parent-death signal) -> every child (theirs). The price: a template that dies takes the
workers it forked with it (SIGKILL, reported as such); it runs nothing but this loop.
Signals go by pidfd (sent with ``forked``), so a pid reused after the template reaped it is
never signalled.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import select
import signal
import socket
import sys
import time
import traceback

from resilient_train.cluster import template_wire
from resilient_train.rundir.rescue_signal import RESCUE_SIGNAL
from resilient_train.runner.process import warm_standby

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    readable, _, _ = select.select([sock], [], [], timeout_s)
    return bool(readable)


def _prewarm(recipe: str | None, priority: str, sock: socket.socket) -> str | None:
    try:
        if priority == "idle":
            return warm_standby.run_at_low_priority(warm_standby.prewarm, recipe,
                                                    needed=lambda t: _readable(sock, t))
        return warm_standby.prewarm(recipe)
    except Exception as exc:  # a recipe that fails to import: the worker will report it properly
        print(f"resilient-train standby template: pre-warm of {recipe}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return warm_standby._context_problem()


def _discard(message: tuple[dict, list[int]] | None) -> bool:
    """Close a message's fds; False at EOF."""
    if message is None:
        return False
    for fd in message[1]:
        os.close(fd)
    return True


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the template died before the signal was set
        os._exit(1)


def _child(fds: list[int], template: int, own: list[int]) -> None:
    """The forked standby; never returns."""
    code = 1
    try:
        _die_with_parent(template)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own:
            os.close(fd)
        stdin_fd, log_fd, status_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(stdin_fd)
        os.close(log_fd)
        code = warm_standby.serve(status_fd, 0.0)
    except BaseException:
        traceback.print_exc()
    finally:
        from resilient_train.runner.process.bootstrap import exit_process

        exit_process(code)


def _fork(sock: socket.socket, fds: list[int], own: list[int]) -> None:
    if len(fds) != template_wire.FORK_FDS:
        for fd in fds:
            os.close(fd)
        print(f"resilient-train standby template: a fork request with {len(fds)} fds", file=sys.stderr)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    template = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(fds, template, own)
    for fd in fds:
        os.close(fd)
    pidfds: list[int] = []
    try:
        pidfds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        pass  # no pidfds here: the supervisor signals by pid
    try:
        template_wire.send(sock, {"kind": "forked", "pid": pid}, pidfds)
    finally:
        for fd in pidfds:
            os.close(fd)


def _reap(sock: socket.socket) -> None:
    reported = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        template_wire.send(sock, {"kind": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
        reported = True
    if reported:
        try:
            os.kill(os.getppid(), signal.SIGCHLD)  # the supervisor's pause ends on it (supervisor/signals.py)
        except OSError:
            pass


def serve(sock: socket.socket) -> int:
    """Fork on request and report exits until the supervisor closes the socket."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # its wake-up byte is what matters
    own = [sock.fileno(), wake_r, wake_w]
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(sock)
        if sock in readable:
            message = template_wire.receive(sock)
            if message is None:
                return 0  # the supervisor closed or died: the children follow (parent-death signal)
            record, fds = message
            if record.get("kind") == "fork":
                _fork(sock, fds, own)
            else:
                for fd in fds:
                    os.close(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner.process.standby_template", allow_abbrev=False)
    parser.add_argument("--recipe", help="recipe to import ahead (its imports only)")
    parser.add_argument("--priority", choices=("idle", "normal"), default="normal",
                        help="the import's priority (idle: promoted when the first request arrives)")
    args = parser.parse_args(argv)
    signal.signal(RESCUE_SIGNAL, signal.SIG_IGN)  # the children inherit it (see warm_standby.main)
    sock = socket.socket(fileno=int(os.environ.pop(template_wire.TEMPLATE_FD)))
    started = time.monotonic()
    problem = _prewarm(args.recipe, args.priority, sock)
    if problem is not None:
        print(f"resilient-train standby template: unusable: {problem}", file=sys.stderr)
        template_wire.send(sock, {"kind": "ready", "ok": False, "pid": os.getpid(), "reason": problem})
        # Until the supervisor closes: leaving with its messages unread would reset the socket
        # (ECONNRESET) before the supervisor read this answer.
        while _discard(template_wire.receive(sock)):
            pass
        return 0
    # What the imports allocated is never collected: a child's first collection would scan it
    # (0.15 s; the worker freezes it too) and touch its pages, which fork shares copy-on-write.
    gc.freeze()
    template_wire.send(sock, {"kind": "ready", "ok": True, "pid": os.getpid(),
                              "prewarm_s": round(time.monotonic() - started, 3)})
    return serve(sock)


if __name__ == "__main__":
    from resilient_train.runner.process.bootstrap import exit_process

    exit_process(main(sys.argv[1:]))
