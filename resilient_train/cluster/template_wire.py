"""The standby template's wire: messages between the supervisor and its fork server.

The supervisor (supervisor/forked_standbys.py) and the template process
(runner/process/standby_template.py) talk over one Unix ``SOCK_SEQPACKET`` socket pair: every message
is one datagram (one JSON object, at most ``MAX_MESSAGE`` bytes) with its file descriptors
attached (SCM_RIGHTS), so a message and its fds can never be split or merged. Defined once
here, below both sides, so neither spells the other's message kinds.

    template -> supervisor
      ready   {"kind": "ready", "ok": true, "pid", "prewarm_s"} or {"kind": "ready", "ok": false, "reason"}
      forked  {"kind": "forked", "pid"}            fds: [a pidfd of the child] (none where pidfds
                                                    are unavailable); the answer to one ``fork``
      exited  {"kind": "exited", "pid", "code"}    a child the template reaped; code in
                                                    Popen's convention (negative: killed by that signal)
    supervisor -> template
      fork    {"kind": "fork"}                     fds: [stdin, log, status] of the new standby
      hurry   {"kind": "hurry"}                    a standby is wanted: import at normal priority
"""

from __future__ import annotations

import json
import socket
from typing import Any

__all__ = ["TEMPLATE_FD", "FORK_FDS", "MAX_MESSAGE", "send", "receive"]

TEMPLATE_FD = "RT_STANDBY_TEMPLATE_FD"  # the template's end of the socket pair, an inherited fd
FORK_FDS = 3  # a fork request carries the standby's stdin, log and status fds, in that order
MAX_MESSAGE = 4096
_MAX_FDS = 4


def send(sock: socket.socket, record: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message (and its fds) as one datagram; raises OSError when the peer is gone."""
    data = json.dumps(record).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"Received a {len(data)}-byte message; expected at most {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and the fds that came with it; None at EOF (the peer closed or died).

    Raises BlockingIOError on a non-blocking socket with nothing to read.
    """
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, _MAX_FDS)
    if not data:
        return None
    return json.loads(data), list(fds)
