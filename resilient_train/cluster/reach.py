"""Before the strategy: can this worker reach every peer's address from TF_CONFIG?

A worker that cannot reach the chief (a firewall between nodes, a wrong address, a node
on another network) otherwise sits in TensorFlow's cluster registration, which waits up
to an hour and then says little about who could not reach whom. :func:`wait_for_peers`
asks the network first, in plain TCP, and fails within the deadline with one line naming
this rank, the peer's rank and its ``host:port``
(:class:`~resilient_train.errors.PeerUnreachableError`).

Peers may still be starting, so a refused or timed-out connection is retried until the
deadline; only the deadline fails. Every worker probes before its TensorFlow server
exists, so each one also *listens* on its own TF_CONFIG port while it probes and until
just before the strategy takes the port over (:class:`PortPlaceholder`): otherwise every
worker would wait for servers that start only after the wait. The placeholder never
accepts: a peer's connect completes in the kernel's backlog, and closing the socket
resets it, leaving nothing in TIME_WAIT on the port TensorFlow binds next.

What it proves is TCP reachability of each ``host:port`` from this host, both ways once
every worker has passed (each probes all others). It does not prove the gRPC handshake;
TensorFlow's own registration wait, bounded by the start-up timeout
(``runner/training/strategy.py``), covers what comes after.

Then, right before its strategy, a non-chief waits until the chief's TensorFlow server
answers (:func:`wait_for_server`). A worker whose registration reaches the chief's port
before that server listens (refused, or the chief's placeholder) waits out gRPC's reconnect
backoff, one second, before it tries again: on a warm restart, where both workers reach the
strategy within milliseconds, that second was the largest part of the ``strategy`` phase
in half the restarts (0.83-1.23 s against 0.05-0.07 s; benchmarks/README.md). The probe
speaks the first bytes of HTTP/2, which gRPC runs on: a server answers the client's
connection preface with its SETTINGS frame, a placeholder never answers.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from resilient_train.errors import PeerUnreachableError

__all__ = ["PortPlaceholder", "wait_for_peers", "wait_for_server", "serves_http2", "split_address", "PROBE_EVERY_S",
           "FIRST_PROBE_GAP_S", "REACH_SHARE"]

# The share of ``--startup-timeout`` a worker waits for its peers: the rest leaves the
# worker's clear error ahead of the supervisor's start-up allowance (supervisor/watchdog.py).
REACH_SHARE = 0.5
PROBE_EVERY_S = 0.25  # between two rounds over the peers not reached yet, at most ...
FIRST_PROBE_GAP_S = 0.01  # ... after a first gap this short, doubled each round: peers of a
# restart start within milliseconds of each other, and a first wait of 0.25 s was 0.25 s of
# every warm restart (the median reach_peers phase, benchmarks/recovery.py, 2026-11-26)
_CONNECT_TIMEOUT_S = 2.0  # one connect; a black-holed SYN waits this long, then retries
# The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type a server's preface starts with
_ANSWER_MIN_S = 0.05  # a server's SETTINGS frame arrives within this, or 4 round trips of the connect
_SERVER_PROBE_GAP_S = 0.005  # between two probes of the chief's port


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) -> ``(host, port)``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _connect(host: str, port: int, timeout: float) -> None:
    with socket.create_connection((host, port), timeout=timeout):
        pass


@dataclass
class _Peer:
    rank: int
    address: str
    last_error: str = "no answer"


def wait_for_peers(
    addresses: Sequence[str],
    rank: int,
    timeout_s: float,
    *,
    connect: Callable[[str, int, float], None] = _connect,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Return once every other rank's address accepted a TCP connection; the seconds it took.

    ``addresses`` are all ranks' ``host:port`` in rank order. Raises PeerUnreachableError
    naming the lowest rank still unreached (and how many others) after ``timeout_s``.
    """
    if not timeout_s > 0:
        raise ValueError(f"Received timeout_s={timeout_s!r}; expected > 0")
    start = clock()
    deadline = start + timeout_s
    pending = [_Peer(r, a) for r, a in enumerate(addresses) if r != rank]
    gap = FIRST_PROBE_GAP_S
    while True:
        for peer in list(pending):
            host, port = split_address(peer.address)
            left = deadline - clock()
            try:
                connect(host, port, max(0.05, min(_CONNECT_TIMEOUT_S, left)))
            except OSError as exc:
                peer.last_error = _reason(exc)
            else:
                pending.remove(peer)
        if not pending:
            return clock() - start
        if clock() >= deadline:
            raise PeerUnreachableError(_message(rank, addresses, pending, timeout_s))
        sleep(min(gap, max(0.0, deadline - clock())))
        gap = min(PROBE_EVERY_S, gap * 2)


def serves_http2(host: str, port: int, timeout: float) -> bool:
    """Does an HTTP/2 server (gRPC's transport) answer on ``host:port`` within ``timeout``?

    True when the first frame back is SETTINGS; False when the port refuses, holds the
    connection without answering (a :class:`PortPlaceholder`), or answers something else.
    """
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            connected = time.monotonic() - started
            sock.settimeout(min(timeout, max(_ANSWER_MIN_S, 4 * connected)))
            sock.sendall(_HTTP2_PREFACE)
            header = b""
            while len(header) < 4:  # length (3 bytes), then the frame type
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    return False
                header += chunk
            return header[3] == _SETTINGS
    except OSError:
        return False


def wait_for_server(
    address: str,
    timeout_s: float,
    *,
    probe: Callable[[str, int, float], bool] = serves_http2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Return once ``address`` serves HTTP/2 (True), or when ``timeout_s`` passed (False).

    A timeout is not an error here: the caller goes on to the strategy, whose registration
    waits and fails on its own terms (runner/training/strategy.py).
    """
    host, port = split_address(address)
    deadline = clock() + timeout_s
    while True:
        left = deadline - clock()
        if left <= 0:
            return False
        if probe(host, port, min(_CONNECT_TIMEOUT_S, left)):
            return True
        sleep(min(_SERVER_PROBE_GAP_S, max(0.0, deadline - clock())))


def _reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: nothing listens there"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer: the connection attempt timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    return exc.strerror or type(exc).__name__


def _message(rank: int, addresses: Sequence[str], pending: list[_Peer], timeout_s: float) -> str:
    first = pending[0]
    role = " (chief)" if first.rank == 0 else ""
    others = f" (and {len(pending) - 1} more: ranks {', '.join(str(p.rank) for p in pending[1:])})" if len(pending) > 1 else ""
    return (
        f"rank {rank} ({addresses[rank]}) could not reach rank {first.rank}{role} at {first.address}"
        f"{others} within {timeout_s:.0f} s ({first.last_error}); check the address in TF_CONFIG "
        "and that no firewall blocks the port between the two hosts"
    )


class PortPlaceholder:
    """Listens on this worker's own TF_CONFIG port (never accepting) until ``close``.

    A port that someone else holds is left alone (``bound`` False): TensorFlow's server
    then fails on it with its own error, as it would without us.
    """

    def __init__(self, address: str | None) -> None:
        self.bound = False
        self._sock: socket.socket | None = None
        if address is None:  # a single worker: no peer will look
            return
        _, port = split_address(address)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
            sock.listen(64)
        except OSError:
            sock.close()
            return
        self._sock, self.bound = sock, True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortPlaceholder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
