"""The start-up and the exit every process of a run shares, defined once.

Two kinds of process run a job's training: a MultiWorkerMirroredStrategy worker
(runner/process/worker_main.py) and the parameter-server tier's coordinator, parameter servers and
workers (runner/process/ps_roles.py). Each first works out who it is (its own TF_CONFIG reading),
then :func:`worker_process` makes it a process of the run, in this order:

1. the job's real storage credentials from ``RT_STORAGE_SECRETS`` (job.json holds ``***``),
   registered so that nothing written or printed shows them (rundir/redact.py);
2. the run dir's umask (``RT_UMASK``), also on a node that did not inherit it;
3. ``attempt-<n>/`` created, and this process's own temp dir (``local/rank-<rank>/tmp``,
   rundir/scratch.py) made Python's and ``TMPDIR``;
4. the error file located (``Recording.locate``): from here on an exception that ends the
   process is written to ``attempt-<n>/error-<rank>.json`` (before, it is a usage error:
   one line, exit 2);
5. SIGUSR1 dumps every thread's stack into ``attempt-<n>/stacks-<rank>.txt`` (what the
   supervisor's hang watchdog asks for before it kills a group);
6. events go to the run's events.jsonl and stderr, bound to run_id, attempt, rank, role;
7. SIGTERM and SIGINT set :attr:`WorkerProcess.stop` (save at an agreed step and stop,
   never ``KeyboardInterrupt``);
8. with the memory tier on (``--snapshot-every``), SIGUSR2 (a rescue request) is received
   by a daemon thread (rundir/rescue_signal.py), before the supervisor can send it;
9. with ``watch_notices`` (an MWMS worker), this node's cloud preemption notices set
   ``stop`` too (runner/process/preemption_notices.py; ``--preemption-notice``): a background
   thread, started here, that never blocks this one.

On leaving the block (by any path) what the body entered into ``until_exit`` is closed
(the chief's stdout tee, whose last line becomes an event): before ``recording`` records an
exception, and before :func:`exit_process`, the one exit of every process of a run (each
entry point's ``__main__``, the parameter-server coordinator's too). The temp dir is removed
by :func:`exit_process`, never here: an error's ``on_failure`` still runs TensorFlow after the block.

No TensorFlow here: a parameter server imports it only to serve.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import IO, Iterator, Mapping, NoReturn

from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.job.config import JobConfig
from resilient_train.rundir import events
from resilient_train.rundir.errorfile import Recording
from resilient_train.rundir.layout import AttemptDir, RunDir
from resilient_train.rundir.permissions import current_umask
from resilient_train.rundir.redact import register_secrets, secret_values
from resilient_train.rundir.rescue_signal import install as install_rescue_listener
from resilient_train.rundir.scratch import remove_private_tempdir, use_private_tempdir
from resilient_train.rundir.stacks import register as register_stacks
from resilient_train.runner.process.preemption_notices import NoticeStop

__all__ = ["WorkerProcess", "worker_process", "exit_process"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class WorkerProcess:
    """One process of the run, started: who it is, where it writes, its stop request.

    ``job`` carries the real storage credentials. ``stop`` is set by SIGTERM or SIGINT, and
    by a preemption notice (``notices``).
    ``until_exit``: contexts that last until the process leaves its :func:`worker_process`
    block.
    """

    job: JobConfig
    launched: WorkerEnvironment
    run_dir: RunDir
    attempt_dir: AttemptDir
    rank: int
    role: str
    stop: threading.Event
    until_exit: contextlib.ExitStack
    stacks_file: IO[str]  # kept open: faulthandler writes the SIGUSR1 dumps into it
    notices: NoticeStop | None = None  # this node's preemption notices (watch_notices)

    def watch_stop_signals(self) -> None:
        """SIGTERM and SIGINT set ``stop`` (again: TensorFlow's coordination service installs
        its own C++ SIGTERM handler when a multi-worker strategy starts, replacing this one).

        SIGINT too: Ctrl-C in a terminal reaches the whole process group, workers included;
        it must mean "save at an agreed step and stop", not KeyboardInterrupt."""
        for sig in _STOP_SIGNALS:
            signal.signal(sig, lambda signum, frame: self.stop.set())

    def ignore_stop_signals(self) -> None:
        """Done (or saved for preemption): a late SIGTERM must not turn a clean exit into a
        death by signal while TensorFlow tears down."""
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def worker_process(state: Recording, job: JobConfig, *, rank: int, role: str, writes_group_events: bool,
                   environ: Mapping[str, str], watch_notices: bool = False) -> Iterator[WorkerProcess]:
    """Start this process as rank ``rank`` (``role``) of ``job``'s run (the steps in the
    module docstring), inside ``recording``'s ``state``; yield it.

    ``writes_group_events``: this process is the one that writes the group's events (the
    chief, the coordinator). ``environ``: where the ``RT_*`` variables are read (and the
    metadata endpoint overrides). ``watch_notices``: watch this node's preemption notices
    (``job.preemption_notice``).
    """
    launched = WorkerEnvironment.from_environ(environ)
    job = job.with_secrets(launched.storage_secrets)
    register_secrets(secret_values(job.secrets()))
    if launched.umask is not None:
        os.umask(current_umask() | launched.umask)
    run_dir = RunDir(job.run_dir)
    attempt_dir = run_dir.attempt(launched.attempt)
    attempt_dir.path.mkdir(parents=True, exist_ok=True)
    use_private_tempdir(run_dir.temp_dir(rank))  # autograph's files (rundir/scratch.py)
    state.locate(attempt_dir.path, rank)  # from here on, failures are recorded
    stacks_file = register_stacks(attempt_dir.stacks(rank), rank=rank)
    events.configure(run_dir.events, console=sys.stderr, writes_group_events=writes_group_events,
                     run_id=launched.run_id, attempt=launched.attempt, rank=rank, role=role)
    with contextlib.ExitStack() as until_exit:
        stop = threading.Event()
        notices = None
        if watch_notices:
            notices = NoticeStop(job.preemption_notice, environ, attempt_dir=attempt_dir, rank=rank, stop=stop.set)
            until_exit.callback(notices.close)
        process = WorkerProcess(job=job, launched=launched, run_dir=run_dir, attempt_dir=attempt_dir, rank=rank,
                                role=role, stop=stop, until_exit=until_exit, stacks_file=stacks_file,
                                notices=notices)
        process.watch_stop_signals()
        if job.memory_tier:  # the memory tier: a survivor may be asked to rescue
            install_rescue_listener()
        if notices is not None:
            notices.start()
        yield process


def exit_process(code: int) -> NoReturn:
    """Leave now with ``code``, skipping interpreter and TensorFlow teardown.

    Everything a worker promises is on disk before ``main`` returns (checkpoints committed
    and flushed, events appended with one write each). TensorFlow's teardown adds seconds
    (the multi-worker coordination service waits at a shutdown barrier for its peers) and a
    signal landing in it turns a clean exit into a death by signal.
    """
    remove_private_tempdir()  # the atexit handlers that would have removed its files never run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
