"""Local workers in network namespaces: one host standing in for several, each with its own link.

The local launcher runs every worker on this host, over loopback, so nothing it measures is
limited the way a host's network is. A benchmark that needs a real per-host link (a ``tc``
rate limit on each worker's traffic to an object store: benchmarks/sharded_save_capped.py)
makes one network namespace per worker, joined to the host by a veth pair on a bridge, and
tells the local launcher about them in ``RT_LOCAL_WORKER_NETNS``: a JSON list, one entry per
rank, ``[{"netns": "rtcap-w0", "host": "10.213.0.2"}, ...]``. The launcher then starts rank
k as ``ip netns exec <netns> python -m ...`` (``ip`` replaces itself with the worker: same
pid, same signals) and names ``<host>:<port>`` as its TF_CONFIG address, so MWMS traffic
between the workers crosses the namespaces' links too. The supervisor stays in the root
namespace; the run dir is the same filesystem.

What this module refuses: an entry that is not a namespace name ``ip`` accepts or whose
host is not an IP address literal (a name would be resolved inside the namespace, where
no resolver may answer), and duplicate namespaces or hosts. It does not create, check or
remove namespaces: whoever sets the variable owns them (the benchmark does, and removes
them on every exit). Warm standbys are forked in the root namespace, so the launcher runs
without them while the variable is set (``standby_disabled``).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from resilient_train.errors import ConfigError

__all__ = ["LOCAL_WORKER_NETNS", "WorkerNetns", "parse_worker_netns", "worker_netns_from", "wrap_argv"]

LOCAL_WORKER_NETNS = "RT_LOCAL_WORKER_NETNS"
"""The supervisor's environment variable naming each local rank's network namespace and host."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_EXPECTED = ('expected a JSON list, one entry per rank: [{"netns": "NAME", "host": "IP"}, ...] '
             "(NAME: letters, digits, _ . -; IP: an address literal)")


@dataclass(frozen=True)
class WorkerNetns:
    """Where one local rank runs: the network namespace ``netns``, reachable at ``host``."""

    netns: str
    host: str

    def __post_init__(self) -> None:
        if not isinstance(self.netns, str) or not _NAME.fullmatch(self.netns):
            raise ValueError(f"Received netns={self.netns!r}; expected a name of letters, digits, _ . - (<= 64)")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ValueError(f"Received host={self.host!r}; expected an IP address literal") from None

    def address(self, port: int) -> str:
        """The TF_CONFIG ``host:port`` of this rank (IPv6 in brackets)."""
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"


def parse_worker_netns(text: str) -> tuple[WorkerNetns, ...]:
    """The entries of ``RT_LOCAL_WORKER_NETNS``; ConfigError naming the bad value otherwise."""
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Received {LOCAL_WORKER_NETNS}={text[:200]!r} ({exc.msg}); {_EXPECTED}") from None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"Received {LOCAL_WORKER_NETNS}={text[:200]!r}; {_EXPECTED}")
    slots = []
    for rank, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"netns", "host"}:
            raise ConfigError(f"Received {LOCAL_WORKER_NETNS} entry {rank} = {entry!r}; {_EXPECTED}")
        try:
            slots.append(WorkerNetns(entry["netns"], entry["host"]))
        except ValueError as exc:
            raise ConfigError(f"{LOCAL_WORKER_NETNS} entry {rank}: {exc}") from None
    for field in ("netns", "host"):
        values = [getattr(slot, field) for slot in slots]
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise ConfigError(f"Received {LOCAL_WORKER_NETNS} with {field} {repeated[0]!r} for more than one rank; "
                              "expected one namespace and one host per rank")
    return tuple(slots)


def worker_netns_from(environ: Mapping[str, str]) -> tuple[WorkerNetns, ...]:
    """The namespaces ``environ`` names (empty: every worker in the supervisor's own)."""
    text = environ.get(LOCAL_WORKER_NETNS, "").strip()
    return parse_worker_netns(text) if text else ()


def wrap_argv(argv: Sequence[str], slots: Sequence[WorkerNetns], rank: int, *, ip: str = "ip") -> list[str]:
    """``argv`` run inside rank ``rank``'s namespace (``argv`` itself without namespaces);
    ConfigError when the variable names fewer namespaces than the attempt has ranks."""
    if not slots:
        return list(argv)
    if not 0 <= rank < len(slots):
        raise ConfigError(f"Received {LOCAL_WORKER_NETNS} with {len(slots)} entries for rank {rank}; "
                          "expected one entry per rank")
    return [ip, "netns", "exec", slots[rank].netns, *argv]
