"""What the run does about a non-finite step: ``--on-anomaly`` (job/config.py).

``stop`` (the default): the step's state is never saved. Every worker saw the same rows, so
every worker raises :class:`NumericalAnomalyError` after the same call, before any save or
snapshot of it; the worker exits ``EXIT_FATAL`` (a restart would replay the same batch and
meet the same NaN), with one line naming the step, the batch and the values. The newest
commit, taken before the anomaly, is the run's last state: nothing committed is lost.

``ignore``: the old behaviour (train on, commit whatever the state is), the anomaly still
reported once. For a user who knows the NaN is harmless (a loss that is masked later).

Not yet: ``rollback`` (restore the newest healthy commit, replay, tell a deterministic
anomaly from a transient one, skip a deterministic batch): issue 48 step 3.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from resilient_train.errors import NumericalAnomalyError
from resilient_train.job.config import ON_ANOMALY_CHOICES as ON_ANOMALY, ON_ANOMALY_IGNORE, ON_ANOMALY_STOP
from resilient_train.runner.health.detector import Anomaly

__all__ = ["HealthGuard", "check_finite_state", "event_value"]


def event_value(value: float) -> float | str:
    """A value for events.jsonl: JSON has no NaN or Infinity, so those are written as text."""
    return value if math.isfinite(value) else repr(value)


class HealthGuard:
    """Acts on a call's first anomaly, by policy; reports each anomaly once (per process)."""

    def __init__(self, on_anomaly: str, *, emit: Callable[..., None]) -> None:
        if on_anomaly not in ON_ANOMALY:
            raise ValueError(f"Received on_anomaly={on_anomaly!r}; expected one of {ON_ANOMALY}")
        self.on_anomaly = on_anomaly
        self._emit = emit
        self._reported = False  # ignore: the first anomaly is reported, the NaNs after it are its consequence

    @property
    def requires_finite_commit(self) -> bool:
        """Does the commit path refuse a non-finite state (the second guard)?"""
        return self.on_anomaly != ON_ANOMALY_IGNORE

    def after_call(self, anomaly: Anomaly | None, *, settle: Callable[[], Any] = lambda: None) -> None:
        """Raise (stop) or report and go on (ignore); nothing when the call was healthy.
        ``settle``: called before the stop raises, to let the in-flight commit of an earlier,
        healthy save finish (the checkpointer's flush): a fatal exit does not wait for it."""
        if anomaly is None or self._reported:
            return
        self._reported = True
        self._emit("anomaly_detected", group=True, kind="nonfinite", global_step=anomaly.global_step,
                   epoch=anomaly.epoch, step_in_epoch=anomaly.step_in_epoch, replicas=anomaly.replicas,
                   values={name: event_value(v) for name, v in anomaly.values.items()}, action=self.on_anomaly)
        if self.on_anomaly == ON_ANOMALY_STOP:
            settle()
            raise NumericalAnomalyError(f"{anomaly.describe()}; stopped (--on-anomaly stop), its state is not "
                                        "saved and the newest commit is the run's last healthy state")


def check_finite_state(named_values: list[tuple[str, Any]], *, global_step: int) -> None:
    """The commit path's second guard: raise if any floating tensor of the state is not finite."""
    for name, value in named_values:
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise NumericalAnomalyError(f"the state of global step {global_step} holds a non-finite value in "
                                        f"{name}; it is not committed")
