"""A real multi-node Slurm cluster on this machine: each node its own network-namespace host.

Built from the netns test bed (tests/support/netns.py) and the one-node cluster's pieces
(tests/support/slurm_cluster.py: munged, slurm.conf, the client commands, stop)::

    host0  10.231.0.10  hostname ctl     slurmctld; the test's sbatch, scontrol, salloc run here
    host1  10.231.0.11  hostname node0   slurmd -N node0
    host2  10.231.0.12  hostname node1   slurmd -N node1  (one more per extra node)

Every daemon and client runs in its host's network namespace, so all Slurm and worker
traffic crosses the test bed's bridge on addresses that exist only there. Each also gets
a private mount and UTS namespace (``unshare --mount --uts``, then ``nsenter --net``):

* its hostname is its node name, as on a real cluster. slurmctld tells srun that a node
  failed by connecting to srun's host name (SRUN_NODE_FAIL); with every node named after
  this machine the message never arrived and srun waited forever for the lost node's task.
* /etc/hosts is a bind-mounted file of the cluster dir naming the hosts, so ``node1``
  resolves to 10.231.0.12 for slurmd, srun and the workers (whose TF_CONFIG names nodes),
  and nowhere else; nothing under /etc is written.
* not ``ip netns exec``: it mounts a fresh /sys without /sys/fs/cgroup, and slurmd 22.05
  then refuses to start ("No filesystem mounted on /sys/fs/cgroup ... slurmd
  initialization failed").

munged runs in the root namespace: it serves only a Unix socket in the cluster dir, which
every namespace sees. So do the run dir and the checkpoints (a shared filesystem).

What tests do with it:

* ``crash(node)``: SIGKILL every process in the node's namespace (slurmd, slurmstepd, the
  tasks), as when the machine dies. Slurm notices only by its silence: SlurmdTimeout=10
  here, so the node is DOWN about 30 s later; a ``--no-kill`` job then loses the node
  (NodeList shrinks) and its steps on it end.
* ``boot(node)``: start its slurmd again; ReturnToService=2 makes it idle once registered.
* ``expansion(job, node)`` then ``merge(grant)``: grow a running allocation onto ``node``,
  Slurm 22.05's only way (SchedulerParameters=permit_job_expansion, on here): a second
  allocation with ``--dependency=expand:JOB`` and no step (``salloc --no-shell``), whose
  ``scontrol update jobid=GRANT NumNodes=0`` hands its node to JOB.

Skipped with the reason where Slurm or network namespaces are missing, failed instead under
``RT_REQUIRE_SLURM=1`` or ``RT_REQUIRE_NETNS=1`` (``make test-all``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.slurm_cluster import SlurmCluster, sbin, skip_or_fail, start_munge, stop, unavailable, write_config

CONTROLLER = "ctl"
SLURMD_TIMEOUT_S = 10
# Enter host NETNS with its own hostname and /etc/hosts, then exec the command:
# sh -c SCRIPT sh HOSTNAME HOSTS_FILE NETNS_PATH ARGV...
_ENTER = 'hostname "$1" && mount --bind "$2" /etc/hosts && ns="$3" && shift 3 && exec nsenter --net="$ns" "$@"'
_GRANTED = re.compile(r"Granted job allocation (\d+)")


@dataclass(frozen=True)
class Node:
    name: str
    host: netns.Host


class SlurmNodes(SlurmCluster):
    """The running multi-node cluster: SlurmCluster's commands (run from the controller's
    host) plus the nodes' lives."""

    def __init__(self, directory: Path, bed: netns.Testbed, nodes: list[Node]) -> None:
        self.bed, self.nodes = bed, {node.name: node for node in nodes}
        self.hosts_file = directory / "hosts"
        super().__init__(directory, client=tuple(self.enter(CONTROLLER, bed.hosts[0])))

    def enter(self, hostname: str, host: netns.Host) -> list[str]:
        """The argv prefix that runs a command on ``host`` as ``hostname`` (module docstring)."""
        return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", _ENTER, "sh",
                hostname, str(self.hosts_file), f"/run/netns/{host.netns}"]

    def boot(self, name: str) -> None:
        """Start node ``name``'s slurmd (it daemonizes; its pid file is slurmd-NAME.pid)."""
        node = self.nodes[name]
        (self.dir / f"spool-{name}").mkdir(exist_ok=True)
        subprocess.run([*self.enter(name, node.host), sbin("slurmd"), "-N", name, "-f", str(self.conf)],
                       env=self.env, check=True, timeout=60)

    def crash(self, name: str) -> list[int]:
        """SIGKILL every process on node ``name`` at once; returns their pids."""
        pids = self.bed.pids(self.nodes[name].host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def allocation(self, job_id: str) -> tuple[str, str]:
        """``(NodeList, NumNodes)`` of the job as ``scontrol show job`` says now."""
        fields = self.show_job(job_id)
        return fields.get("NodeList", "?"), fields.get("NumNodes", "?")

    def expansion(self, job_id: str, name: str) -> str:
        """An allocation of node ``name`` that may be merged into ``job_id``; its job id."""
        done = self.run("salloc", "--no-shell", f"--dependency=expand:{job_id}", "--nodes=1", f"--nodelist={name}",
                        timeout=120)
        granted = _GRANTED.search(done.stderr + done.stdout)
        assert done.returncode == 0 and granted, f"salloc for expanding job {job_id} failed: {done.stderr}"
        return granted.group(1)

    def merge(self, grant: str) -> None:
        """Hand ``grant``'s nodes to the job it expands (``scontrol update ... NumNodes=0``)."""
        done = self.run("scontrol", "update", f"jobid={grant}", "NumNodes=0")
        assert done.returncode == 0, f"merging allocation {grant} failed: {done.stderr}"


def _start(directory: Path, bed: netns.Testbed) -> SlurmNodes:
    controller, *hosts = bed.hosts
    nodes = [Node(f"node{i}", host) for i, host in enumerate(hosts)]
    start_munge(directory)
    (directory / "hosts").write_text(
        "127.0.0.1 localhost\n" + "".join(f"{h.ip} {n}\n" for n, h in [(CONTROLLER, controller)] +
                                          [(node.name, node.host) for node in nodes]))
    write_config(
        directory, controller=f"{CONTROLLER}({controller.ip})", per_node="-%n",
        extra=f"SchedulerParameters=permit_job_expansion\nSlurmdTimeout={SLURMD_TIMEOUT_S}\n",
        nodes=[f"NodeName={node.name} NodeAddr={node.host.ip} CPUs=1 State=UNKNOWN" for node in nodes],
        partition=",".join(node.name for node in nodes),
    )
    cluster = SlurmNodes(directory, bed, nodes)
    subprocess.run([*cluster.enter(CONTROLLER, controller), sbin("slurmctld"), "-i", "-f", str(cluster.conf)],
                   env=cluster.env, check=True, timeout=60)
    for node in nodes:
        cluster.boot(node.name)
    cluster.wait_idle()
    return cluster


def _unavailable() -> str | None:
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} (util-linux) to start a daemon on a network-namespace host"
    return unavailable()


@pytest.fixture
def slurm_nodes(request, tmp_path_factory):
    """Two nodes, node0 and node1, one CPU each (more: ``@pytest.mark.parametrize("slurm_nodes",
    [N], indirect=True)``)."""
    reason = _unavailable()
    if reason:
        skip_or_fail(reason)
    count = getattr(request, "param", 2)
    try:
        bed = netns.create_testbed(count + 1)
    except (netns.NetnsUnavailable, OSError, subprocess.SubprocessError) as exc:
        if netns.required():
            pytest.fail(f"network namespaces unavailable: {exc} ({netns.REQUIRE_ENV}=1)")
        skip_or_fail(f"network namespaces unavailable: {exc}")
    directory = tmp_path_factory.mktemp("slurm-nodes")
    started = time.monotonic()
    try:
        cluster = _start(directory, bed)
        print(f"\nSlurm on {count} netns nodes up in {time.monotonic() - started:.1f} s ({directory})")
        yield cluster
        cluster.run("scancel", "--partition=debug")
    finally:
        stop(directory)
        bed.close()  # whatever still runs on the hosts: slurmstepd, tasks
