"""The attempt's processes as the supervisor loop controls them: poll, signal, kill, wait.

One :class:`WorkerGroup` per run holds the attempt under way (``current``, replaced by each
STARTING) and is the loop's only hand on its processes: every poll prints new events, lets
the launcher work (refill standbys, bring dumps back) and reaps exits (``worker_exited``,
``worker_failed`` / ``worker_preempted``); every signal, kill and wait goes through it. It
is also what a topology's hooks act on (supervisor/topology.py ``Group``), and where the
run's stop request is turned from the launcher's into the run's.

Clock and sleep are injected (tests drive the loop with a fake clock); the sleep between
polls is the signal installer's pause, which a child's exit ends early (signals.py).
"""

from __future__ import annotations

import signal
from typing import Any, Callable

from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import emit
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor.attempt import Attempt, Worker
from resilient_train.supervisor.launchers import Launcher
from resilient_train.supervisor.policy import classify
from resilient_train.supervisor.signals import StopRequest
from resilient_train.supervisor.state import WorkerState
from resilient_train.supervisor.topology import POLL_S

__all__ = ["WorkerGroup"]


class WorkerGroup:
    """The processes of the attempt under way (see the module docstring); a ``topology.Group``."""

    def __init__(
        self,
        job: JobConfig,
        launcher: Launcher,
        run_dir: RunDir,
        stop: StopRequest,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        teardown_grace_s: float,
        pump: Callable[[], list[dict[str, Any]]],
        completed: Callable[[], bool],
    ) -> None:
        """``pump()``: print new events.jsonl lines, returning them; ``completed()``: storage
        holds the run's completed checkpoint."""
        self.job = job
        self.launcher = launcher
        self.run_dir = run_dir
        self.stop = stop
        self.clock = clock
        self.sleep = sleep
        self.teardown_grace_s = teardown_grace_s
        self.current: Attempt | None = None  # the attempt started last; the next one replaces it
        self._pump = pump
        self.completed = completed

    @property
    def workers(self) -> list[Worker]:
        """The workers of the attempt started last (none before the first)."""
        return self.current.workers if self.current is not None else []

    def poll(self) -> None:
        """One poll of the attempt: print new events, let the launcher work, reap exits."""
        records = self._pump()
        if self.current is not None and self.current.rescue is not None:
            self.current.rescue.observe(records)
        self.launcher.maintain(training=self.training())
        for worker in self.workers:
            if worker.returncode is None:
                code = worker.process.poll()
                if code is not None:
                    self._exited(worker, code)

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.returncode is None]

    def pause(self) -> None:
        self.sleep(POLL_S)
        self.poll()

    def sleep_fully(self, seconds: float) -> None:
        """Sleep ``seconds`` even where a pause ends early (a child's exit, signals.py)."""
        deadline = self.clock() + seconds
        while (left := deadline - self.clock()) > 0:
            self.sleep(left)

    def wait(self, done: Callable[[], bool], timeout_s: float | None) -> None:
        """Poll until ``done()`` or ``timeout_s`` passed (None: until ``done()``)."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        while not done() and (deadline is None or self.clock() < deadline):
            self.sleep(POLL_S)
            self.poll()

    def kill(self, worker: Worker) -> None:
        worker.state = WorkerState.KILLED
        self.send_signal(worker, signal.SIGKILL)

    def send_signal(self, worker: Worker, sig: int) -> None:
        """Send ``sig`` to ``worker``; one that is already gone is no error."""
        try:
            worker.process.send_signal(sig)
        except ProcessLookupError:
            pass

    def check_launcher_stop(self) -> None:
        if self.stop.source is None and self.launcher.stop_requested():
            self.stop.request(f"launcher:{self.launcher.name}")
            emit("preemption_requested", source=self.stop.source)

    def training(self) -> bool:
        """The chief finished a step of this attempt (its step marker is written)."""
        if self.current is None or not any(w.rank == 0 for w in self.workers):
            return False
        try:
            return self.run_dir.attempt(self.current.number).step_marker(0).stat().st_size > 0
        except OSError:
            return False

    def _exited(self, worker: Worker, code: int) -> None:
        worker.returncode = code
        worker.exit_time = self.clock()
        if worker.state is WorkerState.RUNNING:
            worker.state = WorkerState.EXITED
        fields: dict[str, Any] = {"rank": worker.rank, "pid": worker.process.pid, "attempt": worker.attempt}
        if code < 0:
            fields["signal"] = signal.Signals(-code).name
        else:
            fields["exit_code"] = code
        lost = self.launcher.lost_reason(worker.process)
        if lost is not None:  # e.g. "node lost": the launcher knows better than the exit code
            fields["reason"] = lost
        emit("worker_exited", **fields, state=worker.state.value)
        if code not in (EXIT_OK,):
            emit(
                "worker_failed" if code != EXIT_PREEMPTED else "worker_preempted",
                **fields,
                classification=classify(code).value,
            )
