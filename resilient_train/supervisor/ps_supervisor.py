"""The supervisor of the parameter-server tier: per-role failure handling.

A ``--strategy parameter-server`` run is one coordinator (rank 0, the only process that
trains and saves), P parameter servers (the variables) and N workers (stateless servers
that run the coordinator's closures); cluster/ps_cluster.py numbers them. Everything that
is not about roles is the MultiWorkerMirroredStrategy supervisor's (supervisor.py): run id,
lock, storage ownership, the generation fence, attempts, restart budget and backoff,
root cause, exit codes, ``events.jsonl``, ``summary.json``, lost steps, and the RUNNING and
STOPPING steps themselves. This class only overrides their hooks: what ends RUNNING
(``_running_ends``) and how an attempt is torn down (``_tear_down``):

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
from typing import Any

from resilient_train.cluster.ps_cluster import ps_task
from resilient_train.errors import EXIT_OK
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import emit
from resilient_train.supervisor.attempt import Worker
from resilient_train.supervisor.launchers.ps_local import ParameterServerLauncher
from resilient_train.supervisor.policy import AttemptOutcome
from resilient_train.supervisor.state import RunState, WorkerState
from resilient_train.supervisor.supervisor import Supervisor

__all__ = ["ParameterServerSupervisor"]


class ParameterServerSupervisor(Supervisor):
    """Runs one parameter-server job; see the module docstring for what differs from MWMS."""

    launcher: ParameterServerLauncher  # always (__init__): restart_in_place is this tier's own
    _NO_PROGRESS = "the coordinator made no progress"

    def __init__(self, job: JobConfig, *, launcher: ParameterServerLauncher | None = None, **kwargs: Any) -> None:
        super().__init__(job, launcher=launcher or ParameterServerLauncher(job), **kwargs)
        self.worker_restarts = 0

    def _role(self, rank: int) -> str:
        return ps_task(rank, self.job.ps, self.job.workers).role

    def _ranks(self, size: int) -> range:
        return range(1 + self.job.ps + self.job.workers)

    def _watched(self) -> list[Worker]:
        """The coordinator only: servers idle by design (see the module docstring)."""
        return [w for w in self.workers if w.rank == 0]

    def _rank_fields(self, rank: int) -> dict[str, Any]:
        return {"role": self._role(rank)}

    def _summary_fields(self) -> dict[str, Any]:
        return {"strategy": "parameter-server", "ps": self.job.ps, "worker_restarts": self.worker_restarts}

    def _outcome(self, attempt: int, workers: list[Worker]) -> AttemptOutcome | None:
        """Success is the coordinator's alone: it exited 0 with the completed checkpoint
        committed. The servers were stopped by us then, however they exited."""
        if workers[0].returncode == EXIT_OK and self._completed_manifest() is not None:
            return None
        return super()._outcome(attempt, workers)

    # ------------------------------------------------------------ RUNNING
    def _running_ends(self) -> tuple[RunState, str | None] | None:
        """A stop request, the coordinator's exit, a ps's exit or a worker out of restarts
        in place -> STOPPING; any other lost worker is restarted in place."""
        if self.stop_signal is not None:
            return RunState.STOPPING, f"stop requested ({self.stop_signal})"
        coordinator = self.workers[0]
        if coordinator.returncode is not None:
            return RunState.STOPPING, f"the coordinator exited ({coordinator.returncode})"
        restarts = self._current_attempt.restarts_in_place
        for worker in self.workers[1:]:
            if worker.returncode is None:
                continue
            if self._role(worker.rank) == "ps":
                return RunState.STOPPING, f"parameter server rank {worker.rank} exited"
            if restarts[worker.rank] >= self.job.max_restarts:
                return RunState.STOPPING, (f"worker rank {worker.rank} exited again after "
                                           f"{self.job.max_restarts} restarts in place (--max-restarts)")
            self._restart_in_place(worker)
        return None

    def _restart_in_place(self, worker: Worker) -> None:
        previous = worker.returncode
        worker.process = self.launcher.restart_in_place(worker.rank)
        worker.returncode = worker.exit_time = None
        worker.state = WorkerState.RUNNING
        restarts = self._current_attempt.restarts_in_place
        restarts[worker.rank] += 1
        self.worker_restarts += 1
        address = self.launcher.describe(worker.process).get("address")
        emit("worker_restarted", rank=worker.rank, role="worker", pid=worker.process.pid, attempt=self.attempt,
             address=address, previous_exit=previous, restarts=restarts[worker.rank])

    # ------------------------------------------------------------ STOPPING
    def _tear_down(self) -> None:
        """The coordinator first (SIGTERM and the grace period on our own stop, else SIGKILL),
        then the servers (SIGTERM, SIGKILL after the teardown grace)."""
        coordinator = self.workers[0]
        if coordinator.returncode is None:
            if self.stop_signal is not None:
                self._signal(coordinator, signal.SIGTERM)
                self._wait(lambda: coordinator.returncode is not None, self.job.grace_period)
            if coordinator.returncode is None:
                self._kill(coordinator)
                self._wait(lambda: coordinator.returncode is not None, None)
        servers = [w for w in self.workers[1:] if w.returncode is None]
        for server in servers:
            self._signal(server, signal.SIGTERM)
        self._wait(lambda: not self._alive(), self.teardown_grace_s)
        for server in self._alive():
            self._kill(server)
        self._wait(lambda: not self._alive(), None)
