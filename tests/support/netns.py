"""A few "hosts" on this machine, each its own Linux network namespace, for real partitions.

Layout of one test bed (names are unique per test bed, so parallel test runs never meet)::

    rt<pid>x<k>-sw          the switch: a namespace holding bridge ``br0`` and one port per host
      br0 -- p0 ... pN-1    p<i> is one end of a veth pair
    rt<pid>x<k>-h<i>        host i: the other end, ``eth0``, with 10.231.0.<10+i>/24, and ``lo``

Every address exists only inside these namespaces: the root namespace (where pytest and
the supervisor run) gets no interface, route or address, and each test bed has its own
switch, so two test beds may use the same subnet without seeing each other. A process
runs on a host through ``ip netns exec`` (``exec_argv``), which execs the command, so the
pid a launcher gets is the process itself. Files are shared: a host sees this machine's
file systems, so the run dir and local checkpoint storage need no copying. What must not
be shared between real hosts gets a per-host directory, ``Host.scratch`` (under the test
bed's ``scratch`` root, removed by ``close()``), which a launcher bind-mounts inside the
host's private mount namespace (tests/support/netns_launcher.py: the run dir's ``local/``).

``cut(host)`` sets the host's ``eth0`` down: from then on no packet leaves or reaches it
(its peers' TCP connections to it hang, as in a real partition; its processes keep
running). ``port_up(host)`` is what a switch would report for the host's port, the health
signal a launcher may place on (tests/support/netns_launcher.py).

``close()`` kills what still runs inside the namespaces and deletes them; it is idempotent
and runs from the fixture's ``finally`` even when the test failed. Deleting a namespace
destroys both ends of its veth pairs, so nothing is left behind. A test process killed
before its ``finally`` leaves its namespaces; the next test bed deletes those whose pid
is gone (``sweep_leftovers``).

Where namespaces cannot be made (no ``ip`` from iproute2, not root, no CAP_SYS_ADMIN in a
container), ``netns_testbed`` skips with the reason, unless ``RT_REQUIRE_NETNS=1``
(``make test-all``): then it fails, so a CI that must run the partition tests cannot
silently skip them.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUBNET = "10.231.0"
PREFIX_LEN = 24
FIRST_HOST_OCTET = 10
REQUIRE_ENV = "RT_REQUIRE_NETNS"
_IP_TIMEOUT_S = 20
_serial = itertools.count()
_NAME_RE = re.compile(r"^rt(\d+)x\d+-(?:sw|h\d+)$")  # see create_testbed
_SCRATCH_RE = re.compile(r"^rt(\d+)x\d+-\w+$")  # tempfile.mkdtemp(prefix="rt<pid>x<k>-")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class Host:
    """One "host": a namespace with one interface on the test bed's switch."""

    index: int
    netns: str
    ip: str
    port: str  # its port (veth end) in the switch namespace
    scratch: Path  # this host's own disk (see the module docstring)
    link: str = "eth0"  # its interface, inside its namespace

    @property
    def name(self) -> str:
        return f"host{self.index}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if check and proc.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def port_is_up(switch: str, port: str) -> bool:
    """Whether the switch port ``port`` has carrier (its host's link is up)."""
    flags = _ip("-n", switch, "-o", "link", "show", "dev", port).stdout.split(">", 1)[0]
    return "LOWER_UP" in flags and "NO-CARRIER" not in flags


