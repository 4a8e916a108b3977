"""Which endpoint an object-store URL talks to, and the one line when it does not answer.

No network: ``connect`` is injected; the real-process checks are in
tests/integration/test_storage_e2e.py.
"""

from __future__ import annotations

import socket
import threading

import pytest

from resilient_train.checkpoint.endpoint import Endpoint, check_reachable, store_endpoint
from resilient_train.errors import StorageError


@pytest.mark.parametrize(
    "url, options, environ, expected",
    [
        ("s3://b/x", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:8333"}}, {},
         ("http://127.0.0.1:8333", "127.0.0.1", 8333)),
        ("s3a://b/x", {"endpoint_url": "https://minio.lan"}, {"AWS_ENDPOINT_URL": "http://other:1"},
         ("https://minio.lan", "minio.lan", 443)),
        ("s3://b/x", {}, {"AWS_ENDPOINT_URL": "http://ceph:7480"}, ("http://ceph:7480", "ceph", 7480)),
        ("s3://b/x", {}, {"AWS_REGION": "eu-west-1"},
         ("https://s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com", 443)),
        ("s3://b/x", {}, {}, ("https://s3.amazonaws.com", "s3.amazonaws.com", 443)),
        ("gcs://b/x", {}, {}, ("https://storage.googleapis.com", "storage.googleapis.com", 443)),
        ("gs://b/x", {}, {"STORAGE_EMULATOR_HOST": "localhost:4443"},
         ("http://localhost:4443", "localhost", 4443)),
        ("gs://b/x", {"endpoint_url": "http://127.0.0.1:9000"}, {"STORAGE_EMULATOR_HOST": "localhost:4443"},
         ("http://127.0.0.1:9000", "127.0.0.1", 9000)),
    ],
)
def test_store_endpoint_follows_the_clients_rule(url, options, environ, expected):
    endpoint = store_endpoint(url, options, environ)
    assert (endpoint.url, endpoint.host, endpoint.port) == expected
    assert endpoint.proxy is None


@pytest.mark.parametrize("url", ["/tmp/ckpts", "file:///tmp/ckpts", "faulty:///tmp/x", "memory://b/x"])
def test_local_and_wrapped_urls_have_no_endpoint(url):
    assert store_endpoint(url, {}, {}) is None


def test_a_proxy_is_what_is_reached_unless_no_proxy_names_the_host():
    environ = {"HTTPS_PROXY": "http://proxy.corp:3128"}
    assert store_endpoint("gs://b/x", {}, environ) == Endpoint(
        "https://storage.googleapis.com", "proxy.corp", 3128, "endpoint_url", "http://proxy.corp:3128")
    environ["NO_PROXY"] = ".googleapis.com"
    assert store_endpoint("gs://b/x", {}, environ).host == "storage.googleapis.com"


def refuse(host, port, timeout_s):
    raise ConnectionRefusedError(111, "Connection refused")


def unresolvable(host, port, timeout_s):
    raise socket.gaierror(-2, "Name or service not known")


@pytest.mark.parametrize(
    "connect, cause",
    [
        (refuse, "127.0.0.1:9 refused the connection: nothing listens there"),
        (unresolvable, "host 127.0.0.1 does not resolve (Name or service not known): no network, or a wrong name"),
    ],
)
def test_unreachable_endpoint_is_one_line_naming_url_endpoint_and_option(connect, cause):
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    with pytest.raises(StorageError) as raised:
        check_reachable("s3://bucket/x", options, environ={}, connect=connect)
    assert str(raised.value) == (
        f"cannot reach checkpoint storage s3://bucket/x (endpoint http://127.0.0.1:9): {cause}; "
        "check the network and --storage-option client_kwargs.endpoint_url"
    )


def test_a_silent_endpoint_fails_at_the_deadline():
    released = threading.Event()
    try:
        with pytest.raises(StorageError, match=r"storage.googleapis.com:443 did not answer within 0.2 s"):
            check_reachable("gcs://b/x", {}, environ={}, connect=lambda *a: released.wait(10), timeout_s=0.2)
    finally:
        released.set()


def test_a_reachable_endpoint_and_a_local_path_pass():
    calls = []
    check_reachable("s3://b/x", {}, environ={}, connect=lambda *a: calls.append(a))
    check_reachable("/tmp/ckpts", {}, environ={}, connect=refuse)
    assert calls == [("s3.amazonaws.com", 443, 5.0)]
