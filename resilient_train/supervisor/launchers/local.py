"""The local launcher: every worker is a child process of the supervisor, on this host.

Placement is trivial (all ranks on 127.0.0.1, fresh free ports each attempt); a death is
seen by ``poll()`` the moment the OS reaps the child; ``--gpus-per-worker`` slices
CUDA_VISIBLE_DEVICES per rank. Workers write straight into the supervisor's run dir, so
there is nothing to bring back.

Capacity (``Launcher.capacity``) is unlimited on one host, unless the run dir holds a
``local-slots`` file (``RunDir.local_slots``): its integer is how many workers may be placed
now. That file is the local stand-in for nodes that come and go, so elastic runs
(``--workers MIN:MAX``) can be exercised with real processes on one machine; an unreadable
file counts as absent.

Warm standbys (supervisor/standby_pool.py) live here: a start hands each rank a process that
has already imported TensorFlow and the recipe instead of spawning a cold one. They are forked
from one template process (supervisor/forked_standbys.py), started before the first attempt,
so a run imports TensorFlow once: the first attempt waits for the template's import and forks
its workers from it (N cold imports beside the template's took a 20-step digits run 19.9 s
against 14.8 s without standbys, 2026-11-29, quiet), and a restart whose pool is not refilled
yet forks what is missing (10-50 ms each) instead of importing cold.

``RT_LOCAL_WORKER_NETNS`` (cluster/worker_netns.py) puts each rank in a network namespace of
its own, at that namespace's address, so that one host can stand in for several, each with
its own link (benchmarks/sharded_save_capped.py); standbys are off then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from resilient_train.rundir import events
from resilient_train.rundir.layout import AttemptDir, RunDir
from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.tf_config import build_tf_config
from resilient_train.cluster.worker_netns import WorkerNetns, worker_netns_from, wrap_argv
from resilient_train.job.config import STRAGGLER_PROVIDER, JobConfig
from resilient_train.supervisor._process import die_with_parent_hook
from resilient_train.supervisor.launchers.api import Launcher, WorkerHandle, WorkerSpec, read_notices
from resilient_train.supervisor.forked_standbys import ForkServerSpawner, TemplateState
from resilient_train.supervisor.standby_pool import StandbyPool, StandbySpawner
from resilient_train.cluster import entry_points

__all__ = ["LocalLauncher", "PopenSpawner", "Spawner", "TEMPLATE_PRIORITY"]

# The standby template's import priority (runner/process/standby_template.py --priority): "normal"
# imports beside the first attempt's workers, so the template is ready for a restart that comes
# early; "idle" leaves the first attempt every core and is promoted when the pool first asks for a
# standby (its first step), so a kill before then restarts cold. Measured on a loaded machine
# without a clear difference (docs/checkpointing.md); normal is the one that never restarts cold.
TEMPLATE_PRIORITY = "normal"

# How long a first attempt waits for the standby template's import before it starts its workers
# cold (each importing what the template imports: on a machine where the template needs longer,
# they would too). A fork's standby says ready in milliseconds; FORKED_READY_S bounds that wait.
TEMPLATE_WAIT_S = 120.0
FORKED_READY_S = 5.0


class Spawner(Protocol):
    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> WorkerHandle: ...


class PopenSpawner:
    """Real processes; stdout and stderr go to the worker's log file."""

    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent_hook(),
            )


