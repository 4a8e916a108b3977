"""STARTING's work: the attempt's workers started, at the size the launcher can place.

Each attempt gets its own attempt-<n>/ directory, its job.json (credentials as ***), the
generation its chief claims (supervisor/ownership.py), and a WorkerEnvironment (attempt, run
id, generation, the credentials as RT_STORAGE_SECRETS, the umask); the ranks are the
topology's (supervisor/topology.py). Elastic (``--workers MIN:MAX``): the attempt starts at
min(MAX, capacity) or at the size a membership change decided, and smaller, down to MIN, when
the launcher cannot place that many after all; a size other than the previous attempt's is
announced as ``world_size_changed``. No placement at any size >= MIN: RestartNotPlacedError.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from resilient_train.checkpoint import CheckpointStore
from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.errors import RestartNotPlacedError
from resilient_train.job.config import JobConfig
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.events import emit
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.permissions import current_umask
from resilient_train.supervisor.attempt import Resize, Worker
from resilient_train.supervisor.console import Console
from resilient_train.supervisor.elastic import ElasticPolicy
from resilient_train.supervisor.launchers import Launcher, WorkerSpec
from resilient_train.supervisor.ownership import generation_for
from resilient_train.supervisor.topology import Topology

__all__ = ["AttemptStarter"]


class AttemptStarter:
    """Starts each attempt's workers (see the module docstring)."""

    def __init__(self, job: JobConfig, launcher: Launcher, store: CheckpointStore, run_dir: RunDir,
                 topology: Topology, elastic: ElasticPolicy, out: Console, pump: Callable[[], object]) -> None:
        """``pump()``: print new events.jsonl lines (before a line of ours, so they stay in order)."""
        self.job = job
        self.launcher = launcher
        self.store = store
        self.run_dir = run_dir
        self.topology = topology
        self.elastic = elastic
        self.out = out
        self._pump = pump

    def start(self, attempt: int, resize: Resize | None, *, previous: int | None,
              run_id: str) -> tuple[int, list[Worker]]:
        """Start ``attempt`` at the job's size or, elastic, at the largest size that can be
        placed (``resize``'s after a membership change); returns the size and the workers.
        ``previous``: the size of the attempt before (None: the first)."""
        if not self.job.elastic:
            return self.job.workers, self._start(attempt, self.job.workers, run_id)
        size, reason = (resize.size, resize.reason) if resize is not None else (self.elastic.placeable(), "")
        low = self.job.world_sizes.start
        previous = previous if previous is not None else self.job.workers
        while True:
            if size < low:
                raise RestartNotPlacedError(
                    f"the launcher can place {size} workers; --workers {low}:{self.job.workers} needs at least {low}")
            if size != previous:
                changed_from: dict[str, Any] = {"from": previous}  # a keyword Python reserves
                emit("world_size_changed", attempt=attempt, **changed_from,
                     to=size, reason=reason or f"the launcher can place {size} workers")
                self._pump()
                self.out.write(f"Attempt {attempt}: {previous} -> {size} workers ({reason or 'capacity'})\n")
            try:
                return size, self._start(attempt, size, run_id)
            except RestartNotPlacedError:
                smaller = min(self.elastic.placeable(), size - 1)
                if smaller < low:
                    raise
                size, reason = smaller, f"no placement for {size} workers"

    def _start(self, attempt: int, size: int, run_id: str) -> list[Worker]:
        attempt_dir = self.run_dir.attempt(attempt)
        attempt_dir.path.mkdir(parents=True, exist_ok=True)
        generation = generation_for(self.store, attempt)  # the chief claims it
        # Credentials travel in the environment only; job.json shows them as *** (job/config.py).
        # The umask travels too: a worker on another node (Ray) does not inherit ours.
        env = WorkerEnvironment(attempt, run_id, generation, storage_secrets=self.job.secrets(),
                                umask=current_umask()).to_environ()
        env["PYTHONUNBUFFERED"] = "1"
        env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
        specs = [WorkerSpec(rank, attempt, self.job, env, attempt_dir.path) for rank in self.topology.ranks(size)]
        write_atomic(attempt_dir.job, self.job.to_json())
        handles = self.launcher.start(specs)
        workers = []
        for spec, handle in zip(specs, handles):
            described: dict[str, Any] = self.launcher.describe(handle)
            address = described.get("address") or described.get("node_ip")
            workers.append(Worker(spec.rank, attempt, handle, spec.log_path, address=str(address) if address else None))
            emit("worker_started", rank=spec.rank, pid=handle.pid, attempt=attempt, log=str(spec.log_path),
                 **self.topology.rank_fields(spec.rank), **described)
        return workers