@dataclass
class Testbed:
    switch: str
    scratch: Path
    hosts: list[Host] = field(default_factory=list)
    closed: bool = False

    def exec_argv(self, host: Host, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` (the same process: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", host.netns, *argv]

    def cut(self, host: Host) -> None:
        """Partition ``host``: its only link goes down (its processes keep running)."""
        _ip("-n", host.netns, "link", "set", host.link, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", host.netns, "link", "set", host.link, "up")

    def port_up(self, host: Host) -> bool:
        """The switch's view of ``host``'s port: False once the host's link is down."""
        return port_is_up(self.switch, host.port)

    def launcher_args(self) -> list[str]:
        """The flags that give tests/support/netns_launcher.py these hosts."""
        args = ["--switch", self.switch, "--scratch", str(self.scratch)]
        for host in self.hosts:
            args += ["--host", f"{host.netns}={host.ip}@{host.port}"]
        return args

    def pids(self, host: Host) -> list[int]:
        """Processes living in ``host``'s namespace now."""
        out = _ip("netns", "pids", host.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        """Kill what still runs on the hosts, delete every namespace (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts:
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in [h.netns for h in self.hosts] + [self.switch]:
            _ip("netns", "delete", name, check=False)
        shutil.rmtree(self.scratch, ignore_errors=True)


def create_testbed(hosts: int) -> Testbed:
    """A switch and ``hosts`` hosts on it, their link checked; NetnsUnavailable if impossible."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("no `ip` command (install iproute2)")
    if os.geteuid() != 0:
        raise NetnsUnavailable(f"network namespaces need root (this test runs as uid {os.geteuid()})")
    sweep_leftovers()
    tag = f"rt{os.getpid()}x{next(_serial)}"
    bed = Testbed(switch=f"{tag}-sw", scratch=Path(tempfile.mkdtemp(prefix=f"{tag}-")))
    try:
        _ip("netns", "add", bed.switch)
        _ip("-n", bed.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", bed.switch, "link", "set", "br0", "up")
        for i in range(hosts):
            netns = f"{tag}-h{i}"
            host = Host(index=i, netns=netns, ip=f"{SUBNET}.{FIRST_HOST_OCTET + i}", port=f"p{i}",
                        scratch=bed.scratch / netns)
            host.scratch.mkdir()
            _ip("netns", "add", host.netns)
            bed.hosts.append(host)
            # Both ends are born in their namespaces: no name ever exists in the root one.
            _ip("link", "add", host.port, "netns", bed.switch, "type", "veth",
                "peer", "name", host.link, "netns", host.netns)
            _ip("-n", bed.switch, "link", "set", host.port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.ip}/{PREFIX_LEN}", "dev", host.link)
            _ip("-n", host.netns, "link", "set", host.link, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        _check_traffic(bed)
    except BaseException:
        bed.close()
        raise
    return bed


def sweep_leftovers() -> list[str]:
    """Delete the namespaces and scratch directories of test beds whose test process is
    gone (killed before its ``finally``); a live process's beds are never touched. Returns
    the namespaces deleted."""
    listed = _ip("netns", "list", check=False).stdout.split()
    gone = []
    for name in listed:
        match = _NAME_RE.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _ip("netns", "delete", name, check=False)
        gone.append(name)
    for scratch in Path(tempfile.gettempdir()).glob("rt*x*-*"):
        match = _SCRATCH_RE.match(scratch.name)
        if match is not None and scratch.is_dir() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(scratch, ignore_errors=True)
    return gone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_traffic(bed: Testbed) -> None:
    """Host 0 opens a TCP connection to every other host (no ping on a slim image)."""
    if len(bed.hosts) < 2:
        return
    server = "import socket,sys;s=socket.create_server((sys.argv[1],7));s.settimeout(20);print('up',flush=True);s.accept()"
    client = "import socket,sys;socket.create_connection((sys.argv[1],7),timeout=5).close()"
    for host in bed.hosts[1:]:
        listener = subprocess.Popen(bed.exec_argv(host, [sys.executable, "-c", server, host.ip]),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if listener.stdout.readline().strip() != "up":
                raise NetnsUnavailable(f"a listener on {host.name} ({host.ip}) did not start: {listener.stderr.read().strip()}")
            probe = subprocess.run(bed.exec_argv(bed.hosts[0], [sys.executable, "-c", client, host.ip]),
                                   capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
            if probe.returncode != 0:
                raise NetnsUnavailable(
                    f"{bed.hosts[0].name} cannot reach {host.name} at {host.ip}:7 through the bridge: "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
            listener.wait(timeout=_IP_TIMEOUT_S)
        finally:
            if listener.poll() is None:
                listener.kill()
                listener.wait()


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


@pytest.fixture
def netns_testbed(request) -> Iterator[Testbed]:
    """Three hosts (override: ``@pytest.mark.parametrize("netns_testbed", [N], indirect=True)``)."""
    hosts = getattr(request, "param", 3)
    started = time.monotonic()
    bed, reason = None, ""
    try:
        bed = create_testbed(hosts)
    except (NetnsUnavailable, OSError, subprocess.SubprocessError) as exc:
        reason = f"network namespaces unavailable: {exc}"
    if bed is None:
        if required():
            pytest.fail(f"{reason} ({REQUIRE_ENV}=1: this run must not skip the network-namespace tests)")
        pytest.skip(reason)
    print(f"\nnetns test bed {bed.switch} with {hosts} hosts up in {time.monotonic() - started:.2f} s")
    try:
        yield bed
    finally:
        bed.close()