class LocalLauncher(Launcher):
    name = "local"

    def __init__(
        self,
        job: JobConfig,
        *,
        spawner: Spawner | None = None,
        standby_spawner: StandbySpawner | None = None,
        python: str = sys.executable,
        replenish_delay_s: float = 10.0,
        host: str = "127.0.0.1",
        netns: tuple[WorkerNetns, ...] | None = None,
    ) -> None:
        """``netns``: each rank's network namespace (cluster/worker_netns.py); None: from
        ``RT_LOCAL_WORKER_NETNS`` in this process's environment (unset: none)."""
        self.job = job
        self.netns = worker_netns_from(os.environ) if netns is None else netns
        self.spawner = spawner or PopenSpawner()
        self.standby_spawner = standby_spawner
        self.python = python
        self.replenish_delay_s = replenish_delay_s
        self.host = host
        self.pool: StandbyPool | None = None
        self._standby_pids: set[int] = set()
        self._addresses: dict[int, str] = {}  # pid -> its TF_CONFIG host:port
        self._waited_for_template = False  # the first start waited for the template's import

    def prepare(self) -> None:
        self.pool = self._standby_pool()

    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        self._fork_standbys()
        ports = free_ports(len(specs))
        if self.netns:  # each rank at its namespace's host (a port is free there: a fresh namespace)
            wrap_argv([], self.netns, len(specs) - 1)  # ConfigError: fewer namespaces than ranks
            addresses = [self.netns[rank].address(port) for rank, port in enumerate(ports)]
        else:
            addresses = [f"{self.host}:{port}" for port in ports]
        handles: list[WorkerHandle] = []
        for spec in specs:
            env = {**os.environ, **spec.env, "TF_CONFIG": json.dumps(build_tf_config(addresses, spec.rank))}
            if self.job.gpus_per_worker:
                first = spec.rank * self.job.gpus_per_worker
                env["CUDA_VISIBLE_DEVICES"] = ",".join(
                    str(i) for i in range(first, first + self.job.gpus_per_worker)
                )
            worker_argv = ["--job", str(spec.job_path)]
            standby = self.pool.hand_over(worker_argv, env, spec.log_path) if self.pool is not None else None
            process: WorkerHandle
            if standby is not None:
                self._standby_pids.add(standby.pid)
                process = standby
            else:
                argv = wrap_argv([self.python, "-m", entry_points.WORKER, *worker_argv], self.netns, spec.rank)
                process = self.spawner(argv, env, spec.log_path)
            self._addresses[process.pid] = addresses[spec.rank]
            handles.append(process)
        return handles

    def _fork_standbys(self) -> None:
        """Fill the pool with forks of the template before a start hands its ranks over.

        The first start waits for the template's import; a later one forks only from a ready
        template (one that is lost or unusable leaves the start to cold processes, as before)."""
        spawner = self.standby_spawner
        if self.pool is None or not isinstance(spawner, ForkServerSpawner) or spawner.template is None:
            return
        if not self._waited_for_template:
            spawner.template.wait_ready(TEMPLATE_WAIT_S)
        self._waited_for_template = True
        spawner.template.pump()
        if spawner.template.state is TemplateState.READY:
            self.pool.fill_now(ready_within_s=FORKED_READY_S)

    def capacity(self) -> int | None:
        try:
            slots = int(RunDir(self.job.run_dir).local_slots.read_text().strip())
        except (OSError, ValueError):
            return None
        return max(slots, 0)

    def maintain(self, *, training: bool) -> None:
        if self.pool is not None:
            self.pool.maintain(refill=training)

    def host_doomed(self, attempt_dir: AttemptDir) -> str | None:
        """Every worker runs on this host: one's notice means the supervisor's host is going too. Not a
        replaced straggler's marker (runner/health/straggler_replace.py): its host is slow, not going;
        the restart starts a fresh process there, the one thing this launcher can change."""
        for fields in read_notices(attempt_dir).values():
            if fields.get("provider") != STRAGGLER_PROVIDER:
                return f"notice:{fields.get('provider') or 'unknown'}"
        return None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if isinstance(self.standby_spawner, ForkServerSpawner):
            self.standby_spawner.close()

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        fields: dict[str, object] = {"standby": handle.pid in self._standby_pids, "address": self._addresses.get(handle.pid)}
        if self.pool is not None and handle.pid in self.pool.handed_over_warm:
            fields["standby_warm"] = self.pool.handed_over_warm[handle.pid]
        return fields

    def _standby_pool(self) -> StandbyPool | None:
        """The warm pool for this run (None with --no-warm-standby or with GPUs), filling."""
        if not self.job.warm_standby:
            return None
        if self.job.gpus_per_worker:  # CUDA_VISIBLE_DEVICES is per rank; see runner/process/warm_standby.py
            events.emit("standby_disabled", reason="--gpus-per-worker: standbys cannot take a per-rank CUDA_VISIBLE_DEVICES")
            return None
        if self.netns:  # a standby is forked in the supervisor's namespace, not in its rank's
            events.emit("standby_disabled", reason="RT_LOCAL_WORKER_NETNS: each worker starts in its own network namespace")
            return None
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        log_dir = Path(self.job.run_dir) / "standby"
        if self.standby_spawner is None:
            self.standby_spawner = ForkServerSpawner(
                [self.python, "-m", entry_points.STANDBY_TEMPLATE, "--recipe", self.job.recipe,
                 "--priority", TEMPLATE_PRIORITY],
                env, log_dir / "template.log",
            )
        if isinstance(self.standby_spawner, ForkServerSpawner):
            self.standby_spawner.start()  # before the first attempt, whose workers it forks
        return StandbyPool(  # filled by forks at each start (_fork_standbys) and once an attempt trains
            self.job.workers,
            argv=[self.python, "-m", entry_points.WARM_STANDBY, "--recipe", self.job.recipe],
            env=env,
            log_dir=log_dir,
            spawner=self.standby_spawner,
            replenish_delay_s=self.replenish_delay_s,
        )
