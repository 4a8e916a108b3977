"""Keras metrics whose state is not a mean (``AUC``, ``Precision``, ``Recall``, ``F1Score``,
``MeanIoU``...): their state summed over every replica and step, kept with every checkpoint.

Keras under a strategy keeps such a metric's variables per replica (sync-on-read, summed when
read) and computes ``result()`` from the sums. Every built-in one's state is a sum over
examples (confusion counts, totals, a confusion matrix), so a batch's share is its
``update_state`` from zeros (``stateless_update_state``). The training step computes each
replica's share and adds it, flattened, to the packed all-reduce (runner/training/loop.py: the
columns named :data:`STATE_PREFIX` ``<i>``), so the host gets the batch's share of all
workers at once and adds it to float32 sums (float32 as the variables are: on one worker the
same additions as Keras' ``assign_add``, so the same result). The sums are the epoch's
running sums (runner/training/epoch_end.py ``EpochStats``), which travel in every checkpoint's ``extra``
(mid-epoch too) and restart at each epoch, as Keras resets metrics; a resumed epoch adds on
to them. The value reported is the metric's own ``stateless_result`` of the sums.

The evaluation (runner/outputs/evaluation.py) sums the same shares over the held-out batches.

``compile(weighted_metrics=[...])`` are metrics of the same kind (a weighted mean keeps
``sum(w * value)`` and ``sum(w)``: a ratio of sums, not a mean of per-step means) whose
update is given the batch's sample weights.

Only Keras' own classes are taken (:data:`ADDITIVE`): a metric of your own may keep a state
that is not a sum (a maximum, a last value), which adding shares would get wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

__all__ = ["MetricStates", "StatefulMetric", "STATE_PREFIX", "ADDITIVE", "is_state_column"]

STATE_PREFIX = "__state__"
# Keras' metrics whose every variable is a sum over examples (their update_state only adds):
# job/recipe.py STATEFUL_METRICS lists every non-mean one, tests/runner/keras_recipes/test_metric_states.py
# checks these against plain Keras.
ADDITIVE = (
    "AUC", "BinaryIoU", "F1Score", "FBetaScore", "FalseNegatives", "FalsePositives", "IoU", "Mean", "MeanIoU",
    "OneHotIoU", "OneHotMeanIoU", "Precision", "PrecisionAtRecall", "R2Score", "Recall", "RecallAtPrecision",
    "RootMeanSquaredError", "SensitivityAtSpecificity", "SpecificityAtSensitivity", "Sum", "TrueNegatives",
    "TruePositives",
)


def is_state_column(name: str) -> bool:
    return name.startswith(STATE_PREFIX)


@dataclass(frozen=True)
class StatefulMetric:
    """One metric as logged (``auc``, ``risk_auc``); ``select(labels, predictions)`` gives its
    output's ``(labels, predictions)``."""

    name: str
    metric: keras.metrics.Metric
    select: Callable[[Any, Any], tuple[Any, Any]]
    weighted: bool = False  # compile(weighted_metrics=...): updated with the batch's sample weights


class MetricStates:
    """The stateful metrics of one compiled model, flattened into one float32 vector."""

    def __init__(self, metrics: list[StatefulMetric]) -> None:
        self.metrics = metrics
        self._layout = [[(tuple(v.shape), v.dtype) for v in entry.metric.variables] for entry in metrics]
        self.width = sum(int(np.prod(shape)) for variables in self._layout for shape, _ in variables)
        self._columns = [f"{STATE_PREFIX}{i}" for i in range(self.width)]

    def columns(self) -> list[str]:
        """The packed row's names of the state columns."""
        return list(self._columns)

    def shares(self, labels: Any, predictions: Any, sample_weight: Any = None) -> tf.Tensor:
        """This replica's batch's share of every state, flat float32 ``[width]`` (traced).
        ``sample_weight`` weighs the ``weighted_metrics`` only, as Keras' ``CompileMetrics``."""
        parts = []
        for entry, variables in zip(self.metrics, self._layout):
            zeros = [tf.zeros(shape, dtype) for shape, dtype in variables]
            y, p = entry.select(labels, predictions)
            weights = {"sample_weight": sample_weight} if entry.weighted and sample_weight is not None else {}
            for value in entry.metric.stateless_update_state(zeros, y, p, **weights):
                parts.append(tf.reshape(tf.cast(value, tf.float32), [-1]))
        return tf.concat(parts, axis=0) if parts else tf.zeros([0], tf.float32)

    def not_scalar(self) -> list[str]:
        """The metrics whose result is not one number (``Recall(thresholds=[...])``,
        ``F1Score(average=None)``): a log, a CSV column and a callback's monitor need one."""
        zeros = np.zeros(self.width, np.float32)
        return [entry.name for entry, state in zip(self.metrics, self._states(zeros))
                if tf.convert_to_tensor(entry.metric.stateless_result(state)).shape.rank != 0]

    def _states(self, sums: np.ndarray) -> list[list[tf.Tensor]]:
        states, offset = [], 0
        for variables in self._layout:
            state = []
            for shape, dtype in variables:
                size = int(np.prod(shape))
                state.append(tf.constant(np.asarray(sums[offset:offset + size], np.float32).reshape(shape), dtype))
                offset += size
            states.append(state)
        return states

    def results(self, sums: np.ndarray) -> dict[str, float]:
        """Each metric's ``result()`` from the summed states (host, eager)."""
        return {entry.name: float(entry.metric.stateless_result(state))
                for entry, state in zip(self.metrics, self._states(sums))}


def built_for(metric: keras.metrics.Metric, output_shape: tuple) -> keras.metrics.Metric:
    """A metric whose variables Keras makes at its first update (``F1Score``, ``R2Score``) made
    now, for an output of ``output_shape`` (labels of the same shape), so its state has a layout
    before the step is traced."""
    if not getattr(metric, "_built", True) and hasattr(metric, "_build"):
        metric._build(tuple(output_shape), tuple(output_shape))
    return metric
