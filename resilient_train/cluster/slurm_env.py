"""TF_CONFIG from the Slurm environment, by TensorFlow's ``SlurmClusterResolver`` rules.

A site that launches its own ``srun`` runs ``resilient-train worker RECIPE --tf-config-from
slurm`` in every task; the Slurm launcher (supervisor/launchers/slurm.py) does the same. Each
task derives the same cluster from variables Slurm sets for every task of a step:

* ``SLURM_PROCID``: the task's rank in the step = its worker index (rank 0 is the chief);
* ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``): the step's nodes in the compressed
  hostlist syntax (``node[01-03,07],gpu-a``), expanded here without calling ``scontrol``
  so that it works (and is tested) on a host without Slurm;
* ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``): ``2(x3),1`` = 2 tasks on
  each of the first three nodes, 1 on the fourth;
* ports: ``port_base + local task id`` on each node, so tasks sharing a node never collide.

As in ``SlurmClusterResolver``, tasks are numbered node by node (Slurm's default *block*
distribution): ranks 0..k-1 on the first node, and so on. A step launched with another
``--distribution`` would give a TF_CONFIG that disagrees with SLURM_PROCID, so the task
checks that its own host and local id sit at its rank and refuses otherwise.

No TensorFlow import here: TF_CONFIG must be in the environment before TensorFlow starts.
"""

from __future__ import annotations

import json
import re
from typing import Mapping

import hostlist

from resilient_train.cluster.tf_config import build_tf_config
from resilient_train.errors import ConfigError

__all__ = ["DEFAULT_PORT_BASE", "compress_hostlist", "expand_hostlist", "expand_tasks_per_node", "slurm_addresses", "tf_config_from_slurm", "tf_config_json"]

DEFAULT_PORT_BASE = 8888  # SlurmClusterResolver's default

_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_hostlist(text: str) -> list[str]:
    """``"n[01-02,5],login"`` -> ``["n01", "n02", "n5", "login"]`` (order kept, padding kept).

    Parsed by python-hostlist (the parser of Slurm-aware tools); errors become ConfigError.
    """
    try:
        hosts = hostlist.expand_hostlist(text.strip(), allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ConfigError(f"Received Slurm node list {text!r}; {exc}; expected hostnames such as 'node[01-04]'") from None
    if not hosts:
        raise ConfigError(f"Received Slurm node list {text!r}; expected hostnames such as 'node[01-04]'")
    return hosts


def compress_hostlist(hosts: list[str]) -> str:
    """``["n01", "n02", "login"]`` -> ``"login,n[01-02]"``: the compressed syntax Slurm reads."""
    return hostlist.collect_hostlist(hosts)


def expand_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _REPEAT.match(item.strip())
        if match is None:
            raise ConfigError(f"Received Slurm tasks per node {text!r}; expected e.g. '2(x3),1'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_addresses(hosts: list[str], tasks_per_node: list[int], port_base: int) -> list[str]:
    """Every task's ``host:port`` in rank order (block distribution)."""
    if len(hosts) != len(tasks_per_node):
        raise ConfigError(
            f"Slurm lists {len(hosts)} node(s) {hosts} but tasks per node for {len(tasks_per_node)}: "
            f"{tasks_per_node}; expected one count per node"
        )
    return [f"{host}:{port_base + local}" for host, count in zip(hosts, tasks_per_node) for local in range(count)]


def tf_config_from_slurm(environ: Mapping[str, str], *, port_base: int = DEFAULT_PORT_BASE) -> dict:
    """TF_CONFIG for the Slurm task whose environment is ``environ``; ConfigError if not one."""
    if not 1 <= port_base <= 65535:
        raise ConfigError(f"Received port_base={port_base!r}; expected a TCP port 1..65535")
    procid = _int_var(environ, "SLURM_PROCID")
    nodelist = _first_var(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
    per_node = _first_var(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    counts = expand_tasks_per_node(per_node)
    addresses = slurm_addresses(expand_hostlist(nodelist), counts, port_base)
    if port_base + max(counts) - 1 > 65535:
        raise ConfigError(f"Received port_base={port_base}; ports past 65535 for {per_node} tasks per node")
    if not 0 <= procid < len(addresses):
        raise ConfigError(f"SLURM_PROCID={procid} is outside the step's {len(addresses)} task(s) ({nodelist}, {per_node})")
    _check_block_distribution(environ, addresses[procid], port_base)
    return build_tf_config(addresses, procid)


def _check_block_distribution(environ: Mapping[str, str], address: str, port_base: int) -> None:
    """The task's own node and local id must be where block order puts its rank."""
    node, local = environ.get("SLURMD_NODENAME"), environ.get("SLURM_LOCALID")
    if node is None or local is None or not local.isdigit():
        return  # not told; trust the rank (SlurmClusterResolver does not check either)
    if address != f"{node}:{port_base + int(local)}":
        raise ConfigError(
            f"Slurm task {environ.get('SLURM_PROCID')} runs on {node} as local task {local}, but block "
            f"order puts it at {address}; launch the step with --distribution=block"
        )


def _first_var(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        if environ.get(name):
            return environ[name]
    raise ConfigError(f"{' / '.join(names)} not set; --tf-config-from slurm works only inside a Slurm task (srun)")


def _int_var(environ: Mapping[str, str], name: str) -> int:
    value = _first_var(environ, name)
    if not value.isdigit():
        raise ConfigError(f"Received {name}={value!r}; expected a task number >= 0")
    return int(value)


def tf_config_json(environ: Mapping[str, str], *, port_base: int = DEFAULT_PORT_BASE) -> str:
    """The TF_CONFIG string for ``environ`` (what the worker puts in its environment)."""
    return json.dumps(tf_config_from_slurm(environ, port_base=port_base))


# ------------------------------------------------------------ the worker's flags
TF_CONFIG_SOURCES = ("env", "slurm")


def add_tf_config_arguments(parser) -> None:
    """``--tf-config-from`` and ``--port-base`` (``resilient-train worker`` and the runner)."""
    parser.add_argument(
        "--tf-config-from", choices=TF_CONFIG_SOURCES, default="env",
        help="env (default): TF_CONFIG as set by your launcher; slurm: built from the Slurm task's environment",
    )
    parser.add_argument(
        "--port-base", type=int, default=DEFAULT_PORT_BASE, metavar="PORT",
        help=f"with --tf-config-from slurm: task i on a node listens on PORT+i (default {DEFAULT_PORT_BASE})",
    )


def environ_with_tf_config(environ: Mapping[str, str], source: str, port_base: int) -> Mapping[str, str]:
    """``environ`` with TF_CONFIG from ``source``; ``env`` leaves it as it is."""
    if source == "env":
        return environ
    if source != "slurm":
        raise ConfigError(f"Received --tf-config-from {source!r}; expected one of {list(TF_CONFIG_SOURCES)}")
    return {**environ, "TF_CONFIG": tf_config_json(environ, port_base=port_base)}
