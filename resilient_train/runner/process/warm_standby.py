"""A warm standby worker: TensorFlow already imported, waiting for its TF_CONFIG.

A cold worker spends most of its start-up importing TensorFlow and Keras (2.7-4 s on an
idle 2-core machine, 8-12 s under load). None of that depends on who the worker will be, so
the supervisor keeps processes that have done it waiting (supervisor/standby_pool.py); a restart
hands each one an assignment instead of spawning a cold process, and the process then runs
the ordinary worker main (runner/process/worker_main.py) with the assignment's environment. The worker
never knows the difference: same argv, same environment, same log file, same pid for its
whole life. Standbys are normally forked from one template process that did the imports once
(runner/process/standby_template.py), and run ``serve`` from there; this module's ``main``, a standby
that imports for itself, is the fallback once the template is lost.

What is safe to do before TF_CONFIG is known (measured with TF 2.21 / Keras 3, CPU; see
``prewarm`` and tests/supervisor/test_standby_process.py):

* safe: ``import tensorflow, keras, numpy``, importing ``resilient_train.runner.training.loop`` (the
  Trainer) and the checkpoint store, loading the recipe module (its imports),
  ``tf.config.list_physical_devices()``. None of these creates the eager context, and a
  MultiWorkerMirroredStrategy created afterwards works.
* NOT safe: anything that runs an op or creates a tensor (``tf.constant(1.0)``, building a
  model, ``keras.utils.set_random_seed``...). The first op initializes the eager context,
  and MWMS then fails with ``RuntimeError: Collective ops must be configured at program
  startup`` (the seeds' warning, reproduced). So the standby stops at imports, and it checks
  the eager context is still uninitialized afterwards: a recipe whose module body runs an op
  makes the standby report itself unusable (``ready`` with ``ok: false``) and the supervisor
  falls back to cold workers instead of starting a group that cannot form.
* environment read at import time (``TF_CPP_MIN_LOG_LEVEL``) is fixed when the standby is
  spawned; the supervisor gives standbys the environment a cold worker would get, minus the
  per-attempt keys. Per-rank ``CUDA_VISIBLE_DEVICES`` (``--gpus-per-worker``) is not handed
  over late: the supervisor does not use standbys with GPUs.

Protocol (one process, one assignment):

    spawn   python -m resilient_train.runner.process.warm_standby [--recipe R]
            stdin: a pipe from the supervisor; stdout/stderr: the standby's own log;
            RT_STANDBY_READY_FD: the write end of a pipe for one status line
    warm    imports; then one JSON line on the status pipe:
            {"ok": true, "pid": ..., "prewarm_s": ...} or {"ok": false, "reason": "..."}
    wait    blocks reading one JSON line on stdin:
            {"argv": [...worker argv...], "env": {...}, "log": "<worker log path>"}
            EOF instead (the supervisor closed the pipe or died) -> exit 0, nothing done
    run     os.environ := env, stdout/stderr := the worker log (dup2), stdin := /dev/null,
            exit with runner.process.worker_main.main(argv)

The parent-death signal set by the supervisor's spawner survives all of this (it is a
property of the process), so a standby never outlives the supervisor either.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any, Callable, TextIO

from resilient_train.cluster.environment import STANDBY_READY_FD
from resilient_train.rundir.rescue_signal import RESCUE_SIGNAL

__all__ = ["main", "prewarm", "run_at_low_priority", "serve"]

PREWARM_NICE = 19  # the import thread's nice value where SCHED_IDLE is not available
_NEEDED_POLL_S = 0.05  # how often a standby still importing looks for its assignment


def prewarm(recipe: str | None) -> str | None:
    """Import everything a worker imports before its strategy exists.

    Returns None when the process is still fit to become a worker, else the reason it is not.
    """
    import keras  # noqa: F401
    import numpy  # noqa: F401
    import tensorflow as tf

    import resilient_train.checkpoint  # noqa: F401
    import resilient_train.runner.training.loop  # noqa: F401  (the Trainer; imports TF and Keras)
    import resilient_train.runner.process.worker_main  # noqa: F401

    if recipe:
        from resilient_train.job.recipe import is_fit_script, load_recipe

        # A model.fit script is not imported: importing it runs it (runner/keras_recipes/fitscript.py).
        if not is_fit_script(recipe):
            loaded = load_recipe(recipe)  # its imports; worker.main loads it again (cheap, same result)
            from resilient_train.runner.input.batches import preconvert

            preconvert(loaded.loss, loaded.metrics)  # AutoGraph's first conversions, off the restart's trace
    tf.config.list_physical_devices()  # safe: does not create the eager context
    return _context_problem()


def run_at_low_priority(fn: Callable[..., Any], *args: Any,
                        needed: Callable[[float], bool] | None = None) -> Any:
    """``fn(*args)`` on a helper thread at idle priority; its result or exception.

    Standbys import TensorFlow (seconds of CPU each) while the first attempt trains on the
    same cores. Linux nice values are per thread, so only the importing thread is demoted:
    the main thread, which later becomes the worker, keeps its priority (an unprivileged
    process could not raise a lowered process priority back).

    ``needed(timeout_s)``: True once the work is wanted now (a standby's assignment came
    while it was still importing): the work is promoted back to normal priority for the
    rest of it. Found on 2 cores: two workers training flat out left the idle-priority
    imports no CPU at all, so a restart 15 s later was handed standbys still importing, and
    on a machine with other load their imports then went on at idle priority, on the
    restart's path (goodput 0.70 under load 5, standstill 2.7-5.4 s a kill).
    """
    outcome: dict[str, Any] = {}

    def demoted() -> None:
        _demote_this_thread()
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # re-raised on the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=demoted, name="rt-standby-prewarm")
    thread.start()
    while needed is not None and thread.is_alive():
        if needed(_NEEDED_POLL_S):
            _promote_leftover_threads()  # the importing thread and what it started
            break
    thread.join()
    _promote_leftover_threads()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _demote_this_thread() -> None:
    """SCHED_IDLE for the calling thread (and the threads it starts): it runs only on a CPU
    no normal thread wants and yields at once when one wakes. nice 19 was not enough: it
    still takes a share of a busy CPU, and training's threads, which sleep and wake many
    times per step (collectives), waited behind it (measured: 0.82x of the same run without
    standbys). Where SCHED_IDLE is unavailable, nice PREWARM_NICE."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread (Linux)
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREWARM_NICE)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: import at normal priority


