"""RetryPolicy and is_transient: which failures are retried, how often, how long."""

from __future__ import annotations

import errno
import socket

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from resilient_train.checkpoint import RetryPolicy, is_transient
from resilient_train.chaos.faultfs import SimulatedCrash
from resilient_train.errors import StorageError, StorageUnavailableError

from tests.support.storage import Events, FakeSleep


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def translated(code: str, status: int, exc: OSError) -> OSError:
    """What s3fs raises: a builtin OSError *from* the botocore ClientError."""
    try:
        raise exc from client_error(code, status)
    except OSError as raised:
        return raised


@pytest.mark.parametrize("exc", [
    TimeoutError("timed out"),
    socket.timeout("timed out"),
    ConnectionResetError("reset"),
    ConnectionRefusedError("refused"),
    BrokenPipeError("pipe"),
    OSError(errno.ETIMEDOUT, "timed out"),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    client_error("SlowDown", 503),
    client_error("Throttling", 400),
    client_error("RequestLimitExceeded", 400),
    client_error("InternalError", 500),
    client_error("Whatever", 502),
    translated("SlowDown", 503, OSError(errno.EBUSY, "Please reduce your request rate.")),
    translated("InternalError", 500, OSError(errno.EIO, "We encountered an internal error.")),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc) is True


@pytest.mark.parametrize("exc", [
    FileNotFoundError("The specified bucket does not exist"),
    PermissionError("Access Denied."),
    NotADirectoryError("not a dir"),
    ValueError("Protocol not known: nope"),
    client_error("NoSuchBucket", 404),
    client_error("AccessDenied", 403),
    translated("NoSuchBucket", 404, FileNotFoundError("The specified bucket does not exist")),
    translated("AccessDenied", 403, PermissionError("Access Denied")),
    StorageUnavailableError("already retried"),
    RuntimeError("a bug"),
    SimulatedCrash("killed"),
    KeyboardInterrupt(),
], ids=lambda e: type(e).__name__ + ":" + str(e)[:20])
def test_permanent(exc: BaseException) -> None:
    assert is_transient(exc) is False


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_retries_then_succeeds_with_bounded_exponential_waits() -> None:
    sleep, events = FakeSleep(), Events()
    policy = RetryPolicy(attempts=6, initial_s=0.2, max_s=1.0, jitter_s=0.1, sleep=sleep)
    fn = Flaky([ConnectionResetError("reset")] * 5)
    assert policy.call(fn, op="upload", path="memory://x/f", emit=events) == "done"
    assert fn.calls == 6
    assert len(sleep.calls) == 5
    for n, (low, high) in enumerate([(0.2, 0.3), (0.4, 0.5), (0.8, 0.9)], start=1):
        assert low <= sleep.calls[n - 1] <= high, (n, sleep.calls)
    assert sleep.calls[3:] == [1.0, 1.0]  # capped at max_s
    retries = events.named("storage_retry")
    assert [r["try_number"] for r in retries] == [1, 2, 3, 4, 5]
    assert {(r["op"], r["path"]) for r in retries} == {("upload", "memory://x/f")}
    assert [r["wait_s"] for r in retries] == [round(s, 3) for s in sleep.calls]
    assert retries[0]["error"] == "ConnectionResetError: reset"


def test_exhaustion_raises_storage_unavailable_naming_op_and_path() -> None:
    sleep, events = FakeSleep(), Events()
    policy = RetryPolicy(attempts=3, sleep=sleep)
    fn = Flaky([TimeoutError("slow")] * 10)
    with pytest.raises(StorageUnavailableError) as raised:
        policy.call(fn, op="read", path="s3://b/p/MANIFEST.json", emit=events)
    assert str(raised.value) == "read s3://b/p/MANIFEST.json failed 3 times; last error: TimeoutError: slow"
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert fn.calls == 3 and len(sleep.calls) == 2
    assert all(s <= policy.max_s for s in sleep.calls)
    assert len(events.named("storage_retry")) == 2


@pytest.mark.parametrize("exc", [PermissionError("denied"), FileNotFoundError("gone"), SimulatedCrash("killed")])
def test_permanent_errors_propagate_at_once(exc: BaseException) -> None:
    sleep, events = FakeSleep(), Events()
    fn = Flaky([exc])
    with pytest.raises(type(exc)):
        RetryPolicy(sleep=sleep).call(fn, op="write", path="p", emit=events)
    assert fn.calls == 1 and sleep.calls == [] and events.records == []


@pytest.mark.parametrize("kwargs, message", [
    ({"attempts": 0}, "attempts=0"),
    ({"initial_s": 0}, "initial_s=0"),
    ({"initial_s": 2.0, "max_s": 1.0}, "max_s=1.0"),
    ({"jitter_s": -1}, "jitter_s=-1"),
])
def test_policy_is_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_storage_unavailable_is_a_storage_error() -> None:
    assert issubclass(StorageUnavailableError, StorageError)
