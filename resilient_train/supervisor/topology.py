"""What differs between the tiers one supervisor loop runs: a topology, its hooks and their contracts.

The loop (supervisor/supervisor.py) is the same for every tier: run id, lock, storage
ownership, generation fence, attempts, restart budget and backoff, root cause, exit codes,
events, summary. What a tier decides differently is a :class:`Topology`, in the manner of
torch elastic's ``SimpleElasticAgent`` (hooks declared as abstract methods, each with its
contract): which processes an attempt starts, which of them the hang watchdog reads, when
RUNNING ends, how STOPPING tears the group down, when an attempt finished the run. Two
exist: :class:`GangTopology` here (MultiWorkerMirroredStrategy: every process a peer in the
collectives, so any death is the group's) and the parameter-server tier's
(supervisor/ps_supervisor.py: per-role failures, restart in place).

A hook acts on the attempt only through :class:`Group`, the loop's small control surface
(signals, waits, the stop request), and never changes the run state itself: it returns
what the loop should do, and the loop makes the one transition.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from typing import Any, Callable, Literal, Protocol

from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig
from resilient_train.supervisor.attempt import Attempt, Stop, StopCause, Worker
from resilient_train.supervisor.rescue import nothing_left_to_commit
from resilient_train.supervisor.signals import StopRequest
from resilient_train.supervisor.state import RunState

__all__ = ["Group", "Topology", "GangTopology", "Ending", "POLL_S"]

POLL_S = 0.05  # the loop's poll interval (Group.pause)

# What ``running_ends`` returns: the run is complete (SUCCEEDED), the attempt must stop (a Stop,
# which STOPPING carries), or None while it goes on.
Ending = Stop | Literal[RunState.SUCCEEDED] | None


class Group(Protocol):
    """The loop's control of the attempt under way, as a topology's hooks may use it."""

    job: JobConfig
    teardown_grace_s: float
    stop: StopRequest
    clock: Callable[[], float]

    @property
    def current(self) -> Attempt | None: ...

    @property
    def workers(self) -> list[Worker]: ...

    def alive(self) -> list[Worker]:
        """The attempt's workers that have not exited (as of the last poll)."""

    def poll(self) -> None:
        """Print new events, let the launcher work, reap exits (``worker_exited``)."""

    def pause(self) -> None:
        """Sleep one poll interval (a child's exit ends it early), then poll."""

    def sleep_fully(self, seconds: float) -> None:
        """Sleep ``seconds`` even where a pause ends early (a child's exit)."""

    def wait(self, done: Callable[[], bool], timeout_s: float | None) -> None:
        """Pause until ``done()`` or ``timeout_s`` passed (None: until ``done()``)."""

    def send_signal(self, worker: Worker, sig: int) -> None:
        """Send ``sig`` to ``worker``; one that is already gone is no error."""

    def kill(self, worker: Worker) -> None:
        """SIGKILL ``worker`` and mark it KILLED (torn down by us, not its own failure)."""

    def check_launcher_stop(self) -> None:
        """Turn the launcher's stop request, if any, into the run's (``preemption_requested``)."""

    def completed(self) -> bool:
        """Storage holds the run's completed checkpoint."""


class Topology(ABC):
    """The hooks the supervisor loop calls; each states its contract."""

    # What the HUNG reason says nobody did.
    no_progress = "no worker made progress"

    @abstractmethod
    def ranks(self, size: int) -> range:
        """The ranks an attempt of ``size`` (the elastic size: workers of the group) starts."""

    @abstractmethod
    def watched(self, workers: list[Worker]) -> list[Worker]:
        """The workers whose step and phase markers the hang watchdog reads (fixed for an attempt)."""

    def rank_fields(self, rank: int) -> dict[str, Any]:
        """Extra ``worker_started`` fields for ``rank`` (none by default)."""
        return {}

    def summary_fields(self) -> dict[str, Any]:
        """Keys added at the end of ``summary.json`` (none by default)."""
        return {}

    @abstractmethod
    def finished(self, workers: list[Worker], completed: Callable[[], bool]) -> bool:
        """After the attempt: it finished the run (``completed()``: storage holds the completed
        checkpoint). False: the loop settles it as a stop (root cause, restart policy)."""

    @abstractmethod
    def running_ends(self, group: Group) -> Ending:
        """After each poll in RUNNING: SUCCEEDED, a Stop (-> STOPPING), or None to go on.

        May act on the group to keep it running (the parameter-server tier restarts a lost
        worker in place) but never stops it: stopping is ``tear_down``'s."""

    @abstractmethod
    def tear_down(self, group: Group, stop: Stop) -> None:
        """STOPPING: stop every worker of the attempt (``stop`` says why); return once none is
        alive. A stop request that comes meanwhile (``group.stop``) must be honoured."""