def _promote_leftover_threads() -> None:
    """Threads the import started and left running (TensorFlow starts a few) inherited the
    idle policy; the worker this process becomes must not depend on idle-priority threads,
    so put them back to SCHED_OTHER. Where that is not permitted (an unprivileged process
    whose RLIMIT_NICE forbids it) they stay idle, as nice-19 threads stayed nice 19 before."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return  # not Linux
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except (AttributeError, OSError):
            pass  # gone meanwhile, or not permitted


def _assignment_waiting(timeout_s: float) -> bool:
    """Is something to read on stdin (an assignment, or EOF: released) within ``timeout_s``?"""
    try:
        readable, _, _ = select.select([sys.stdin], [], [], timeout_s)
    except (OSError, ValueError):  # no usable stdin: never promoted early
        time.sleep(timeout_s)
        return False
    return bool(readable)


def _context_problem() -> str | None:
    from tensorflow.python.eager import context

    if context.context()._context_handle is not None:
        return (
            "the eager context was initialized during pre-warm (an op ran before the strategy "
            "exists); MultiWorkerMirroredStrategy would fail with 'Collective ops must be "
            "configured at program startup'"
        )
    return None


def _report(fd: int | None, record: dict[str, Any]) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    except OSError:
        pass  # the supervisor stopped listening; reading stdin will tell us more
    finally:
        os.close(fd)


def _become_worker(assignment: dict[str, Any], stdin: TextIO) -> int:
    from resilient_train.runner.process import startup_phases

    startup_phases.mark("assigned")  # the restart's breakdown counts from here (startup_phases.py)
    argv = [str(a) for a in assignment["argv"]]
    env = {str(k): str(v) for k, v in assignment["env"].items()}
    log_path = str(assignment["log"])
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask decides
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    stdin.close()
    os.environ.clear()
    os.environ.update(env)
    from resilient_train.runner.process.worker_main import main as worker_main

    return worker_main(argv, environ=os.environ)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner.process.warm_standby", allow_abbrev=False)
    parser.add_argument("--recipe", help="recipe to import ahead (its imports only)")
    args = parser.parse_args(argv)
    # A rescue request (SIGUSR2, rundir/rescue_signal.py) that reaches a standby being handed
    # over, before its worker start-up installs the listener, must not kill it (the default action).
    signal.signal(RESCUE_SIGNAL, signal.SIG_IGN)
    ready_fd = int(os.environ[STANDBY_READY_FD]) if os.environ.get(STANDBY_READY_FD) else None
    started = time.monotonic()
    assigned_at: list[float] = []  # when the assignment came, if the import was still running

    def needed(timeout_s: float) -> bool:
        if _assignment_waiting(timeout_s):
            assigned_at.append(time.time())
            return True
        return False

    try:
        problem = run_at_low_priority(prewarm, args.recipe, needed=needed)
    except Exception as exc:  # a recipe that fails to import: the worker will report it properly
        problem = _context_problem()
        print(f"resilient-train standby: pre-warm of {args.recipe}: {type(exc).__name__}: {exc}", file=sys.stderr)
    if problem is not None:
        print(f"resilient-train standby: unusable: {problem}", file=sys.stderr)
        _report(ready_fd, {"ok": False, "pid": os.getpid(), "reason": problem})
        return 0
    if assigned_at:  # handed over while importing: the rest of the import is the restart's
        from resilient_train.runner.process import startup_phases

        startup_phases.mark("assigned", at=assigned_at[0])
        startup_phases.mark("standby_import")
    return serve(ready_fd, round(time.monotonic() - started, 3))


def serve(ready_fd: int | None, prewarm_s: float) -> int:
    """Say ready on ``ready_fd``, wait for the one assignment on stdin, become the worker.

    The second half of every standby's life, spawned (``main``) or forked from the standby
    template (runner/process/standby_template.py); the exit code of the worker it became, or 0 when
    released unused.
    """
    _report(ready_fd, {"ok": True, "pid": os.getpid(), "prewarm_s": prewarm_s})
    stdin = sys.stdin
    line = stdin.readline()
    if not line.strip():
        return 0  # released unused
    return _become_worker(json.loads(line), stdin)


if __name__ == "__main__":
    from resilient_train.runner.process.bootstrap import exit_process

    exit_process(main(sys.argv[1:]))
