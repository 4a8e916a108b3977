"""An epoch's running numbers, and what happens at its end.

``EpochStats`` sums every step's loss and metrics as the training call returns them
(train_call.py adds each step's row, so the epoch's means are the same for every steps per
call), and the summed states of metrics that keep counts (runner/keras_recipes/metric_states.py).
The sums travel in every checkpoint's ``extra``, so an epoch's reported loss is the same
whether or not it was interrupted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resilient_train.runner.keras_recipes.metric_states import MetricStates

__all__ = ["EpochStats"]


class EpochStats:
    """Running sums of the per-step loss and metrics of the current epoch, and of the summed
    states of ``states``' metrics (AUC, Precision...: runner/keras_recipes/metric_states.py)."""

    def __init__(self, states: MetricStates | None = None) -> None:
        self.sums: dict[str, float] = {}
        self.batches = 0
        self.states = states
        self.state_sums = np.zeros(0 if states is None else states.width, np.float32)

    def add(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.batches += 1

    def add_states(self, shares: np.ndarray) -> None:
        """One step's summed state shares: float32 sums, as the metric's own variables add."""
        self.state_sums = self.state_sums + shares.astype(np.float32)

    def means(self) -> dict[str, float]:
        if not self.batches:
            return {}
        means = {key: total / self.batches for key, total in self.sums.items()}
        if self.states is not None:
            means.update(self.states.results(self.state_sums))
        return means

    def to_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"epoch_sums": dict(self.sums), "epoch_batches": self.batches}
        if self.states is not None:  # float32 values, exact as JSON floats
            extra["epoch_metric_states"] = [float(v) for v in self.state_sums]
        return extra

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.sums = {k: float(v) for k, v in extra.get("epoch_sums", {}).items()}
        self.batches = int(extra.get("epoch_batches", 0))
        if self.states is not None and "epoch_metric_states" in extra:
            self.state_sums = np.asarray(extra["epoch_metric_states"], np.float32)