class GangTopology(Topology):
    """MultiWorkerMirroredStrategy: every worker a peer in the collectives, any death the group's."""

    def ranks(self, size: int) -> range:
        return range(size)

    def watched(self, workers: list[Worker]) -> list[Worker]:
        """All of them."""
        return workers

    def finished(self, workers: list[Worker], completed: Callable[[], bool]) -> bool:
        return all(w.returncode == EXIT_OK for w in workers) and completed()

    def running_ends(self, group: Group) -> Ending:
        """Everyone exited (SUCCEEDED when the run is complete), a stop was requested, or a
        worker failed -> STOPPING."""
        if not group.alive():
            if self.finished(group.workers, group.completed):
                return RunState.SUCCEEDED
            return Stop(StopCause.EXITED, "every worker exited")
        group.check_launcher_stop()
        if group.stop.source is not None:
            return Stop(StopCause.REQUEST, f"stop requested ({group.stop.source})")
        failed = [w.rank for w in group.workers if w.returncode not in (None, EXIT_OK)]
        if failed:
            return Stop(StopCause.FAILURE, f"worker {failed[0]} exited abnormally")
        return None

    def tear_down(self, group: Group, stop: Stop) -> None:
        """Stop every worker of the attempt (the poll that saw the reason to stop is this
        step's first): a resize or a stop request gets the grace period to save; a hung group
        is SIGKILLed at once; after a failure, SIGTERM and SIGKILL after the teardown grace,
        or at once when nobody is left to commit (supervisor/supervisor.py's docstring)."""
        kill_at: float | None = None
        forwarded = False
        while True:
            alive = group.alive()
            if not alive:
                break
            now = group.clock()
            group.check_launcher_stop()
            if stop.resize is not None and kill_at is None:
                kill_at = now + group.job.grace_period  # RESIZING asked for the agreed save
            if group.stop.source is not None and not forwarded:
                forwarded = True
                for worker in alive:
                    group.send_signal(worker, signal.SIGTERM)
                kill_at = now + group.job.grace_period
            elif kill_at is None:  # a worker failed, or the group hung
                if stop.hang is not None:
                    kill_at = now  # a hung group can save nothing: waiting is pure recovery time
                elif _preempting(group.workers):
                    # The peers agreed on the same step and are saving it; a second SIGTERM
                    # would only race their exit. They get the grace period, then SIGKILL.
                    kill_at = now + group.job.grace_period
                else:
                    for worker in alive:
                        group.send_signal(worker, signal.SIGTERM)
                    settled = _chief_failed(group.workers) or nothing_left_to_commit(stop.rescue_answer)
                    kill_at = now if settled else now + group.teardown_grace_s
            if kill_at is not None and now >= kill_at:
                for worker in alive:
                    worker.frozen = worker.frozen or is_frozen(worker.process.pid)
                    group.kill(worker)
            group.pause()


def _chief_failed(workers: list[Worker]) -> bool:
    """The chief exited abnormally: nobody left can commit, so nothing is worth waiting for."""
    return any(w.rank == 0 and w.returncode not in (None, EXIT_OK) for w in workers)


def _preempting(workers: list[Worker]) -> bool:
    """A worker exited 'preempted': its peers are saving at the agreed step; let them."""
    return any(w.returncode == EXIT_PREEMPTED for w in workers)


def is_frozen(pid: int) -> bool:
    """Whether a local process is stopped by a signal (state T/t in /proc: SIGSTOP, a
    debugger); False when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][:1] in ("T", "t")
    except (OSError, IndexError):
        return False
