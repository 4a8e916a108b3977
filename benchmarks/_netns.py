"""Workers on "hosts" of their own: one network namespace per worker, a ``tc`` cap on its link.

benchmarks/sharded_save_capped.py needs what one machine does not have: a per-host bandwidth
limit between each worker and an object store. This helper builds it from real kernel
parts, so the limit is the network's, not a sleep in our code:

* a bridge ``<tag>br`` in the root namespace holding the host address (``.1`` of the
  subnet), where the S3 server (and a metadata server) listen;
* per worker k a namespace ``<tag>-w<k>`` with its own loopback and one end of a veth pair
  (``<tag>n<k>``, address ``.(k+2)``), the other end (``<tag>h<k>``) on the bridge: the
  workers reach the host and each other over the bridge, in one subnet, with no routing,
  no NAT and no forwarding (``ip_forward`` stays as it is; nothing touches another interface);
* an HTB qdisc on both ends of each veth: ``rate_mbit`` for the worker's traffic to and from
  the store (a u32 filter on the host address and the store's port: the worker's egress on
  its end, its ingress on the bridge's end), and ``peer_mbit`` for everything else (None:
  unshaped; the gradients' all-reduce between workers of a 1 GB model moves ~1 GB per step,
  which a host-to-store cap of 100 Mbit/s is not meant to throttle: a cluster's interconnect
  is not its object store's per-client rate).

``NetnsPlan`` is pure (names, addresses, the ``ip``/``tc`` argv lists), so it is tested
alone (tests/test_benchmarks_netns.py); ``Namespaces`` runs it and always removes what it
made (its ``__exit__``, and the caller's SIGTERM handler raising SystemExit into it).
Everything it creates carries ``tag`` (default ``rtcap<pid>``-like), so a leftover is
recognisable and nothing of anyone else's is touched.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = ["NetnsPlan", "Namespaces"]

_TAG = re.compile(r"[a-z][a-z0-9]{1,8}")
_STORE_CLASS_SENT = re.compile(r"class htb 1:10 .*?\n\s*Sent (\d+) bytes", re.S)


@dataclass(frozen=True)
class NetnsPlan:
    """``workers`` namespaces on ``subnet`` (an IPv4 /24 or larger), store traffic to
    ``store_port`` on the host address capped at ``rate_mbit`` each way per worker."""

    tag: str
    subnet: str
    workers: int
    rate_mbit: float
    store_port: int
    peer_mbit: float | None = None

    def __post_init__(self) -> None:
        if not _TAG.fullmatch(self.tag):
            raise ValueError(f"Received tag={self.tag!r}; expected 2-9 lower-case letters and digits, a letter first")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= 64:
            raise ValueError(f"Received workers={self.workers!r}; expected 1..64")
        network = ipaddress.ip_network(self.subnet)  # ValueError names the bad value
        if network.version != 4 or network.num_addresses < self.workers + 3:
            raise ValueError(f"Received subnet={self.subnet!r} for {self.workers} workers; expected an IPv4 network "
                             "with room for the host, each worker and the broadcast address")
        for name in ("rate_mbit", "peer_mbit"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Received {name}={value!r}; expected Mbit/s > 0")
        if not 0 < self.store_port < 65536:
            raise ValueError(f"Received store_port={self.store_port!r}; expected 1..65535")

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def host(self) -> str:
        """The bridge's address, where the store listens."""
        return str(ipaddress.ip_network(self.subnet).network_address + 1)

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def netns(self, rank: int) -> str:
        return f"{self.tag}-w{rank}"

    def address(self, rank: int) -> str:
        return str(ipaddress.ip_network(self.subnet).network_address + 2 + rank)

    def veth(self, rank: int) -> tuple[str, str]:
        """(the bridge's end, the namespace's end) of rank ``rank``'s link."""
        return f"{self.tag}h{rank}", f"{self.tag}n{rank}"

    def launcher_env(self) -> str:
        """``RT_LOCAL_WORKER_NETNS`` for these namespaces (resilient_train/cluster/worker_netns.py)."""
        return json.dumps([{"netns": self.netns(k), "host": self.address(k)} for k in range(self.workers)])

    def _shape(self, rank: int, *, inside: bool) -> list[list[str]]:
        """HTB on one end of rank's veth: class 1:10 (the store's traffic) at the cap, the rest
        at ``peer_mbit`` (class 1:20) or unshaped (HTB's direct queue: ``default 0``)."""
        host_end, ns_end = self.veth(rank)
        dev = ns_end if inside else host_end
        tc = ["tc", "-n", self.netns(rank)] if inside else ["tc"]
        rate = f"{self.rate_mbit:g}mbit"
        # The worker's egress (inside: to the store's port) / its ingress (the bridge's end: from it).
        match = (["match", "ip", "dst", f"{self.host}/32", "match", "ip", "dport", str(self.store_port), "0xffff"]
                 if inside else
                 ["match", "ip", "src", f"{self.host}/32", "match", "ip", "sport", str(self.store_port), "0xffff"])
        commands = [
            [*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
             "20" if self.peer_mbit is not None else "0", "r2q", "1000"],
            [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate],
            [*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", *match,
             "flowid", "1:10"],
        ]
        if self.peer_mbit is not None:
            peer = f"{self.peer_mbit:g}mbit"
            commands.insert(2, [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb",
                                "rate", peer, "ceil", peer])
        return commands

    def setup(self) -> list[list[str]]:
        """The argv lists that build everything, in order."""
        commands = [
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.host}/{self.prefix_len}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ]
        for rank in range(self.workers):
            netns, (host_end, ns_end) = self.netns(rank), self.veth(rank)
            commands += [
                ["ip", "netns", "add", netns],
                ["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end],
                ["ip", "link", "set", ns_end, "netns", netns],
                ["ip", "link", "set", host_end, "master", self.bridge],
                ["ip", "link", "set", host_end, "up"],
                ["ip", "-n", netns, "addr", "add", f"{self.address(rank)}/{self.prefix_len}", "dev", ns_end],
                ["ip", "-n", netns, "link", "set", ns_end, "up"],
                ["ip", "-n", netns, "link", "set", "lo", "up"],
                *self._shape(rank, inside=False),
                *self._shape(rank, inside=True),
            ]
        return commands

    def teardown(self) -> list[list[str]]:
        """The argv lists that remove everything (each may fail: it may never have been made).
        Deleting a namespace deletes its veth end, which deletes the pair; the bridge last."""
        return [*(["ip", "netns", "delete", self.netns(k)] for k in range(self.workers)),
                *(["ip", "link", "delete", self.veth(k)[0]] for k in range(self.workers)),
                ["ip", "link", "delete", self.bridge]]


def _subnet_in_use(subnet: str) -> str | None:
    """An address or route of the root namespace inside ``subnet``, or None."""
    network = ipaddress.ip_network(subnet)
    shown = subprocess.run(["ip", "-j", "route", "show", "table", "all"], capture_output=True, text=True, check=True)
    for route in json.loads(shown.stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst not in ("default", "multicast") and not dst.startswith(("fe80", "ff00")):
            try:
                if ipaddress.ip_network(dst, strict=False).overlaps(network):
                    return f"route {dst} dev {route.get('dev')}"
            except (ValueError, TypeError):
                continue
    return None


class Namespaces:
    """Build ``plan`` on enter, remove it on exit (whatever happened in between)."""

    def __init__(self, plan: NetnsPlan) -> None:
        self.plan = plan
        self.made = False

    def __enter__(self) -> "Namespaces":
        used = _subnet_in_use(self.plan.subnet)
        if used is not None:
            raise RuntimeError(f"subnet {self.plan.subnet} is in use on this host ({used}); pass another --subnet")
        existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        if any(line.split()[0] == self.plan.netns(0) for line in existing.splitlines() if line.strip()):
            raise RuntimeError(f"namespace {self.plan.netns(0)} exists already (a run with tag {self.plan.tag}?)")
        self.made = True
        try:
            for argv in self.plan.setup():
                done = subprocess.run(argv, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> list[str]:
        """Remove everything; the commands that failed for another reason than absence."""
        failed = []
        for argv in self.plan.teardown():
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0 and not re.search(r"[Cc]annot find|No such file|does not exist", done.stderr):
                failed.append(f"{' '.join(argv)}: {done.stderr.strip()}")
        self.made = False
        return failed

    def __exit__(self, *exc: Any) -> None:
        if self.made:
            self.remove()

    def stats(self) -> dict[str, Any]:
        """Bytes and packets each worker's store class (1:10) passed, each way, by rank: proof
        the cap shaped the store's traffic (``tc -s class show``; its ``-j`` prints no JSON for
        HTB classes in the iproute2 here, so the text's "Sent N bytes")."""
        result: dict[str, Any] = {}
        for rank in range(self.plan.workers):
            host_end, ns_end = self.plan.veth(rank)
            row = {}
            for direction, argv in (("to_worker", ["tc", "-s", "class", "show", "dev", host_end]),
                                    ("from_worker", ["tc", "-n", self.plan.netns(rank), "-s", "class", "show",
                                                     "dev", ns_end])):
                done = subprocess.run(argv, capture_output=True, text=True)
                sent = _STORE_CLASS_SENT.search(done.stdout) if done.returncode == 0 else None
                row[direction] = int(sent[1]) if sent else None
            result[str(rank)] = row
        return result
