"""``--storage-option KEY=VALUE`` pairs -> the ``storage_options`` dict fsspec takes.

Values are coerced the way a shell user means them: ``true``/``false`` (any case) become
bools, integers (without leading zeros) become ints, everything else stays a string (so secrets and URLs are
never mangled: no float or null guessing). Dotted keys nest
(``client_kwargs.endpoint_url=http://...`` -> ``{"client_kwargs": {"endpoint_url": ...}}``).
A malformed item, or one that contradicts an earlier item, is a ConfigError naming it.

``with_backend_timeouts`` gives the S3 and GCS clients socket timeouts matching the store's
stall deadline (checkpoint/deadline.py), unless the user set their own.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from resilient_train.errors import ConfigError

__all__ = ["parse_storage_options", "with_backend_timeouts"]

_INT = re.compile(r"^[+-]?(0|[1-9]\d*)$")  # "0012" stays a string: it may be a key
_FLOAT = re.compile(r"^[+-]?(0|[1-9]\d*)?\.\d+([eE][+-]?\d+)?$")  # "0.2", ".5"; not "1e3" alone
_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_EXPECTED = "expected KEY=VALUE, e.g. client_kwargs.endpoint_url=http://127.0.0.1:8333"


def _coerce(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


def parse_storage_options(pairs: Iterable[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(_KEY_PART.match(p) for p in parts):
            raise ConfigError(f"Received --storage-option {item!r}; {_EXPECTED}")
        node = options
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"Received --storage-option {item!r}; {prefix!r} was already set to a value"
                )
            node = child
        leaf = parts[-1]
        if isinstance(node.get(leaf), dict):
            raise ConfigError(
                f"Received --storage-option {item!r}; {key.strip()!r} already holds nested options"
            )
        node[leaf] = _coerce(raw)
    return options


def with_backend_timeouts(url: str, options: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
    """``options`` plus the backend's own request timeouts of ``timeout_s`` seconds.

    Two layers because each catches what the other cannot: a socket timeout lets the
    client fail (and retry) a dead connection itself, and frees its thread; the store's
    deadline also covers layers without one. Only keys the user did not set are added:
    s3fs ``config_kwargs.connect_timeout`` / ``read_timeout`` (botocore's defaults are 60 s),
    gcsfs ``requests_timeout`` (aiohttp's per-request total; none by default).
    """
    if timeout_s is None:
        return options
    protocol = url.partition("://")[0] if "://" in url else ""
    options = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout_s)
        config.setdefault("read_timeout", timeout_s)
        options["config_kwargs"] = config
    elif protocol in ("gs", "gcs"):
        options.setdefault("requests_timeout", timeout_s)
    return options
