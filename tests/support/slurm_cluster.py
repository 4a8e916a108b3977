"""A real one-node Slurm cluster on localhost for tests: munged, slurmctld and slurmd.

Debian's packages (``make slurm-deps``: slurm-wlm, munge), started as root with everything
in a temporary directory: the config, its own munge key and socket, state and spool dirs,
free ports for slurmctld and slurmd, so nothing under /etc or /var is touched and two
sessions do not collide. One node named ``localhost`` (NodeAddr 127.0.0.1) with CPUs=2: the
workers' TF_CONFIG names ``localhost``, so all test traffic stays on loopback.

Choices that make it work in a container: proctrack/linuxproc and task/none (no cgroups),
select/cons_tres, no accounting daemon. ``cred_expire=10``: a requeued batch job waits
cred_expire + 1 s before it may start again (120 s by default).

Skipped with the reason when the packages are missing or not root; never skipped when
``RT_REQUIRE_SLURM=1`` (``make test-all``): then the missing piece is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from resilient_train.cluster.ports import free_ports

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "squeue", "sinfo")
_FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

_CONFIG = """\
ClusterName=rt-test
SlurmctldHost={controller}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool{per_node}
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd{per_node}.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd{per_node}.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=5
JobRequeue=1
{extra}{nodes}
PartitionName=debug Nodes={partition} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class JobState:
    job_id: str
    state: str
    exit_code: str
    restarts: int


class SlurmCluster:
    """The running cluster: its environment (SLURM_CONF) and a few commands.

    ``client`` prefixes every command (sbatch, scontrol, ...): empty on localhost; on the
    multi-node cluster (tests/support/slurm_nodes.py) it enters the controller's host, the
    only place slurmctld can be reached from.
    """

    def __init__(self, directory: Path, client: tuple[str, ...] = ()) -> None:
        self.dir = directory
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.client = list(client)

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*self.client, *argv], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def sbatch(self, *argv: str, env: dict[str, str], cwd: Path) -> str:
        result = subprocess.run(
            [*self.client, "sbatch", "--parsable", *argv], env={**env, "SLURM_CONF": str(self.conf)}, cwd=cwd,
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, f"sbatch failed: {result.stderr}"
        return result.stdout.strip().split(";")[0]

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job --oneliner``'s fields (``NodeList``, ``NumNodes``, ``JobState``, ...)."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "--oneliner", job_id).stdout))

    def job(self, job_id: str) -> JobState:
        fields = self.show_job(job_id)
        return JobState(job_id, fields.get("JobState", "?"), fields.get("ExitCode", "?"), int(fields.get("Restarts", 0)))

    def wait_job(self, job_id: str, *, timeout: float = 600) -> JobState:
        """Until the job is in a final state (a requeued job goes back to PENDING first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.state in _FINAL_STATES:
                return job
            time.sleep(0.5)
        self.run("scancel", job_id)
        raise TimeoutError(f"Slurm job {job_id} not finished after {timeout} s (last state {self.job(job_id)})")

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it (``idle``, ``allocated``, ``down*``)."""
        lines = self.run("sinfo", "--Node", "--noheader", "--format=%N %T").stdout.split("\n")
        return dict(line.split() for line in lines if line.strip())

    def wait_idle(self, *nodes: str, timeout: float = 60) -> None:
        """Until ``nodes`` (default: every node) are idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(states.get(node) == "idle" for node in nodes or states):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Slurm nodes not idle after {timeout} s ({self.node_states()}); "
                           f"see the slurmd and slurmctld logs in {self.dir}")


def unavailable() -> str | None:
    """Why a local Slurm cluster cannot run here, or None."""
    missing = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}); run `make slurm-deps` (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the local Slurm test cluster needs root (slurmd launches tasks as their user)"
    return None


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``, unless RT_REQUIRE_SLURM=1 (``make test-all``): then fail."""
    if os.environ.get("RT_REQUIRE_SLURM") == "1":
        pytest.fail(f"RT_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def start_munge(directory: Path) -> None:
    """A private munged for ``directory``: its own key, socket, log, pid and seed files there."""
    directory.chmod(0o700)
    for sub in ("state", "spool"):
        (directory / sub).mkdir()
    subprocess.run([sbin("mungekey"), "--create", "--keyfile", str(directory / "munge.key")], check=True, timeout=30)
    subprocess.run(
        [sbin("munged"), "--force", f"--socket={directory}/munge.sock", f"--key-file={directory}/munge.key",
         f"--log-file={directory}/munged.log", f"--pid-file={directory}/munged.pid",
         f"--seed-file={directory}/munged.seed", "--origin=127.0.0.1"],
        check=True, timeout=30,
    )


def write_config(directory: Path, *, controller: str, nodes: list[str], partition: str, per_node: str = "",
                 extra: str = "") -> Path:
    """slurm.conf in ``directory`` with free ports; ``per_node`` suffixes slurmd's spool, pid and
    log paths (``-%n``: one set per node name)."""
    ctld_port, slurmd_port = free_ports(2)
    conf = directory / "slurm.conf"
    conf.write_text(_CONFIG.format(
        controller=controller, ctld_port=ctld_port, slurmd_port=slurmd_port, dir=directory, per_node=per_node,
        extra=extra, nodes="\n".join(nodes), partition=partition,
    ))
    return conf


def _start(directory: Path) -> SlurmCluster:
    start_munge(directory)
    host = socket.gethostname().split(".")[0]
    write_config(directory, controller=f"{host}(127.0.0.1)", partition="localhost",
                 nodes=["NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN"])
    cluster = SlurmCluster(directory)
    subprocess.run([sbin("slurmctld"), "-i", "-f", str(cluster.conf)], env=cluster.env, check=True, timeout=60)
    subprocess.run([sbin("slurmd"), "-N", "localhost", "-f", str(cluster.conf)], env=cluster.env, check=True, timeout=60)
    cluster.wait_idle()
    return cluster


def stop(directory: Path) -> None:
    """Stop the daemons started for ``directory`` (by their pid files): every slurmd first,
    then slurmctld, then munged."""
    pid_files = [*sorted(directory.glob("slurmd*.pid")), directory / "slurmctld.pid", directory / "munged.pid"]
    for pid_file in pid_files:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    directory = tmp_path_factory.mktemp("slurm")
    try:
        cluster = _start(directory)
        yield cluster
        cluster.run("scancel", "--partition=debug")
    finally:
        stop(directory)
