"""AWS: the spot interruption notice (``spot/instance-action``) and the rebalance
recommendation, from the instance metadata service with IMDSv2.

IMDSv2: every request carries a session token that a ``PUT /latest/api/token`` gave
(``X-aws-ec2-metadata-token-ttl-seconds``); a 401 means it expired and is fetched again.
The probe is that PUT: only IMDS answers it with a token. AWS advises polling every 5 s;
``instance-action`` is 404 until the notice, then ``{"action": "terminate"|"stop"|
"hibernate", "time": "<UTC>"}``, two minutes ahead (``time`` is the deadline). The
rebalance recommendation (``events/recommendations/rebalance``, ``{"noticeTime": ...}``)
comes earlier and does not stop the machine (``stops`` False).

The endpoint: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (what botocore reads: http://host[:port]),
else http://169.254.169.254.
"""

from __future__ import annotations

import json
from typing import Mapping

from resilient_train.cluster.notices.metadata_http import MetadataError, Reply, exchange, split_endpoint
from resilient_train.cluster.notices.notice_watch import Feed, Notice, NoticeSource

__all__ = ["AwsSource", "ENDPOINT_VARIABLE"]

ENDPOINT_VARIABLE = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_S = 21600
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
POLL_EVERY_S = 5.0
REQUEST_TIMEOUT_S = 2.0
ACTIONS = ("terminate", "stop", "hibernate")


class AwsSource(NoticeSource):
    provider = "aws"

    def __init__(self, environ: Mapping[str, str], *, every_s: float = POLL_EVERY_S,
                 rebalance: bool = True) -> None:
        self.host, self.port = split_endpoint(environ.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT)
        self.every_s = every_s
        self.rebalance = rebalance
        self.token: str | None = None

    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def probe(self, timeout_s: float) -> bool:
        try:
            self.token = self._new_token(timeout_s)
        except MetadataError:
            return False
        return True

    def feeds(self) -> list[Feed]:
        return [Feed("spot", self.poll, every_s=self.every_s)]

    def poll(self) -> list[Notice]:
        found = []
        action = self._get(INSTANCE_ACTION)
        if action is not None:
            found.append(_instance_action(action))
        if self.rebalance:
            recommendation = self._get(REBALANCE)
            if recommendation is not None:
                _json_object(REBALANCE, recommendation)  # garbled: an error, not a notice
                found.append(Notice("aws", "rebalance_recommendation", stops=False))
        return found

    # ------------------------------------------------------------ IMDSv2
    def _new_token(self, timeout_s: float) -> str:
        reply = exchange(self.host, self.port, "PUT", TOKEN_PATH, headers={TOKEN_TTL_HEADER: str(TOKEN_TTL_S)},
                         timeout_s=timeout_s)
        token = reply.body.strip()
        if reply.status != 200 or not token:
            raise MetadataError(f"PUT {TOKEN_PATH} on {self.where()}: HTTP {reply.status}, no token")
        return token

    def _get(self, path: str) -> str | None:
        """The body at ``path``; None for 404 (nothing announced)."""
        reply = self._with_token(path)
        if reply.status == 401:  # the token expired: one new one, one retry
            self.token = None
            reply = self._with_token(path)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise MetadataError(f"GET {path} on {self.where()}: HTTP {reply.status}")
        return reply.body

    def _with_token(self, path: str) -> Reply:
        if self.token is None:
            self.token = self._new_token(REQUEST_TIMEOUT_S)
        return exchange(self.host, self.port, "GET", path, headers={TOKEN_HEADER: self.token},
                        timeout_s=REQUEST_TIMEOUT_S)


def _json_object(path: str, body: str) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise MetadataError(f"GET {path}: {body[:80]!r} is not a JSON object")
    return value


def _instance_action(body: str) -> Notice:
    value = _json_object(INSTANCE_ACTION, body)
    action, deadline = value.get("action"), value.get("time")
    if action not in ACTIONS or not isinstance(deadline, str):
        raise MetadataError(f"GET {INSTANCE_ACTION}: {body[:120]!r}; expected action in {ACTIONS} and a time")
    return Notice("aws", f"spot_{action}", stops=True, deadline=deadline)
