"""The supervisor of the parameter-server tier: per-role failure handling.

A ``--strategy parameter-server`` run is one coordinator (rank 0, the only process that
trains and saves), P parameter servers (the variables) and N workers (stateless servers
that run the coordinator's closures); cluster/ps_cluster.py numbers them. Everything that
is not about roles is the MultiWorkerMirroredStrategy supervisor's (supervisor.py): run id,
lock, storage ownership, the generation fence, attempts, restart budget and backoff,
root cause, exit codes, ``events.jsonl``, ``summary.json``, lost steps, and the RUNNING and
STOPPING steps themselves. This tier is only a :class:`ParameterServerTopology`, the
topology interface's hooks (supervisor/topology.py) with this tier's answers: which ranks
start (coordinator, ps, workers), which the watchdog reads (the coordinator), what
``worker_started`` and ``summary.json`` add (roles, restarts in place), when an attempt
finished (the coordinator's exit 0), what ends RUNNING (``running_ends``) and how an
attempt is torn down (``tear_down``):

# Implementation:
#   RUNNING   a worker died -> start it again in place (launchers/ps_local.py: same TF_CONFIG,
#             address and port), emit worker_restarted; training goes on: the
#             ClusterCoordinator re-schedules the closures the worker lost once it is back.
#             These restarts do not spend the gang restart budget (a preemptible worker is
#             what the tier is built for), but one rank restarted more than
#             --max-restarts times in one attempt ends the attempt like a crash.
#             A parameter server died -> STOPPING: the variables are gone, so the attempt is.
#             The coordinator exited (done, preempted or failed) -> STOPPING.
#   STOPPING  our own SIGTERM reaches the coordinator ONLY (it needs ps and workers to
#             finish its closures and read the variables it saves) and it gets
#             --grace-period; after a failure it is SIGKILLed at once (a coordinator whose
#             ps died cannot recover). Then the servers get SIGTERM (they exit 0) and
#             SIGKILL after the teardown grace. The base class settles the attempt: a ps
#             or coordinator failure is a gang restart (coordinator + all ps + workers, fresh
#             ports) that restores the last committed checkpoint.
#
#             The hang watchdog (watchdog.py) watches the coordinator only: it writes the
#             step and phase markers (scheduled steps; the join before a save is training,
#             writing the checkpoint a slow phase), while ps and workers are servers that
#             idle by design between closures and write none. A coordinator that stops
#             scheduling and joining (a stuck input, a closure that never returns, a hung
#             thread) -> HUNG (stacks of the coordinator only) -> STOPPING, a gang restart
#             whose root cause is the coordinator, as a hung MWMS group.
"""

from __future__ import annotations

import signal
from typing import Any, Callable

from resilient_train.cluster.ps_cluster import ps_task
from resilient_train.errors import EXIT_OK
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import emit
from resilient_train.supervisor.attempt import Attempt, Stop, StopCause, Worker
from resilient_train.supervisor.launchers.ps_local import ParameterServerLauncher
from resilient_train.supervisor.state import WorkerState
from resilient_train.supervisor.supervisor import Supervisor
from resilient_train.supervisor.topology import Ending, Group, Topology

__all__ = ["ParameterServerSupervisor", "ParameterServerTopology"]


