"""What a launcher tells a worker through its environment, beside ``TF_CONFIG``.

The supervisor (any launcher) sets these; the worker (``runner/worker.py``) and a warm
standby (``runner/standby.py``) read them. Defined once here so neither side spells the
other's names. A worker started by another engine without them is a standalone attempt 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from resilient_train.errors import ConfigError

__all__ = ["ATTEMPT", "RUN_ID", "GENERATION", "STANDBY_READY_FD", "WorkerEnvironment"]

ATTEMPT = "RT_ATTEMPT"  # the attempt number, 1 on the first start
RUN_ID = "RT_RUN_ID"  # the run id (run.json), shared by every attempt
GENERATION = "RT_GENERATION"  # the storage generation the chief claims (checkpoint/fence.py)
STANDBY_READY_FD = "RT_STANDBY_READY_FD"  # a warm standby says "TensorFlow imported" on this fd


@dataclass(frozen=True)
class WorkerEnvironment:
    attempt: int = 1
    run_id: str = "standalone"
    generation: int | None = None  # None: claim the next free generation (other launchers)

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ConfigError(f"Received {ATTEMPT}={self.attempt}; expected an integer >= 1")
        if self.generation is not None and self.generation < 1:
            raise ConfigError(f"Received {GENERATION}={self.generation}; expected an integer >= 1")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "WorkerEnvironment":
        return cls(
            attempt=_int(environ, ATTEMPT) or 1,
            run_id=environ.get(RUN_ID) or "standalone",
            generation=_int(environ, GENERATION),
        )

    def to_environ(self) -> dict[str, str]:
        env = {ATTEMPT: str(self.attempt), RUN_ID: self.run_id}
        if self.generation is not None:
            env[GENERATION] = str(self.generation)
        return env


def _int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"Received {name}={text!r}; expected an integer >= 1") from None
