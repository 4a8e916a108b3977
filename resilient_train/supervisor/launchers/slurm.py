"""The Slurm launcher: each attempt is one ``srun`` step over the allocation's nodes.

``resilient-train run RECIPE --launcher slurm`` runs inside an allocation (``sbatch``,
``salloc``; deploy/slurm/run.sbatch), the supervisor in the batch step. Every attempt is

    srun --nodes=K --ntasks=WORKERS --distribution=block --kill-on-bad-exit=0 --wait=0 --overlap
         --output=<attempt_dir>/worker-%t.log python -m ...launchers.slurm_task <attempt_dir> --
         python -m resilient_train.runner --job <attempt_dir>/job.json --tf-config-from slurm

so each task builds its TF_CONFIG from its Slurm environment (resilient_train/cluster/slurm_env.py) and
rank = SLURM_PROCID. The supervisor keeps its one restart loop: a new attempt is a new step in
the same allocation.

Why ``--kill-on-bad-exit=0 --wait=0`` (the issue asked for ``--kill-on-bad-exit``): with it,
srun kills the surviving tasks the moment one fails, and the survivors' exit codes say
"killed by srun" instead of what they were doing. The supervisor must see each task's *own*
exit code (143 = preempted after an agreed save, 3 = fatal, 1 = failed) to pick the root
cause and to let peers finish a preemption save; it already tears the gang down itself
(SIGTERM, then SIGKILL after a grace). ``--wait=0`` likewise stops srun from killing the
step some time after the first task exits. Task exit codes come from the slurm_task wrapper
(``slurm-task-<rank>.json`` in the attempt dir), since srun returns only one status.

Why ``--overlap``: when a node dies and its step's other tasks have already exited (they do
within seconds, their collectives fail), slurmctld never completes that step (Slurm 22.05.8):
it kills the lost node's part when it sets the node DOWN, but the step stays listed on every
node and holds its CPUs there until the job ends, so the next attempt's step waited forever
("step creation temporarily disabled ... Requested nodes are busy"). Steps of this launcher
never run side by side (the previous srun is gone before the next starts), so sharing CPUs
with such a remnant costs nothing.

Signals go to the whole step (``scancel --signal=SIG JOBID.STEPID``): Slurm cannot signal one
task of a step, and the supervisor only ever signals the whole gang anyway.

Preemption by Slurm (``scancel --signal=TERM``, preemption with GraceTime, ``--signal``)
reaches the tasks, not necessarily the supervisor: the wrapper records it, ``stop_requested``
reports it, and the supervisor treats it like its own SIGTERM (agreed save, exit 143), so
that ``--requeue`` resumes with zero lost steps.

Elastic (``--workers MIN:MAX``): ``capacity()`` is the allocation's nodes now times its tasks
per node at the start. Submitted with ``--no-kill``, an allocation that loses a node keeps
running without it and the next attempt is smaller; one grown by an ``expand`` merge
(``capacity()`` says how) lets the group grow back. Each step names the allocation's nodes
now in its environment.

Refused up front (exit 2): no allocation (SLURM_JOB_ID unset), more workers than the
allocation's tasks, and a run dir the nodes do not share (a probe step writes one file per
node there; the workers write their logs, step markers and error files straight into it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol

from resilient_train.rundir import events
from resilient_train.job.config import JobConfig
from resilient_train.rundir.layout import AttemptDir
from resilient_train.errors import ConfigError
from resilient_train.cluster.slurm_env import DEFAULT_PORT_BASE, compress_hostlist, expand_hostlist
from resilient_train.supervisor.launchers.api import Launcher, WorkerHandle, WorkerSpec, read_notices
from resilient_train.cluster import entry_points

__all__ = ["SlurmLauncher", "Commands", "SubprocessCommands", "allocation_nodes"]

# A new attempt listens on other ports than the one before (a task of the old step may still
# be dying during Slurm's KillWait): base + (attempt - 1) % PORT_ROTATION * workers.
PORT_ROTATION = 8
_PROBE_TIMEOUT_S = 120.0
_STEP_END_TIMEOUT_S = 30.0
_TASKS_REPORTED_S = 10.0  # srun ends on its own once its tasks did; only then scancel KILL


class Commands(Protocol):
    """How the launcher runs Slurm's commands (a fake in unit tests)."""

    def popen(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen: ...

    def run(self, argv: list[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess: ...


class SubprocessCommands:
    def popen(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def run(self, argv: list[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class _Step:
    """One attempt's srun step: its process, name and the signals already sent to it."""

    process: subprocess.Popen
    name: str
    job_id: str
    attempt_dir: Path
    step_id: str | None = None
    sent: set[int] = field(default_factory=set)


def allocation_nodes(scontrol_job: str) -> list[str] | None:
    """The hosts of ``scontrol show job --oneliner``'s ``NodeList=``; None when it has none."""
    for field_ in scontrol_job.split():
        key, _, value = field_.partition("=")
        if key == "NodeList" and value and value != "(null)":
            return expand_hostlist(value)
    return None


class SlurmTask:
    """One rank of a step, as the supervisor sees it (a WorkerHandle)."""

    def __init__(self, launcher: "SlurmLauncher", step: _Step, rank: int) -> None:
        self.launcher, self.step, self.rank = launcher, step, rank
        self.pid = step.process.pid  # srun's: the task's own pid is on its node
        self.unreported = False

    def poll(self) -> int | None:
        code = _read_exit(self.step.attempt_dir, self.rank)
        if code is not None:
            return code
        if self.step.process.poll() is None:
            return None
        code = _read_exit(self.step.attempt_dir, self.rank)  # written before srun could end
        if code is None:
            self.unreported = True
            return -signal.SIGKILL
        return code

    def send_signal(self, sig: int) -> None:
        self.launcher.signal_step(self.step, sig)


class SlurmLauncher(Launcher):
    name = "slurm"

    def __init__(
        self,
        job: JobConfig,
        *,
        commands: Commands | None = None,
        environ: Mapping[str, str] = os.environ,
        python: str = sys.executable,
    ) -> None:
        self.job = job
        self.commands = commands or SubprocessCommands()
        self.environ = environ
        self.python = python
        self.port_base = int(environ.get("RT_SLURM_PORT_BASE", DEFAULT_PORT_BASE))
        self.job_id = ""
        self.nodes: list[str] = []
        self.step: _Step | None = None
        self._tasks_per_node: int | None = None  # SLURM_NTASKS / the allocation's nodes at the start
        self.excluded: list[str] = []  # nodes with a preemption notice: every later step runs --exclude'd of them

    # ------------------------------------------------------------ seam
    def prepare(self) -> None:
        self.job_id = self.environ.get("SLURM_JOB_ID", "")
        if not self.job_id:
            raise ConfigError(
                "--launcher slurm runs inside a Slurm allocation (SLURM_JOB_ID is not set); "
                "submit deploy/slurm/run.sbatch with sbatch, or start it under salloc"
            )
        self.nodes = expand_hostlist(self.environ.get("SLURM_JOB_NODELIST", ""))
        tasks = self.environ.get("SLURM_NTASKS")
        fewest = self.job.world_sizes.start  # MIN of an elastic --workers MIN:MAX, else --workers
        if tasks and tasks.isdigit() and int(tasks) < fewest:
            raise ConfigError(
                f"Received --workers {fewest if fewest == self.job.workers else f'{fewest}:{self.job.workers}'} "
                f"but Slurm job {self.job_id} has {tasks} task(s); submit with --ntasks={self.job.workers} "
                "(one task per worker)"
            )
        if tasks and tasks.isdigit() and self.nodes:
            self._tasks_per_node = max(1, int(tasks) // len(self.nodes))
        self._check_shared_run_dir()

    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        self._end_previous_step()
        attempt_dir = specs[0].attempt_dir
        name = f"rt-{attempt_dir.name}-{uuid.uuid4().hex[:6]}"
        env = self._env(specs[0].env)
        process = self.commands.popen(self.srun_argv(specs, name), env, attempt_dir / "srun.log")
        self.step = _Step(process, name, self.job_id, attempt_dir)
        events.emit("slurm_step_started", step_name=name, slurm_job=self.job_id, attempt=specs[0].attempt,
                    port_base=self._port_base(specs[0].attempt))
        return [SlurmTask(self, self.step, spec.rank) for spec in specs]

    def capacity(self) -> int | None:
        """The allocation's size now: its nodes (``scontrol show job``) x its tasks per node at the start.

        How an allocation changes size (Debian's Slurm 22.05.8, tests/integration/test_slurm_elastic.py):

        * it shrinks when a node fails under ``sbatch --no-kill`` (slurmd silent for
          SlurmdTimeout, or ``scontrol update nodename=N state=down``): the job keeps running,
          NodeList and NumNodes drop the node, and the step with tasks there ends (srun:
          "Node failure on N"). Without ``--no-kill`` Slurm ends or requeues the whole job.
        * it grows only by a merge, where the site sets
          ``SchedulerParameters=permit_job_expansion``: a second allocation submitted with
          ``--dependency=expand:JOBID`` and no step (``salloc --no-shell``) hands its nodes to
          JOBID with ``scontrol update jobid=SECOND NumNodes=0``. ``scontrol update
          jobid=JOBID NumNodes=N`` cannot grow a running job, and once a job was resized
          Slurm refuses every ``scontrol update`` of it ("the DB index is being set": only
          slurmdbd assigns one; not tried with slurmdbd).

        Each later srun step is told the allocation's nodes now (``_env``). None when scontrol
        gives no answer (the supervisor then places what it asks for).
        """
        if not self.job_id or self._tasks_per_node is None:
            return None
        try:
            done = self.commands.run(["scontrol", "show", "job", "--oneliner", self.job_id], dict(self.environ), 10.0)
        except (OSError, subprocess.SubprocessError):
            return None
        nodes = allocation_nodes(done.stdout if done.returncode == 0 else "")
        if nodes is None:
            return None
        self.nodes = nodes
        return len(self._usable()) * self._tasks_per_node

    def avoid_noticed(self, attempt_dir: AttemptDir) -> list[str]:
        """The noticing tasks' nodes (each marker names its ``host``: SLURMD_NODENAME):
        every later step is started with ``--exclude`` of them and ``capacity()`` no longer
        counts them. A marker without a host (torn) names no node: nothing is excluded."""
        new = []
        for fields in read_notices(attempt_dir).values():
            host = fields.get("host")
            if isinstance(host, str) and host and host not in self.excluded:
                self.excluded.append(host)
                new.append(host)
        return new

    def _usable(self) -> list[str]:
        return [node for node in self.nodes if node not in self.excluded]

    def stop_requested(self) -> bool:
        """Slurm itself sent SIGTERM to this attempt's tasks (not the supervisor)."""
        step = self.step
        if step is None or signal.SIGTERM in step.sent:
            return False
        return any(AttemptDir.at(step.attempt_dir).slurm_term(rank).exists() for rank in range(self.job.workers))

    def close(self) -> None:
        self._end_previous_step()

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        return {"slurm_job": self.job_id, "slurm_step_name": self.step.name if self.step else None}

    def lost_reason(self, handle: WorkerHandle) -> str | None:
        if isinstance(handle, SlurmTask) and handle.unreported:
            return (
                f"Slurm step {handle.step.name} ended without task {handle.rank} reporting an exit "
                f"(killed by SIGKILL or its node was lost); see {handle.step.attempt_dir / 'srun.log'}"
            )
        return None

    # ------------------------------------------------------------ srun
    def srun_argv(self, specs: list[WorkerSpec], name: str) -> list[str]:
        attempt_dir = specs[0].attempt_dir
        return [
            "srun",
            f"--job-name={name}",
            f"--nodes={min(len(self._usable()) or len(self.nodes), len(specs))}",
            f"--ntasks={len(specs)}",
            *([f"--exclude={','.join(self.excluded)}"] if self.excluded else []),
            "--distribution=block",
            "--kill-on-bad-exit=0",
            "--wait=0",
            "--overlap",  # a lost node's step may never end in slurmctld (module docstring)
            f"--output={attempt_dir / 'worker-%t.log'}",  # stderr joins it (no --error)
            "--export=ALL",
            self.python, "-m", entry_points.SLURM_TASK, str(attempt_dir), "--",
            self.python, "-m", entry_points.WORKER, "--job", str(specs[0].job_path),
            "--tf-config-from", "slurm", "--port-base", str(self._port_base(specs[0].attempt)),
        ]

    def signal_step(self, step: _Step, sig: int) -> None:
        """``scancel --signal`` to every task of ``step``, once per signal."""
        if sig in step.sent or step.process.poll() is not None:
            return
        step.sent.add(sig)
        step_id = self._step_id(step)
        if step_id is None:  # not registered yet (or already gone): srun forwards what it can
            step.process.send_signal(sig)
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        self.commands.run(["scancel", f"--signal={name}", step_id], self.environ, timeout=60)

    def _step_id(self, step: _Step) -> str | None:
        """``JOBID.STEPID`` of the step named ``step.name``, by its name in squeue's answer:
        ``--name`` does not filter ``squeue --steps`` (Slurm 22.05.8 lists every step of the
        job), and the first line may be an earlier step that never ended (a lost node's)."""
        if step.step_id is None:
            found = self.commands.run(
                ["squeue", "--steps", "--noheader", "--format=%i %j", f"--jobs={step.job_id}", f"--name={step.name}"],
                self.environ,
                timeout=60,
            )
            lines = found.stdout.splitlines() if found.returncode == 0 else []
            ids = [fields[0] for fields in map(str.split, lines) if fields[1:] == [step.name]]
            step.step_id = ids[0] if ids else None
        return step.step_id

    def _port_base(self, attempt: int) -> int:
        return self.port_base + (attempt - 1) % PORT_ROTATION * self.job.workers

    def _env(self, attempt_env: Mapping[str, str]) -> dict[str, str]:
        env = {**self.environ, **attempt_env}
        env.pop("TF_CONFIG", None)  # each task builds its own
        if self.nodes:
            # The allocation as it is now, not as the batch step was told at the start: srun
            # checks --nodes against SLURM_JOB_NODELIST and refuses a grown allocation
            # otherwise ("srun: error: Only allocated 1 nodes asked for 2").
            nodelist, count = compress_hostlist(self.nodes), str(len(self.nodes))
            env.update(SLURM_JOB_NODELIST=nodelist, SLURM_NODELIST=nodelist, SLURM_JOB_NUM_NODES=count, SLURM_NNODES=count)
        return env

    def _end_previous_step(self) -> None:
        """The previous attempt's srun must be gone before the next step (or the run) starts."""
        step, self.step = self.step, None
        if step is None or _ended(step.process, _TASKS_REPORTED_S):
            return  # normally: every task reported its exit, srun follows within moments
        self.signal_step(step, signal.SIGKILL)
        if not _ended(step.process, _STEP_END_TIMEOUT_S):
            step.process.kill()
            step.process.wait()

    def _check_shared_run_dir(self) -> None:
        """A probe step writes one file per node into the run dir; every file must be here."""
        probe_dir = Path(self.job.run_dir).resolve() / "slurm-probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        for old in probe_dir.iterdir():
            old.unlink()
        write = "import os, sys; open(os.path.join(sys.argv[1], os.environ['SLURMD_NODENAME']), 'w').close()"
        argv = ["srun", f"--nodes={len(self.nodes)}", f"--ntasks={len(self.nodes)}", "--ntasks-per-node=1",
                "--overlap", self.python, "-c", write, str(probe_dir)]
        result = self.commands.run(argv, self._env({}), timeout=_PROBE_TIMEOUT_S)
        if result.returncode != 0:
            raise ConfigError(
                f"The probe step `srun ... python` failed in Slurm job {self.job_id} (exit {result.returncode}): "
                f"{(result.stderr or '').strip()[-300:]}"
            )
        missing = [node for node in self.nodes if not (probe_dir / node).exists()]
        if missing:
            raise ConfigError(
                f"Run dir {self.job.run_dir} is not shared with node(s) {missing}; --launcher slurm needs "
                "--run-dir on a filesystem every node mounts (the checkpoint storage may be s3://)"
            )


def _ended(process: subprocess.Popen, timeout: float) -> bool:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _read_exit(attempt_dir: Path, rank: int) -> int | None:
    try:
        return int(json.loads(AttemptDir.at(attempt_dir).slurm_exit(rank).read_text())["exit_code"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as exc:  # written atomically, so this is not a torn write
        raise RuntimeError(f"Unreadable Slurm task report {AttemptDir.at(attempt_dir).slurm_exit(rank)}: {exc}") from None
