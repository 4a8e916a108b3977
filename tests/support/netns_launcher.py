"""A test launcher that runs each rank on its own network-namespace "host" (tests/support/netns.py).

Behind the launcher seam (supervisor/launchers/api.py) it does what a multi-node launcher
does, with namespaces for nodes:

* **placement**: each attempt takes the first ``workers`` hosts whose switch port is up
  (the switch's link state is its health check, as Ray's GCS health check is for the Ray
  launcher); a cut host is skipped, so a third host is the spare. TF_CONFIG lists each
  host's own address (10.231.0.x), never 127.0.0.1: a rank that bound or dialled loopback
  would not find its peers.
* **starting**: the supervisor's worker command behind ``ip netns exec HOST`` (which execs
  it: the handle's pid is the worker), with the parent-death signal like a local worker.
  The run dir is a shared local path, so there is nothing to bring back, except its
  ``local/`` (per-host scratch and the host's checkpoint cache, never shared between real
  hosts): each host gets its own, bind-mounted over ``<run dir>/local`` in the private
  mount namespace ``ip netns exec`` makes (the mount never shows in the root namespace).
  So a spare host starts with an empty cache and restores from the storage.
* **killing**: the supervisor signals the pid; the kernel is shared, so a kill reaches a
  partitioned worker (on real machines it might not: that is what generation fencing is
  for, and what the partition test checks from the manifests).

No warm standbys: a local pool's processes belong to no host, so ``--no-warm-standby`` is
required (a ConfigError otherwise, before any worker starts).

Run as the supervisor's entry point, in the root namespace::

    python -m tests.support.netns_launcher --switch NETNS --scratch DIR --host NETNS=IP@PORT ... RECIPE [run flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from resilient_train.cluster.tf_config import build_tf_config
from resilient_train.errors import ConfigError, RestartNotPlacedError
from resilient_train.job.config import JobConfig
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor._process import die_with_parent_hook
from resilient_train.supervisor.launchers.api import Launcher, WorkerHandle, WorkerSpec
from tests.support.netns import port_is_up

__all__ = ["NetnsHost", "NetnsLauncher", "main"]

# sh -c SCRIPT netns-host HOST_LOCAL RUN_LOCAL ARGV...: the host's own local/, then exec ARGV.
_OWN_LOCAL = 'mkdir -p "$1" "$2" && mount --bind "$1" "$2" && shift 2 && exec "$@"'
WORKER_PORT = 23456  # every host has its own port space; a fresh namespace has all ports free


@dataclass(frozen=True)
class NetnsHost:
    netns: str
    ip: str
    port: str  # its port on the switch (see netns.Host.port)


class NetnsLauncher(Launcher):
    name = "netns"

    def __init__(self, job: JobConfig, hosts: list[NetnsHost], switch: str, scratch: Path, *,
                 python: str = sys.executable) -> None:
        self.job = job
        self.hosts = hosts
        self.switch = switch
        self.scratch = scratch
        self.python = python
        self._placed: dict[int, tuple[NetnsHost, str]] = {}  # pid -> (host, address)

    def prepare(self) -> None:
        if self.job.warm_standby:
            raise ConfigError("Received warm_standby=true; the netns test launcher needs --no-warm-standby")
        if len(self.hosts) < self.job.workers:
            raise ConfigError(f"Received workers={self.job.workers}; the test bed has {len(self.hosts)} hosts")

    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        healthy = [host for host in self.hosts if port_is_up(self.switch, host.port)]
        if len(healthy) < len(specs):
            down = [h.netns for h in self.hosts if h not in healthy]
            raise RestartNotPlacedError(f"{len(specs)} workers, {len(healthy)} reachable hosts (down: {down})")
        placement = healthy[: len(specs)]
        addresses = [f"{host.ip}:{WORKER_PORT}" for host in placement]
        handles: list[WorkerHandle] = []
        for spec, host in zip(specs, placement):
            env = {**os.environ, **spec.env, "TF_CONFIG": json.dumps(build_tf_config(addresses, spec.rank))}
            argv = ["ip", "netns", "exec", host.netns, "sh", "-c", _OWN_LOCAL, "netns-host",
                    str(self.scratch / host.netns / "local"), str(RunDir(Path(self.job.run_dir).resolve()).local),
                    self.python, "-m", "resilient_train.runner", "--job", str(spec.job_path)]
            handle = _spawn(argv, env, spec.log_path)
            self._placed[handle.pid] = (host, addresses[spec.rank])
            handles.append(handle)
        return handles

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        host, address = self._placed[handle.pid]
        return {"node": host.netns, "node_ip": host.ip, "address": address}


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent_hook())


def _host(text: str) -> NetnsHost:
    netns, _, rest = text.partition("=")
    ip, _, port = rest.partition("@")
    if not (netns and ip and port):
        raise argparse.ArgumentTypeError(f"Received --host {text!r}; expected NETNS=IP@SWITCHPORT")
    return NetnsHost(netns, ip, port)


def main(argv: list[str] | None = None) -> int:
    from resilient_train.job.config import add_job_arguments, job_from_args
    from resilient_train.job.preflight import preflight
    from resilient_train.supervisor.supervisor import Supervisor

    parser = argparse.ArgumentParser(prog="netns_launcher")
    parser.add_argument("--host", type=_host, action="append", required=True, dest="hosts")
    parser.add_argument("--switch", required=True)
    parser.add_argument("--scratch", type=Path, required=True, help="per-host directories: SCRATCH/NETNS")
    parser.add_argument("recipe")
    add_job_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    job = job_from_args(args)
    preflight(job)
    try:
        return Supervisor(job, launcher=NetnsLauncher(job, args.hosts, args.switch, args.scratch)).run()
    except ConfigError as exc:
        print(f"netns_launcher: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
