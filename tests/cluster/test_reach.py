"""cluster/reach.py: a worker waits for its peers' TF_CONFIG addresses, then names the one it could not reach."""

from __future__ import annotations

import socket

import pytest

from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.reach import (PROBE_EVERY_S, PortPlaceholder, serves_http2, split_address, wait_for_peers,
                                           wait_for_server)
from resilient_train.errors import EXIT_FAILURE, PeerUnreachableError, exit_code_for


class FakeNetwork:
    """Connect answers per address, on a fake clock that each probe and sleep advance."""

    def __init__(self, refuse_until: dict[str, float], *, connect_cost_s: float = 0.01) -> None:
        self.refuse_until = refuse_until
        self.connect_cost_s = connect_cost_s
        self.now = 0.0
        self.probes: list[tuple[float, str]] = []

    def connect(self, host: str, port: int, timeout: float) -> None:
        address = f"{host}:{port}"
        self.probes.append((self.now, address))
        self.now += self.connect_cost_s
        if self.now < self.refuse_until.get(address, 0.0):
            raise ConnectionRefusedError(111, "Connection refused")

    def sleep(self, seconds: float) -> None:
        self.now += seconds


ADDRESSES = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]


def _wait(net: FakeNetwork, rank: int, timeout_s: float) -> float:
    return wait_for_peers(ADDRESSES, rank, timeout_s, connect=net.connect, clock=lambda: net.now, sleep=net.sleep)


def test_a_peer_that_starts_late_is_waited_for_and_this_rank_is_not_probed():
    net = FakeNetwork({"10.0.0.1:2222": 1.0})
    waited = _wait(net, rank=2, timeout_s=5)
    assert 1.0 <= waited < 1.0 + PROBE_EVERY_S + 0.1
    probed = {address for _, address in net.probes}
    assert probed == {"10.0.0.1:2222", "10.0.0.2:2222"}
    assert [a for _, a in net.probes].count("10.0.0.2:2222") == 1  # reached once, not asked again


def test_a_peer_starting_a_moment_later_is_reached_within_milliseconds():
    # A restart's peers start within milliseconds: rounds 10, 20, 40 ms apart, then at most 0.25 s.
    net = FakeNetwork({"10.0.0.1:2222": 0.03}, connect_cost_s=0.001)
    waited = _wait(net, rank=1, timeout_s=5)
    assert [round(t, 3) for t, a in net.probes if a == "10.0.0.1:2222"] == [0.0, 0.012, 0.033]
    assert round(waited, 3) == 0.034
    slow = FakeNetwork({"10.0.0.1:2222": 2.0}, connect_cost_s=0.0)
    _wait(slow, rank=1, timeout_s=5)
    gaps = [round(b - a, 3) for (a, _), (b, _) in zip(slow.probes, slow.probes[1:]) if _ == "10.0.0.1:2222"]
    assert gaps[:6] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25] and set(gaps[5:]) == {0.25}


def test_an_unreachable_chief_fails_at_the_deadline_naming_both_ranks_and_the_address():
    net = FakeNetwork({"10.0.0.1:2222": float("inf")})
    with pytest.raises(PeerUnreachableError) as raised:
        _wait(net, rank=1, timeout_s=3)
    assert str(raised.value) == (
        "rank 1 (10.0.0.2:2222) could not reach rank 0 (chief) at 10.0.0.1:2222 within 3 s "
        "(connection refused: nothing listens there); check the address in TF_CONFIG and that no "
        "firewall blocks the port between the two hosts"
    )
    assert 3.0 <= net.now < 3.0 + PROBE_EVERY_S + 0.1  # the deadline, not TensorFlow's hour
    assert exit_code_for(raised.value) == EXIT_FAILURE


