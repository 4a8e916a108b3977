"""Azure: Scheduled Events (``Preempt`` above all) from the instance metadata service.

Every request carries ``Metadata: true``. The probe reads this VM's name
(``instance/compute/name``): only IMDS answers it, and an event names the VMs it concerns
in ``Resources`` (one document serves an availability set). The feed polls
``/metadata/scheduledevents`` every second; a document whose ``DocumentIncarnation`` was
seen already is not read again. ``Preempt`` (a Spot VM evicted, at least 30 s ahead),
``Terminate``, ``Reboot`` and ``Redeploy`` end this VM's processes: stop. ``Freeze`` (a
pause of seconds, e.g. a live migration) is survived (``stops`` False). ``NotBefore`` is the
deadline.

Azure lets an event start before NotBefore once it is acknowledged (a ``POST`` of
``{"StartRequests": [{"EventId": ...}]}``), so the acknowledgement waits until the agreed
save committed (:meth:`AzureSource.acknowledge`), never at the notice: acknowledging early
would shorten the time to save.

The endpoint: ``RT_AZURE_METADATA_HOST`` (host[:port]; Azure's own libraries read no such
variable), else 169.254.169.254.
"""

from __future__ import annotations

import json
from email.utils import parsedate_to_datetime
from datetime import timezone
from typing import Mapping, Sequence

from resilient_train.cluster.notices.metadata_http import MetadataError, exchange, split_endpoint
from resilient_train.cluster.notices.notice_watch import Feed, Notice, NoticeSource

__all__ = ["AzureSource", "ENDPOINT_VARIABLE"]

ENDPOINT_VARIABLE = "RT_AZURE_METADATA_HOST"
DEFAULT_HOST = "169.254.169.254"
HEADERS = {"Metadata": "true"}
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
POLL_EVERY_S = 1.0
REQUEST_TIMEOUT_S = 2.0
_STOPS = {"Preempt": True, "Terminate": True, "Reboot": True, "Redeploy": True, "Freeze": False}


class AzureSource(NoticeSource):
    provider = "azure"

    def __init__(self, environ: Mapping[str, str], *, every_s: float = POLL_EVERY_S) -> None:
        self.host, self.port = split_endpoint(environ.get(ENDPOINT_VARIABLE) or DEFAULT_HOST)
        self.every_s = every_s
        self.vm_name: str | None = None
        self.incarnation: int | None = None  # the last document read
        self.seen: set[str] = set()  # EventIds already returned: a later document may list them again

    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def probe(self, timeout_s: float) -> bool:
        try:
            reply = exchange(self.host, self.port, "GET", NAME_PATH, headers=HEADERS, timeout_s=timeout_s)
        except MetadataError:
            return False
        if reply.status != 200 or not reply.body.strip():
            return False
        self.vm_name = reply.body.strip()
        return True

    def feeds(self) -> list[Feed]:
        return [Feed("scheduled-events", self.poll, every_s=self.every_s)]

    def poll(self) -> list[Notice]:
        reply = exchange(self.host, self.port, "GET", EVENTS_PATH, headers=HEADERS, timeout_s=REQUEST_TIMEOUT_S)
        if reply.status != 200:
            raise MetadataError(f"GET {EVENTS_PATH} on {self.where()}: HTTP {reply.status}")
        try:
            document = json.loads(reply.body)
        except ValueError:
            document = None
        if not isinstance(document, dict) or not isinstance(document.get("DocumentIncarnation"), int) \
                or not isinstance(document.get("Events"), list):
            raise MetadataError(f"GET {EVENTS_PATH}: {reply.body[:120]!r}; expected DocumentIncarnation and Events")
        if document["DocumentIncarnation"] == self.incarnation:
            return []
        notices = [n for n in map(self._notice, document["Events"]) if n is not None and n.ref not in self.seen]
        self.incarnation = document["DocumentIncarnation"]
        self.seen.update(n.ref for n in notices if n.ref)
        return notices

    def acknowledge(self, notices: Sequence[Notice]) -> None:
        starts = [{"EventId": n.ref} for n in notices if n.provider == "azure" and n.ref]
        if not starts:
            return
        body = json.dumps({"StartRequests": starts}).encode()
        reply = exchange(self.host, self.port, "POST", EVENTS_PATH,
                         headers={**HEADERS, "Content-Type": "application/json"}, body=body,
                         timeout_s=REQUEST_TIMEOUT_S)
        if reply.status != 200:
            raise MetadataError(f"POST {EVENTS_PATH} on {self.where()}: HTTP {reply.status}")

    def _notice(self, event: object) -> Notice | None:
        if not isinstance(event, dict) or not isinstance(event.get("EventId"), str):
            raise MetadataError(f"a scheduled event without an EventId: {str(event)[:120]!r}")
        kind = event.get("EventType")
        if kind not in _STOPS:
            return None  # a type this version does not know: not ours to act on
        resources = event.get("Resources") or []
        if self.vm_name and resources and self.vm_name not in resources:
            return None  # another VM of the set
        return Notice("azure", kind, stops=_STOPS[kind], deadline=_deadline(event.get("NotBefore")), ref=event["EventId"])


def _deadline(text: object) -> str | None:
    """``"Mon, 19 Sep 2016 18:29:47 GMT"`` -> ``"2016-09-19T18:29:47Z"``; None when absent or empty."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        raise MetadataError(f"NotBefore = {text[:60]!r}; expected an RFC 1123 date") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
