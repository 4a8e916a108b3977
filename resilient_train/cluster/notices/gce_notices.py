"""GCE: ``instance/preempted`` and ``instance/maintenance-event`` from the metadata server.

Both are long polls, never a tight loop: the first request reads the value and its ETag, each
next one asks ``?wait_for_change=true&last_etag=<etag>&timeout_sec=<n>``, which the server
answers when the value changes (at once if it changed since that ETag) or after n seconds.
Every request carries ``Metadata-Flavor: Google``, and the probe accepts only a reply that
carries it back (google-auth's check: another server on that address is not GCE's).

``preempted`` ``TRUE``: a Spot/preemptible VM is stopped about 30 s later (GCE gives no
time). ``maintenance-event`` ``TERMINATE_ON_HOST_MAINTENANCE``: the VM (GPU VMs cannot
migrate) is stopped for host maintenance; ``MIGRATE_ON_HOST_MAINTENANCE``: it is
live-migrated and survives (``stops`` False); ``NONE``: nothing. TensorFlow's own
``PreemptionCheckpointHandler`` watches only the second, so a Spot GPU VM is missed there.

The endpoint: ``GCE_METADATA_HOST`` (host[:port], what google-auth reads), else
169.254.169.254, the address the name metadata.google.internal resolves to: no DNS lookup,
which off GCE may take seconds.
"""

from __future__ import annotations

from typing import Mapping
from urllib.parse import quote

from resilient_train.cluster.notices.metadata_http import MetadataError, Reply, exchange, split_endpoint
from resilient_train.cluster.notices.notice_watch import Feed, Notice, NoticeSource

__all__ = ["GceSource", "ENDPOINT_VARIABLE"]

ENDPOINT_VARIABLE = "GCE_METADATA_HOST"
DEFAULT_HOST = "169.254.169.254"
ROOT = "/computeMetadata/v1/"
HEADERS = {"Metadata-Flavor": "Google"}
PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"
WAIT_S = 60  # timeout_sec of one long poll: the server answers by then if nothing changed

_MAINTENANCE_STOPS = {"TERMINATE_ON_HOST_MAINTENANCE": True, "MIGRATE_ON_HOST_MAINTENANCE": False}


class GceSource(NoticeSource):
    provider = "gce"

    def __init__(self, environ: Mapping[str, str], *, wait_s: int = WAIT_S) -> None:
        self.host, self.port = split_endpoint(environ.get(ENDPOINT_VARIABLE) or DEFAULT_HOST)
        self.wait_s = wait_s

    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def probe(self, timeout_s: float) -> bool:
        try:
            reply = exchange(self.host, self.port, "GET", ROOT, headers=HEADERS, timeout_s=timeout_s)
        except MetadataError:
            return False
        return reply.status == 200 and reply.headers.get("metadata-flavor") == "Google"

    def feeds(self) -> list[Feed]:
        return [Feed("preempted", _LongPoll(self, PREEMPTED, _preempted).poll, every_s=0),
                Feed("maintenance-event", _LongPoll(self, MAINTENANCE, _maintenance).poll, every_s=0)]

    def get(self, path: str, *, timeout_s: float) -> Reply:
        reply = exchange(self.host, self.port, "GET", path, headers=HEADERS, timeout_s=timeout_s)
        if reply.status != 200:
            raise MetadataError(f"GET {path} on {self.where()}: HTTP {reply.status}")
        return reply


class _LongPoll:
    """One value watched with wait_for_change; ``parse(value)`` -> the notice it means, or None."""

    def __init__(self, source: GceSource, key: str, parse) -> None:
        self.source, self.key, self.parse = source, key, parse
        self.etag: str | None = None

    def poll(self) -> list[Notice]:
        path = ROOT + self.key
        if self.etag is not None:
            path += f"?wait_for_change=true&last_etag={quote(self.etag, safe='')}&timeout_sec={self.source.wait_s}"
        reply = self.source.get(path, timeout_s=self.source.wait_s + 10.0 if self.etag else 5.0)
        self.etag = reply.headers.get("etag") or None
        if self.etag is None:  # without it the next wait could miss a change: not GCE's server
            raise MetadataError(f"GET {path} on {self.source.where()}: no ETag header")
        notice = self.parse(reply.body.strip())
        return [notice] if notice is not None else []


def _preempted(value: str) -> Notice | None:
    if value not in ("TRUE", "FALSE"):
        raise MetadataError(f"{PREEMPTED} = {value[:80]!r}; expected TRUE or FALSE")
    return Notice("gce", "preempted", stops=True) if value == "TRUE" else None


def _maintenance(value: str) -> Notice | None:
    if value == "NONE":
        return None
    if value not in _MAINTENANCE_STOPS:
        raise MetadataError(f"{MAINTENANCE} = {value[:80]!r}; expected NONE, "
                            "MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE")
    return Notice("gce", value, stops=_MAINTENANCE_STOPS[value])
