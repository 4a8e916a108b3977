"""What a launcher tells a worker through its environment, beside ``TF_CONFIG``.

The supervisor (any launcher) sets these; the worker (``runner/process/worker_main.py``) and a warm
standby (``runner/process/warm_standby.py``) read them. Defined once here so neither side spells the
other's names. A worker started by another engine without them is a standalone attempt 1.

``RT_STORAGE_SECRETS`` is how storage credentials reach a worker: ``job.json`` carries
``***`` in their place (rundir/redact.py), and the environment of a process is readable
only by its user and root, and is never written to the run dir. It holds the JSON of
``JobConfig.secrets()``; the worker puts them back with ``JobConfig.with_secrets``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from resilient_train.errors import ConfigError

__all__ = ["ATTEMPT", "RUN_ID", "GENERATION", "STANDBY_READY_FD", "STORAGE_SECRETS", "UMASK", "WorkerEnvironment"]

ATTEMPT = "RT_ATTEMPT"  # the attempt number, 1 on the first start
RUN_ID = "RT_RUN_ID"  # the run id (run.json), shared by every attempt
GENERATION = "RT_GENERATION"  # the storage generation the chief claims (checkpoint/fence.py)
STANDBY_READY_FD = "RT_STANDBY_READY_FD"  # a warm standby says "TensorFlow imported" on this fd
STORAGE_SECRETS = "RT_STORAGE_SECRETS"  # JSON: the credentials job.json shows as *** (JobConfig.secrets())
UMASK = "RT_UMASK"  # octal: the supervisor's run-dir umask, for workers on other nodes (rundir/permissions.py)


@dataclass(frozen=True)
class WorkerEnvironment:
    attempt: int = 1
    run_id: str = "standalone"
    generation: int | None = None  # None: claim the next free generation (other launchers)
    storage_secrets: Mapping[str, Any] = field(default_factory=dict, repr=False)
    umask: int | None = None  # None: keep the process's own (a local worker inherits the supervisor's)

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ConfigError(f"Received {ATTEMPT}={self.attempt}; expected an integer >= 1")
        if self.generation is not None and self.generation < 1:
            raise ConfigError(f"Received {GENERATION}={self.generation}; expected an integer >= 1")
        if self.umask is not None and not 0 <= self.umask <= 0o777:
            raise ConfigError(f"Received {UMASK}={self.umask:o}; expected an octal umask from 000 to 777")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "WorkerEnvironment":
        return cls(
            attempt=_int(environ, ATTEMPT) or 1,
            run_id=environ.get(RUN_ID) or "standalone",
            generation=_int(environ, GENERATION),
            storage_secrets=_secrets(environ),
            umask=_umask(environ),
        )

    def to_environ(self) -> dict[str, str]:
        env = {ATTEMPT: str(self.attempt), RUN_ID: self.run_id}
        if self.generation is not None:
            env[GENERATION] = str(self.generation)
        if self.umask is not None:
            env[UMASK] = f"{self.umask:03o}"
        if self.storage_secrets:
            env[STORAGE_SECRETS] = json.dumps(dict(self.storage_secrets))
        return env


def _int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"Received {name}={text!r}; expected an integer >= 1") from None


def _secrets(environ: Mapping[str, str]) -> dict[str, Any]:
    text = environ.get(STORAGE_SECRETS, "")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):  # never echo the value: it is a credential
        raise ConfigError(f"Received {STORAGE_SECRETS} that is not a JSON object; expected what the supervisor sets")
    return value


def _umask(environ: Mapping[str, str]) -> int | None:
    text = environ.get(UMASK, "")
    if not text:
        return None
    try:
        value = int(text, 8)
    except ValueError:
        raise ConfigError(f"Received {UMASK}={text!r}; expected an octal umask from 000 to 777") from None
    if not 0 <= value <= 0o777:
        raise ConfigError(f"Received {UMASK}={text!r}; expected an octal umask from 000 to 777")
    return value
