"""One HTTP exchange with a cloud metadata server: bounded, proxy-free, stdlib only.

Every metadata server (GCE, AWS IMDS, Azure IMDS) is plain HTTP on a link-local address
(169.254.169.254) or on the override a user gives. ``http.client`` and not ``urllib``:
urllib honours ``http_proxy``, and a metadata request must never go through a proxy (the
proxy would answer for itself, or see the request's token). Each exchange has a timeout,
so a server that accepts and then says nothing costs a watcher thread that long, never
more; what goes wrong is raised as :class:`MetadataError` for the watch to log and ignore.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["MetadataError", "Reply", "exchange", "split_endpoint"]

# A metadata body is a few bytes to a few KiB; anything far larger is not one.
MAX_BODY_BYTES = 1 << 20


class MetadataError(OSError):
    """A metadata server that did not answer as its provider documents (unreachable, slow,
    an unexpected status, a body that does not parse)."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names


def split_endpoint(text: str, default_port: int = 80) -> tuple[str, int]:
    """``"host"``, ``"host:port"``, ``"http://host:port/"``, ``"http://[fd00:ec2::254]"`` ->
    (host, port); ValueError naming ``text`` for anything else (https is not a metadata server)."""
    rest = text.strip()
    if rest.startswith("http://"):
        rest = rest[len("http://"):]
    elif "://" in rest:
        raise ValueError(f"Received metadata endpoint {text!r}; expected host[:port] or http://host[:port]")
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise ValueError(f"Received metadata endpoint {text!r}; expected host[:port] or http://host[:port]")
    if rest.startswith("["):  # an IPv6 literal
        host, _, after = rest[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, _, port_text = rest.partition(":")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"Received metadata endpoint {text!r}; expected a numeric port") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"Received metadata endpoint {text!r}; expected host[:port]")
    return host, port


def exchange(host: str, port: int, method: str, path: str, *, headers: Mapping[str, str] | None = None,
             body: bytes | None = None, timeout_s: float) -> Reply:
    """``method path`` on ``host:port`` within ``timeout_s`` per socket operation; the reply.

    Raises :class:`MetadataError` when the server cannot be reached, stalls, or breaks HTTP.
    """
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        data = response.read(MAX_BODY_BYTES + 1)
        if len(data) > MAX_BODY_BYTES:
            raise MetadataError(f"{method} {path} on {host}:{port}: a body over {MAX_BODY_BYTES} bytes")
        return Reply(response.status, data.decode("utf-8", "replace"),
                     {name.lower(): value for name, value in response.getheaders()})
    except MetadataError:
        raise
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, not HTTP
        raise MetadataError(f"{method} {path} on {host}:{port}: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
