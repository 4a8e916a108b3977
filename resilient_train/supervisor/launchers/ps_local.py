"""The local launcher for the parameter-server tier: coordinator, ps and workers on this host.

It is the local launcher (launchers/local.py: child processes, the parent-death signal, logs
in the run dir) with two differences:

* ``start`` gives each rank a parameter-server TF_CONFIG (cluster/ps_cluster.py) and runs
  ``python -m resilient_train.runner.process.ps_roles`` instead of the MultiWorkerMirroredStrategy runner;
* ``restart_in_place(rank)`` starts a rank again with the environment it had, so the same
  TF_CONFIG, the same address and port: TensorFlow's ClusterCoordinator takes a worker back
  only there.

No warm standbys: a standby imports the MultiWorkerMirroredStrategy runner, and a worker
here is a bare ``tf.distribute.Server`` that starts in about the time a hand-over takes.
"""

from __future__ import annotations

import json
import os

from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.ps_cluster import ps_task, ps_tf_config
from resilient_train.supervisor.launchers.api import WorkerHandle, WorkerSpec
from resilient_train.supervisor.launchers.local import LocalLauncher
from resilient_train.cluster import entry_points

__all__ = ["ParameterServerLauncher"]


class ParameterServerLauncher(LocalLauncher):
    name = "local"

    def prepare(self) -> None:
        self.pool = None
        self._started: dict[int, tuple[list[str], dict[str, str], WorkerSpec]] = {}

    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        addresses = [f"{self.host}:{port}" for port in free_ports(len(specs))]
        handles: list[WorkerHandle] = []
        for spec in specs:
            env = {**os.environ, **spec.env,
                   "TF_CONFIG": json.dumps(ps_tf_config(addresses, spec.rank, self.job.ps))}
            argv = [self.python, "-m", entry_points.PS_ROLE, "--job", str(spec.job_path)]
            self._started[spec.rank] = (argv, env, spec)
            process = self.spawner(argv, env, spec.log_path)
            self._addresses[process.pid] = addresses[spec.rank]
            handles.append(process)
        return handles

    def restart_in_place(self, rank: int) -> WorkerHandle:
        """Start ``rank`` of the current attempt again: same argv, environment, address and log."""
        argv, env, spec = self._started[rank]
        process = self.spawner(argv, env, spec.log_path)
        self._addresses[process.pid] = json.loads(env["TF_CONFIG"])["cluster"][self.role(rank)][
            ps_task(rank, self.job.ps, self.job.workers).index]
        return process

    def role(self, rank: int) -> str:
        return ps_task(rank, self.job.ps, self.job.workers).role

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        return {"address": self._addresses.get(handle.pid)}
