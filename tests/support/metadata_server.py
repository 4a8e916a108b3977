"""A real HTTP server on loopback that speaks each cloud's metadata protocol, for the
preemption-notice watchers (resilient_train/cluster/notices/).

One :class:`MetadataServer` per test, for one provider (``gce``, ``aws``, ``azure``), on
127.0.0.1 and a free port, in a thread of the test process; :meth:`MetadataServer.environ`
gives the endpoint override the worker reads. It answers as the provider documents:

* gce: ``Metadata-Flavor: Google`` required on every request (403 without) and sent back;
  ``instance/preempted`` and ``instance/maintenance-event`` with an ``ETag``;
  ``?wait_for_change=true&last_etag=E&timeout_sec=N`` holds the request until the value's
  ETag differs from E (at once if it already does) or N seconds passed.
* aws: IMDSv2. ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
  gives a token (400 without the header); every GET needs ``X-aws-ec2-metadata-token``
  with a token it gave (401 otherwise); ``spot/instance-action`` and
  ``events/recommendations/rebalance`` are 404 until announced.
* azure: ``Metadata: true`` required (400 without); ``instance/compute/name`` is the VM
  name; ``/metadata/scheduledevents`` is ``{"DocumentIncarnation": n, "Events": [...]}``
  (n grows with each change); a POST of ``{"StartRequests": [{"EventId": ...}]}`` is
  recorded in :attr:`MetadataServer.acknowledged`.

Every request is recorded (:attr:`MetadataServer.requests`: method, path with query, the
headers that matter, body). ``garble`` answers 200 with a body no provider sends;
:meth:`MetadataServer.hold` keeps every answer back until :meth:`MetadataServer.release`
(a server that accepts and says nothing; no test waits on a clock for it).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["MetadataServer", "Request", "VM_NAME"]

VM_NAME = "rt-test-vm"
_KEPT_HEADERS = ("metadata-flavor", "metadata", "x-aws-ec2-metadata-token", "x-aws-ec2-metadata-token-ttl-seconds",
                 "content-type")
GCE_ROOT = "/computeMetadata/v1/"
AZURE_EVENTS = "/metadata/scheduledevents"
AZURE_NAME = "/metadata/instance/compute/name"
AWS_TOKEN = "/latest/api/token"
AWS_ACTION = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with its query
    headers: dict[str, str]  # lower-case names, only those in _KEPT_HEADERS
    body: str = ""


class MetadataServer:
    def __init__(self, provider: str, host: str = "127.0.0.1") -> None:
        """``host``: the address to listen on (a bridge's, for workers in network namespaces)."""
        if provider not in ("gce", "aws", "azure"):
            raise ValueError(f"Received provider={provider!r}; expected gce, aws or azure")
        self.provider = provider
        self.requests: list[Request] = []
        self.acknowledged: list[dict[str, Any]] = []
        self.garble = False
        self._open = threading.Event()
        self._open.set()
        self._changed = threading.Condition()
        # gce: key -> value; aws: path -> JSON body; azure: the Events list and its incarnation
        self.gce = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self.aws: dict[str, str] = {}
        self.azure_events: list[dict[str, Any]] = []
        self.incarnation = 1
        self._tokens: set[str] = set()
        self._issued = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the requests are recorded
                pass

            def do_GET(self) -> None:
                server._serve(self, "GET")

            def do_PUT(self) -> None:
                server._serve(self, "PUT")

            def do_POST(self) -> None:
                server._serve(self, "POST")

        self.host = host
        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metadata-server", daemon=True)

    # ------------------------------------------------------------ the test's side
    def __enter__(self) -> "MetadataServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open.set()
        with self._changed:
            self._changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def environ(self) -> dict[str, str]:
        """The endpoint override a worker reads for this provider."""
        return {"gce": {"GCE_METADATA_HOST": self.address},
                "aws": {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{self.address}"},
                "azure": {"RT_AZURE_METADATA_HOST": self.address}}[self.provider]

    def set_gce(self, key: str, value: str) -> None:
        with self._changed:
            self.gce[key] = value
            self._changed.notify_all()

    def set_aws(self, path: str, document: dict[str, Any] | None) -> None:
        with self._changed:
            if document is None:
                self.aws.pop(path, None)
            else:
                self.aws[path] = json.dumps(document)

    def set_azure(self, events: list[dict[str, Any]]) -> None:
        with self._changed:
            self.azure_events = list(events)
            self.incarnation += 1

    def announce(self) -> None:
        """The provider's own notice that this machine goes: GCE preempted, an AWS spot
        termination two minutes out, an Azure Preempt."""
        if self.provider == "gce":
            self.set_gce("instance/preempted", "TRUE")
        elif self.provider == "aws":
            self.set_aws(AWS_ACTION, {"action": "terminate", "time": "2026-11-26T12:02:00Z"})
        else:
            self.set_azure([{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
                             "ResourceType": "VirtualMachine", "Resources": [VM_NAME], "EventStatus": "Scheduled",
                             "NotBefore": "Thu, 26 Nov 2026 12:00:30 GMT", "Description": "", "EventSource": "Platform",
                             "DurationInSeconds": -1}])

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def forget_tokens(self) -> None:
        """Every IMDSv2 token expires (the next GET is 401)."""
        self._tokens.clear()

    def seen(self, method: str, path_prefix: str) -> list[Request]:
        return [r for r in list(self.requests) if r.method == method and r.path.startswith(path_prefix)]

    # ------------------------------------------------------------ the server's side
    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode() if length else ""
        headers = {k.lower(): v for k, v in handler.headers.items() if k.lower() in _KEPT_HEADERS}
        self.requests.append(Request(method, handler.path, headers, body))
        self._open.wait()
        if self.garble:
            return _answer(handler, 200, "<html>captive portal</html>", {"Metadata-Flavor": "Google", "ETag": "x"})
        status, text, extra = getattr(self, f"_{self.provider}")(method, handler.path, headers, body)
        _answer(handler, status, text, extra)

    def _gce(self, method: str, path: str, headers: dict[str, str], body: str):
        if headers.get("metadata-flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", {}
        url = urlsplit(path)
        flavor = {"Metadata-Flavor": "Google"}
        if url.path == GCE_ROOT:
            return 200, "instance/\nproject/\n", flavor
        key = url.path[len(GCE_ROOT):]
        if key not in self.gce:
            return 404, "not found", flavor
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._changed:
            if query.get("wait_for_change") == "true":
                until = time.monotonic() + float(query.get("timeout_sec", "300"))
                while _etag(self.gce[key]) == query.get("last_etag") and time.monotonic() < until:
                    self._changed.wait(min(0.5, max(0.0, until - time.monotonic())))
            value = self.gce[key]
        return 200, value, {**flavor, "ETag": _etag(value)}

    def _aws(self, method: str, path: str, headers: dict[str, str], body: str):
        if method == "PUT" and path == AWS_TOKEN:
            if "x-aws-ec2-metadata-token-ttl-seconds" not in headers:
                return 400, "", {}
            self._issued += 1
            token = f"token-{self._issued}"
            self._tokens.add(token)
            return 200, token, {"X-aws-ec2-metadata-token-ttl-seconds": headers["x-aws-ec2-metadata-token-ttl-seconds"]}
        if method != "GET":
            return 405, "", {}
        if headers.get("x-aws-ec2-metadata-token") not in self._tokens:
            return 401, "", {}
        with self._changed:
            document = self.aws.get(path)
        return (200, document, {"Content-Type": "text/plain"}) if document is not None else (404, "", {})

    def _azure(self, method: str, path: str, headers: dict[str, str], body: str):
        if headers.get("metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"}), {}
        url = urlsplit(path)
        if "api-version" not in parse_qs(url.query):
            return 400, json.dumps({"error": "Bad request. api-version was not specified"}), {}
        if url.path == AZURE_NAME and method == "GET":
            return 200, VM_NAME, {"Content-Type": "text/plain"}
        if url.path != AZURE_EVENTS:
            return 404, "", {}
        if method == "POST":
            self.acknowledged.append(json.loads(body))
            return 200, "", {}
        with self._changed:
            document = {"DocumentIncarnation": self.incarnation, "Events": self.azure_events}
        return 200, json.dumps(document), {"Content-Type": "application/json"}


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


def _answer(handler: BaseHTTPRequestHandler, status: int, text: str, headers: dict[str, str]) -> None:
    data = text.encode()
    try:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:  # the client gave up (its timeout): nothing to answer
        pass
