"""Bounded retries of storage operations, and which failures deserve one.

Invariant: a storage operation is retried only when its failure is *transient*
(:func:`is_transient`: timeouts, dropped connections, HTTP 5xx, throttling). Permanent
failures (missing bucket, no permission, bad URL, missing file) are raised at once, so a
misconfigured job fails in seconds with the real cause instead of backing off for
minutes. A transient failure that outlives the budget becomes
:class:`~resilient_train.errors.StorageUnavailableError` naming the operation and path.

A call that makes no progress for ``stall_timeout_s`` (checkpoint/deadline.py) is given
up as a ``TimeoutError``, which is transient like any timeout: a stalled store is retried
like a failing one, and a store that stays stalled ends as StorageUnavailableError instead
of blocking the save forever.

Every retry is visible as a ``storage_retry`` event (op, path, try_number, error, wait_s).
Sleep is injectable so tests never wait. The policy is built on tenacity:
``stop_after_attempt | wait_exponential_jitter | retry_if_exception(is_transient)``.

Exceptions that are not ``Exception`` (``KeyboardInterrupt``, the fault-injection
``SimulatedCrash``) are never retried: they model the process dying.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import tenacity

from resilient_train.checkpoint.deadline import call_with_deadline
from resilient_train.errors import StorageError, StorageUnavailableError

__all__ = ["RetryPolicy", "is_transient", "describe", "DEFAULT_STALL_TIMEOUT_S"]

# Seconds a storage call may go without progress before it is retried (``--storage-timeout``).
# Generous (a busy object store answers in seconds, a chunk is 8 MiB; botocore's own read
# timeout is 60 s), yet small enough that a store stalled through all 5 tries (~5 min) fails
# the save before the hang watchdog's allowance for a save flush (--startup-timeout, 600 s)
# runs out: the storage error, not a hang, is then the root cause.
DEFAULT_STALL_TIMEOUT_S = 60.0

T = TypeVar("T")

_TRANSIENT_ERRNOS = frozenset(
    {errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
     errno.EPIPE, errno.EAGAIN, errno.EBUSY, errno.ENETUNREACH, errno.EHOSTUNREACH}
)
# Error codes of S3-compatible stores (and GCS reasons) that mean "try again later".
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
     "RequestThrottled", "TooManyRequests", "ServiceUnavailable", "InternalError",
     "RequestTimeout", "RequestTimeoutException", "503", "500", "502", "504"}
)
# Connection-level exception classes of botocore and aiohttp, matched by name so this
# module imports neither (they are optional, backend-specific dependencies).
_TRANSIENT_CLASS_NAMES = frozenset(
    {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
     "ConnectTimeoutError", "ProxyConnectionError", "ResponseStreamingError",
     "IncompleteReadError", "ClientConnectionError", "ClientOSError",
     "ServerDisconnectedError", "ServerTimeoutError", "ClientPayloadError",
     "IncompleteRead", "FSTimeoutError"}
)
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              FileExistsError, StorageError, ValueError, TypeError, NotImplementedError)


def is_transient(exc: BaseException) -> bool:
    """True when retrying ``exc`` may succeed (see the module docstring).

    The exception chain is followed (``__cause__``/``__context__``) because fsspec
    backends translate client errors: s3fs raises ``OSError(EBUSY)`` *from* the botocore
    ``ClientError`` that carries the ``SlowDown`` code.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _classify(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def _classify(exc: BaseException) -> bool | None:
    """True/False when ``exc`` alone decides; None to look further down the chain."""
    if not isinstance(exc, Exception):
        return False
    if _http_status(exc) is not None or _error_code(exc) is not None:
        status, code = _http_status(exc), _error_code(exc)
        return (status is not None and (status >= 500 or status == 429)) or code in _TRANSIENT_CODES
    if any(cls.__name__ in _TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return None


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    code = getattr(exc, "code", None)  # gcsfs HttpError, aiohttp ClientResponseError
    if isinstance(code, int) and 100 <= code <= 599:
        return code
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 100 <= status <= 599 else None


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one storage operation is retried.

    ``attempts`` counts the first try: ``attempts=5`` means up to 4 sleeps. Waits grow as
    ``initial_s * 2**(n-1) + uniform(0, jitter_s)``, capped at ``max_s``.
    ``stall_timeout_s``: each try is abandoned (a transient TimeoutError) after this many
    seconds without progress; None runs calls on the caller's thread with no deadline.
    """

    attempts: int = 5
    initial_s: float = 0.2
    max_s: float = 5.0
    jitter_s: float = 0.2
    sleep: Callable[[float], None] = time.sleep
    stall_timeout_s: float | None = DEFAULT_STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Received attempts={self.attempts!r}; expected an int >= 1")
        if not self.initial_s > 0:
            raise ValueError(f"Received initial_s={self.initial_s!r}; expected > 0")
        if not self.max_s >= self.initial_s:
            raise ValueError(f"Received max_s={self.max_s!r}; expected >= initial_s={self.initial_s!r}")
        if not self.jitter_s >= 0:
            raise ValueError(f"Received jitter_s={self.jitter_s!r}; expected >= 0")
        if not callable(self.sleep):
            raise ValueError(f"Received sleep={self.sleep!r}; expected a callable")
        if self.stall_timeout_s is not None and (
            isinstance(self.stall_timeout_s, bool) or not isinstance(self.stall_timeout_s, (int, float))
            or not self.stall_timeout_s > 0
        ):
            raise ValueError(
                f"Received stall_timeout_s={self.stall_timeout_s!r}; expected a number of seconds > 0 or None"
            )

    def call(
        self,
        fn: Callable[[], T],
        *,
        op: str,
        path: str,
        emit: Callable[..., None],
    ) -> T:
        """Run ``fn()`` under this policy.

        Permanent errors propagate unchanged; transient ones are retried; exhaustion
        raises StorageUnavailableError chained to the last error.
        """

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            emit(
                "storage_retry",
                op=op,
                path=path,
                try_number=state.attempt_number,  # not "attempt": that is the worker group attempt
                error=_one_line(error) if error else "",
                wait_s=round(state.upcoming_sleep, 3),
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self.initial_s, max=self.max_s, jitter=self.jitter_s
            ),
            retry=tenacity.retry_if_exception(is_transient),
            sleep=self.sleep,
            before_sleep=before_sleep,
            reraise=False,
        )
        timeout_s = self.stall_timeout_s
        bounded = fn if timeout_s is None else (lambda: call_with_deadline(fn, timeout_s, what=f"{op} {path}"))
        try:
            return retrying(bounded)
        except tenacity.RetryError as exhausted:
            last = exhausted.last_attempt.exception()
            raise StorageUnavailableError(
                f"{op} {path} failed {self.attempts} times; last error: "
                f"{_one_line(last) if last else 'unknown'}"
            ) from last


def describe(exc: BaseException) -> str:
    """A one-line description of a storage error, for messages and events."""
    return _one_line(exc)