def test_several_unreachable_peers_are_all_counted_and_a_timeout_is_named():
    def silent(host: str, port: int, timeout: float) -> None:
        net.now += timeout
        raise socket.timeout("timed out")

    net = FakeNetwork({})
    with pytest.raises(PeerUnreachableError, match=r"^rank 0 \(10.0.0.1:2222\) could not reach rank 1 at 10.0.0.2:2222 "
                       r"\(and 1 more: ranks 2\) within 4 s \(no answer: the connection attempt timed out\)"):
        wait_for_peers(ADDRESSES, 0, 4, connect=silent, clock=lambda: net.now, sleep=net.sleep)


@pytest.mark.parametrize("timeout_s", [0, -1.0])
def test_the_timeout_must_be_positive(timeout_s):
    with pytest.raises(ValueError, match=f"Received timeout_s={timeout_s!r}; expected > 0"):
        wait_for_peers(ADDRESSES, 0, timeout_s)


def test_split_address_takes_ipv6_brackets_off():
    assert split_address("[::1]:2222") == ("::1", 2222)
    assert split_address("node-3.cluster:40001") == ("node-3.cluster", 40001)


def test_two_real_workers_reach_each_other_through_their_placeholders():
    ports = free_ports(2)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    with PortPlaceholder(addresses[0]) as chief, PortPlaceholder(addresses[1]) as worker:
        assert chief.bound and worker.bound
        assert wait_for_peers(addresses, 0, 5) < 5
        assert wait_for_peers(addresses, 1, 5) < 5
    # closed: the port is free for TensorFlow's server (a real bind succeeds at once)
    with socket.socket() as again:
        again.bind(("", ports[0]))


def test_a_closed_port_on_loopback_is_refused_until_the_deadline():
    [closed] = free_ports(1)
    with pytest.raises(PeerUnreachableError, match=f"could not reach rank 0 \\(chief\\) at 127.0.0.1:{closed} within 1 s "
                       r"\(connection refused"):
        wait_for_peers([f"127.0.0.1:{closed}", "127.0.0.1:1"], 1, 1)


def test_a_port_someone_else_holds_is_left_to_tensorflow():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen(1)
        placeholder = PortPlaceholder(f"127.0.0.1:{holder.getsockname()[1]}")
        assert not placeholder.bound
        placeholder.close()
    assert PortPlaceholder(None).bound is False  # a single worker holds nothing


# ------------------------------------------------------------ the chief's server, before a non-chief registers


def test_only_a_real_grpc_server_counts_as_the_chiefs_server():
    """A refused port and a placeholder (connects, never answers) are not the server; a real
    gRPC server (grpcio, the transport TensorFlow's server runs) answers the HTTP/2 preface."""
    import grpc
    from concurrent import futures

    [closed] = free_ports(1)
    assert serves_http2("127.0.0.1", closed, 1.0) is False
    [held] = free_ports(1)
    with PortPlaceholder(f"127.0.0.1:{held}") as placeholder:
        assert placeholder.bound and serves_http2("127.0.0.1", held, 1.0) is False
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert serves_http2("127.0.0.1", port, 1.0) is True
        assert wait_for_server(f"127.0.0.1:{port}", 5.0) is True
    finally:
        server.stop(None)


def test_the_wait_for_the_server_probes_every_few_ms_and_gives_up_at_its_deadline():
    now = [0.0]
    probes: list[float] = []

    def probe(host: str, port: int, timeout: float) -> bool:
        probes.append(round(now[0], 3))
        now[0] += 0.001
        return now[0] > 0.02

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert wait_for_server("10.0.0.1:2222", 5.0, probe=probe, clock=lambda: now[0], sleep=sleep) is True
    assert probes == [0.0, 0.006, 0.012, 0.018, 0.024]  # 1 ms per probe, 5 ms between: the 1 s backoff is what it avoids
    now[0], probes[:] = 0.0, []
    never = lambda host, port, timeout: False  # noqa: E731
    assert wait_for_server("10.0.0.1:2222", 0.5, probe=never, clock=lambda: now[0], sleep=sleep) is False
    assert now[0] == pytest.approx(0.5)