class ParameterServerTopology(Topology):
    """One coordinator, P parameter servers, N workers; see the module docstring."""

    no_progress = "the coordinator made no progress"

    def __init__(self, job: JobConfig, launcher: ParameterServerLauncher) -> None:
        self.job = job
        self.launcher = launcher  # restart_in_place is this tier's own
        self.worker_restarts = 0  # restarts in place, over the run (summary.json)

    def _role(self, rank: int) -> str:
        return ps_task(rank, self.job.ps, self.job.workers).role

    def ranks(self, size: int) -> range:
        return range(1 + self.job.ps + self.job.workers)

    def watched(self, workers: list[Worker]) -> list[Worker]:
        """The coordinator only: servers idle by design (see the module docstring)."""
        return [w for w in workers if w.rank == 0]

    def rank_fields(self, rank: int) -> dict[str, Any]:
        return {"role": self._role(rank)}

    def summary_fields(self) -> dict[str, Any]:
        return {"strategy": "parameter-server", "ps": self.job.ps, "worker_restarts": self.worker_restarts}

    def finished(self, workers: list[Worker], completed: Callable[[], bool]) -> bool:
        """Success is the coordinator's alone: it exited 0 with the completed checkpoint
        committed. The servers were stopped by us then, however they exited."""
        return workers[0].returncode == EXIT_OK and completed()

    # ------------------------------------------------------------ RUNNING
    def running_ends(self, group: Group) -> Ending:
        """A stop request, the coordinator's exit, a ps's exit or a worker out of restarts
        in place -> STOPPING; any other lost worker is restarted in place."""
        if group.stop.source is not None:
            return Stop(StopCause.REQUEST, f"stop requested ({group.stop.source})")
        coordinator = group.workers[0]
        if coordinator.returncode is not None:
            return Stop(StopCause.FAILURE, f"the coordinator exited ({coordinator.returncode})")
        attempt = _under_way(group)
        for worker in group.workers[1:]:
            if worker.returncode is None:
                continue
            if self._role(worker.rank) == "ps":
                return Stop(StopCause.FAILURE, f"parameter server rank {worker.rank} exited")
            if attempt.restarts_in_place[worker.rank] >= self.job.max_restarts:
                return Stop(StopCause.FAILURE, f"worker rank {worker.rank} exited again after "
                                               f"{self.job.max_restarts} restarts in place (--max-restarts)")
            self._restart_in_place(group, worker)
        return None

    def _restart_in_place(self, group: Group, worker: Worker) -> None:
        previous = worker.returncode
        worker.process = self.launcher.restart_in_place(worker.rank)
        worker.returncode = worker.exit_time = None
        worker.state = WorkerState.RUNNING
        attempt = _under_way(group)
        restarts = attempt.restarts_in_place
        restarts[worker.rank] += 1
        self.worker_restarts += 1
        address = self.launcher.describe(worker.process).get("address")
        emit("worker_restarted", rank=worker.rank, role="worker", pid=worker.process.pid, attempt=attempt.number,
             address=address, previous_exit=previous, restarts=restarts[worker.rank])

    # ------------------------------------------------------------ STOPPING
    def tear_down(self, group: Group, stop: Stop) -> None:
        """The coordinator first (SIGTERM and the grace period on our own stop, else SIGKILL),
        then the servers (SIGTERM, SIGKILL after the teardown grace)."""
        coordinator = group.workers[0]
        if coordinator.returncode is None:
            if group.stop.source is not None:
                group.send_signal(coordinator, signal.SIGTERM)
                group.wait(lambda: coordinator.returncode is not None, self.job.grace_period)
            if coordinator.returncode is None:
                group.kill(coordinator)
                group.wait(lambda: coordinator.returncode is not None, None)
        servers = [w for w in group.workers[1:] if w.returncode is None]
        for server in servers:
            group.send_signal(server, signal.SIGTERM)
        group.wait(lambda: not group.alive(), group.teardown_grace_s)
        for server in group.alive():
            group.kill(server)
        group.wait(lambda: not group.alive(), None)


def _under_way(group: Group) -> Attempt:
    """The attempt RUNNING watches (started: the loop is past STARTING)."""
    attempt = group.current
    if attempt is None:
        raise RuntimeError("no attempt has been started yet")
    return attempt


class ParameterServerSupervisor(Supervisor):
    """The supervisor loop with the parameter-server topology and its launcher (tests and the
    ``run`` command construct it as they construct a :class:`Supervisor`)."""

    def __init__(self, job: JobConfig, *, launcher: ParameterServerLauncher | None = None, **kwargs: Any) -> None:
        launcher = launcher or ParameterServerLauncher(job)
        super().__init__(job, launcher=launcher, topology=ParameterServerTopology(job, launcher), **kwargs)
