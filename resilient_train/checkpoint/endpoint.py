"""Before anything else touches an object store: does its endpoint answer at all?

Why: the store's own check (``CheckpointStore.check``) goes through the storage client, and
every client retries a dead endpoint on its own before our RetryPolicy retries it again:
s3fs and botocore take ~10 s per try against a refused port, gcsfs ~33 s (six tries with
backoff, each logged with a traceback), so a ``run`` against an unreachable store said
nothing useful for one to three minutes. The cause is knowable in milliseconds: the
endpoint's host does not resolve (no network, a typo), or its port refuses or ignores a
TCP connection. :func:`check_reachable` asks exactly that, within :data:`REACH_TIMEOUT_S`
in all, and raises :class:`~resilient_train.errors.StorageError` (exit 2 from the command
line) naming the storage URL, the endpoint and the cause.

Which endpoint a URL talks to is the client's rule, restated here (:func:`store_endpoint`):

* ``s3://`` / ``s3a://``: the ``endpoint_url`` storage option, else
  ``client_kwargs.endpoint_url``, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else
  AWS (``s3.<region>.amazonaws.com`` with ``region_name`` / ``AWS_REGION`` /
  ``AWS_DEFAULT_REGION``, ``s3.amazonaws.com`` without);
* ``gs://`` / ``gcs://``: the ``endpoint_url`` storage option, else ``STORAGE_EMULATOR_HOST``,
  else ``storage.googleapis.com``;
* anything else (a path, ``file://``, ``faulty://``, ...): no endpoint, nothing to check.

Where a proxy from the environment (``HTTPS_PROXY`` ...) applies to the endpoint, the proxy
is what this host connects to, so the proxy is what is reached.

What it does not prove: TLS, credentials, the bucket, permissions. Those answer quickly
once the endpoint is reachable, and ``CheckpointStore.check`` (a probe object written, read
and deleted) reports them with the client's own words.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from resilient_train.checkpoint.deadline import call_with_deadline
from resilient_train.errors import StorageError

__all__ = ["Endpoint", "store_endpoint", "check_reachable", "REACH_TIMEOUT_S"]

# Seconds for resolving the endpoint's host and opening one TCP connection to it. A store
# that answers at all answers a SYN in well under a second, even across continents.
REACH_TIMEOUT_S = 5.0

_S3 = ("s3", "s3a")
_GCS = ("gs", "gcs")


@dataclass(frozen=True)
class Endpoint:
    """``host:port`` this host connects to for a store, and how the user would change it."""

    url: str  # the endpoint URL the client uses (http[s]://host[:port])
    host: str  # what is connected to: the endpoint's host, or the proxy's
    port: int
    option: str  # the storage option that sets the endpoint
    proxy: str | None = None  # the proxy URL, when one applies

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError(f"Received host={self.host!r} for endpoint {self.url!r}; expected a host name")
        if not 0 < self.port < 65536:
            raise ValueError(f"Received port={self.port!r} for endpoint {self.url!r}; expected 1..65535")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def store_endpoint(url: str, options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Endpoint | None:
    """The endpoint the storage client for ``url`` connects to (module docstring); None: not an object store."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in _S3:
        client = options.get("client_kwargs") or {}
        endpoint = options.get("endpoint_url") or client.get("endpoint_url") or environ.get(
            "AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        if not endpoint:
            region = client.get("region_name") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
            endpoint = f"https://s3.{region}.amazonaws.com" if region else "https://s3.amazonaws.com"
        option = "client_kwargs.endpoint_url"
    elif scheme in _GCS:
        endpoint = options.get("endpoint_url") or environ.get("STORAGE_EMULATOR_HOST") or ""
        if endpoint in ("", "default"):
            endpoint = "https://storage.googleapis.com"
        elif "://" not in endpoint:
            endpoint = f"http://{endpoint}"  # gcsfs reads a bare emulator host:port so
        option = "endpoint_url"
    else:
        return None
    parsed = urllib.parse.urlsplit(str(endpoint))
    host, port = parsed.hostname or "", _port(parsed)
    proxy = _proxy_for(parsed, environ)
    if proxy is not None:
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return Endpoint(str(endpoint), through.hostname or "", _port(through), option, proxy)
    return Endpoint(str(endpoint), host, port, option)


def _port(parsed: urllib.parse.SplitResult) -> int:
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def _proxy_for(parsed: urllib.parse.SplitResult, environ: Mapping[str, str]) -> str | None:
    proxies = {k.lower()[: -len("_proxy")]: v for k, v in environ.items()
               if k.lower().endswith("_proxy") and k.lower() != "no_proxy" and v}
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy:
        return None
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    if no_proxy and _bypassed(parsed.hostname or "", no_proxy):
        return None
    return proxy


def _bypassed(host: str, no_proxy: str) -> bool:
    # Undocumented but in urllib since Python 2; typeshed leaves it out.
    return bool(urllib.request.proxy_bypass_environment(host, {"no": no_proxy}))  # type: ignore[attr-defined]


def _connect(host: str, port: int, timeout_s: float) -> None:
    """Resolve ``host`` and open (then close) one TCP connection to ``host:port``."""
    with socket.create_connection((host, port), timeout=timeout_s):
        pass


def check_reachable(
    url: str,
    options: Mapping[str, Any],
    *,
    environ: Mapping[str, str] = os.environ,
    connect: Callable[[str, int, float], None] = _connect,
    timeout_s: float = REACH_TIMEOUT_S,
) -> None:
    """Raise StorageError when the endpoint of ``url`` does not resolve or answer within ``timeout_s``.

    One line: the storage URL, the endpoint (and proxy), the cause and the option to check.
    ``connect`` is injectable so unit tests need no network.
    """
    endpoint = store_endpoint(url, options, environ)
    if endpoint is None:
        return
    try:
        call_with_deadline(lambda: connect(endpoint.host, endpoint.port, timeout_s), timeout_s,
                           what=f"connect to {endpoint.address}")
    except socket.gaierror as exc:
        cause = f"host {endpoint.host} does not resolve ({exc.strerror or exc}): no network, or a wrong name"
    except ConnectionRefusedError:
        cause = f"{endpoint.address} refused the connection: nothing listens there"
    except (TimeoutError, socket.timeout):
        cause = f"{endpoint.address} did not answer within {timeout_s:g} s"
    except OSError as exc:
        cause = f"{endpoint.address}: {exc.strerror or exc}"
    else:
        return
    via = f"proxy {endpoint.proxy} for endpoint {endpoint.url}" if endpoint.proxy else f"endpoint {endpoint.url}"
    raise StorageError(
        f"cannot reach checkpoint storage {url} ({via}): {cause}; check the network and "
        f"--storage-option {endpoint.option}"
    )
