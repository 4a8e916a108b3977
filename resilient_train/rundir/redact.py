"""Redaction: what a run writes or prints carries ``"***"`` where a credential was.

Storage credentials reach resilient-train as ``--storage-option key=... secret=...`` (the
way s3fs and gcsfs take them) or as user info in a URL (``https://user:pass@host/...``).
The run dir is read by people and tools that must not learn them (other users on a shared
host, a copied bug report, every node of a Ray cluster), so every writer of the run dir
and of a console goes through this module:

* :func:`redact` rewrites a JSON-like value: the value of every secret *key* (at any depth,
  a whole sub-tree included) becomes ``"***"``, and every string goes through
  :func:`redact_text`. ``job.json`` (job/config.py), events (rundir/events.py, the one
  choke point: console lines are rendered from the same records), error files
  (rundir/errorfile.py) and ``summary.json`` use it.
* :func:`redact_text` replaces URL user info (``scheme://***@host``) and every value this
  process registered with :func:`register_secrets`, wherever it appears: a traceback that
  printed an options dict, a log tail, a root-cause message.

Which keys are secret (one rule, docs/security.md quotes it): the key, split into
words at ``_``, ``-``, ``.`` and case changes (``SSEKMSKeyId``: sse kms key id), has a word in
:data:`SECRET_WORDS` (``key``, ``secret``, ``token``, ``password``, ``passwd``,
``credential``, ``credentials``), or is one of :data:`SECRET_NAMES`. So ``key``,
``secret``, ``token``, ``session_token``, ``client_secret``, ``aws_secret_access_key``,
``aws_access_key_id``, ``account_key``, ``sas_token``, ``SSEKMSKeyId`` are redacted;
``anon``, ``endpoint_url``, ``region_name``, ``use_ssl`` are not. Over-redacting costs
nothing: workers get the real values through their environment (cluster/environment.py,
``RT_STORAGE_SECRETS``), never through a file.

What it refuses: it does not filter raw bytes a library prints to a worker's stderr
(``worker-<rank>.log``); those are TensorFlow's and the storage library's own lines, which
do not print credentials.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterable, Mapping, TextIO

__all__ = [
    "REDACTED", "SECRET_WORDS", "SECRET_NAMES", "is_secret_key", "redact", "redact_text",
    "register_secrets", "split_secrets", "merge_secrets", "drop_redacted", "secret_keys", "secret_values",
    "RedactingWriter",
]

REDACTED = "***"
SECRET_WORDS = frozenset({"key", "secret", "token", "password", "passwd", "credential", "credentials"})
SECRET_NAMES = frozenset({"connection_string", "connectionstring"})  # Azure's holds AccountKey=...

_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# scheme://user[:password]@host: the user info is everything between // and the last @
# before the first / ? # that follows (RFC 3986 authority).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s\"']+)@")
_MIN_REGISTERED = 4  # shorter values ("1", "on") would blank out unrelated text

_lock = threading.Lock()
_registered: set[str] = set()


def is_secret_key(name: str) -> bool:
    """Whether a storage option / field named ``name`` holds a credential (rule above)."""
    words = {word.lower() for word in _WORD_BREAK.split(str(name)) if word}
    return bool(words & SECRET_WORDS) or str(name).lower() in SECRET_NAMES


def register_secrets(values: Iterable[Any]) -> None:
    """Remember ``values`` (the strings among them) so :func:`redact_text` hides them anywhere."""
    with _lock:
        _registered.update(v for v in values if isinstance(v, str) and len(v) >= _MIN_REGISTERED)


def redact_text(text: str) -> str:
    """``text`` with URL user info and every registered secret replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    with _lock:
        known = sorted(_registered, key=len, reverse=True)  # a longer secret first: no partial leftovers
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact(value: Any, *, by_key: bool = True) -> Any:
    """A copy of a JSON-like ``value`` safe to write: secret keys' values and secrets in text as ``***``.

    ``by_key=False`` keeps every key's value and only rewrites text (a record whose keys are
    a fixed vocabulary, like ``summary.json``, where ``key`` would not mean a credential).
    """
    if isinstance(value, Mapping):
        return {
            k: REDACTED if by_key and is_secret_key(k) and value[k] not in (None, "", {}) else redact(v, by_key=by_key)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v, by_key=by_key) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def split_secrets(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(public, secret)``: ``options`` with secret values as ``***``, and only those values (nested as given)."""
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for key, value in options.items():
        if is_secret_key(key) and value not in (None, "", {}):
            public[key], secret[key] = REDACTED, value
        elif isinstance(value, Mapping):
            public[key], inner = split_secrets(value)
            if inner:
                secret[key] = inner
        elif isinstance(value, str) and redact_text(value) != value:
            public[key], secret[key] = redact_text(value), value
        else:
            public[key] = value
    return public, secret


def merge_secrets(options: Mapping[str, Any], secret: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the values of ``secret`` put back (the inverse of :func:`split_secrets`)."""
    merged = dict(options)
    for key, value in secret.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = merge_secrets(current, value)
        else:
            merged[key] = value
    return merged


def drop_redacted(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without the ``***`` placeholders no secret replaced.

    A worker started from a ``job.json`` without ``RT_STORAGE_SECRETS`` (by hand, by another
    engine) then uses its storage library's own credential chain (``AWS_*`` variables,
    ``~/.aws``, instance roles) instead of sending ``***`` as a key.
    """
    kept: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            kept[key] = drop_redacted(value)
        elif value != REDACTED:
            kept[key] = value
    return kept


def secret_keys(options: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of ``options`` whose values are secret (``["key", "client_kwargs.token"]``)."""
    found: list[str] = []
    for key, value in options.items():
        dotted = f"{prefix}{key}"
        if is_secret_key(key) and value not in (None, "", {}):
            found.append(dotted)
        elif isinstance(value, Mapping):
            found += secret_keys(value, f"{dotted}.")
    return found


def secret_values(value: Any) -> list[str]:
    """Every string leaf of ``value`` (the ``secret`` half of :func:`split_secrets`)."""
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in secret_values(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in secret_values(v)]
    return [value] if isinstance(value, str) else []


class RedactingWriter:
    """A text stream that passes every write through :func:`redact_text` (the supervisor's console).

    Console lines rendered from events are already redacted; this catches the lines the
    supervisor writes itself (a root cause quoting a worker's error, a storage URL).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(redact_text(text))

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, getvalue: the stream's
        return getattr(self.stream, name)
