"""Detect a non-finite step, in the graph and on the host.

In the graph (per replica, inside the step): ``step_nonfinite`` is 1.0 when the loss or the
global norm of the gradients is not finite, else 0.0. The global norm is one reduction over
the gradients the step computed anyway; a NaN or an Inf in any gradient makes it non-finite,
so one ``is_finite`` covers them all. A model's own ``train_step`` does not show its
gradients: there the step's returned logs are tested (a NaN loss shows in its ``loss`` log).

On the host: ``first_anomaly`` reads a call's reduced rows and names the first step whose
``__nonfinite__`` SUM is above zero. Every worker reads the same rows, so every worker
finds the same step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import tensorflow as tf

from resilient_train.runner.training import control_row

__all__ = ["Anomaly", "NONFINITE", "REPLICAS", "SPIKE", "step_nonfinite", "logs_nonfinite", "first_anomaly"]


NONFINITE = "nonfinite"
REPLICAS = "replicas"
SPIKE = "spike"


@dataclass(frozen=True)
class Anomaly:
    """A step whose loss or gradients were not finite on some replica (``nonfinite``), or at
    which the replicas' trainable weights differ (``replicas``: runner/health/replicas.py)."""

    global_step: int  # the step that had it (1-based, as checkpoints count)
    epoch: int
    step_in_epoch: int  # 0-based index of the batch within its epoch
    replicas: int  # how many replicas saw it (the column's SUM), or differ from the others
    values: dict[str, float]  # the step's reduced values (loss, metrics)
    kind: str = NONFINITE
    ranks: tuple[int, ...] = ()  # replicas: the workers whose weights differ from the others'
    reference: dict[str, float] | None = None  # spike: the window's median and the threshold the loss passed

    def __post_init__(self) -> None:
        if self.global_step < 1:
            raise ValueError(f"Received global_step={self.global_step}; expected >= 1")
        if self.replicas < 1:
            raise ValueError(f"Received replicas={self.replicas}; expected >= 1")

    def describe(self) -> str:
        if self.kind == REPLICAS:
            ranks = ", ".join(str(r) for r in self.ranks)
            return (f"the replicas' trainable weights differ at global step {self.global_step} (epoch {self.epoch}, "
                    f"batch {self.step_in_epoch} of the epoch): {self.replicas} replica(s) on rank(s) {ranks} differ "
                    "from the others (silent data corruption, or a model whose copies are not kept equal)")
        values = ", ".join(f"{name}={value!r}" for name, value in self.values.items())
        if self.kind == SPIKE and self.reference is not None:
            return (f"a loss spike at global step {self.global_step} (epoch {self.epoch}, batch {self.step_in_epoch} "
                    f"of the epoch): loss={self.values.get('loss')!r} above {self.reference['threshold']:.6g} (the "
                    f"last steps' median {self.reference['median']:.6g}; --loss-spike)")
        return (f"non-finite loss or gradients at global step {self.global_step} (epoch {self.epoch}, "
                f"batch {self.step_in_epoch} of the epoch) on {self.replicas} replica(s): {values}")


def step_nonfinite(loss: tf.Tensor, gradients: Sequence[Any] | None = None,
                   values: Sequence[tf.Tensor] = ()) -> tf.Tensor:
    """1.0 if ``loss`` or the global norm of ``gradients`` (or any of ``values``) is not finite."""
    checks = [tf.reduce_all(tf.math.is_finite(tf.cast(loss, tf.float32)))]
    present = [g for g in (gradients or ()) if g is not None]
    if present:
        checks.append(tf.math.is_finite(tf.linalg.global_norm(present)))
    checks.extend(tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32))) for v in values)
    finite = checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))
    return 1.0 - tf.cast(finite, tf.float32)


def logs_nonfinite(values: dict[str, tf.Tensor]) -> tf.Tensor:
    """A model's own ``train_step``: 1.0 if any of its returned logs is not finite."""
    logs = list(values.values())
    return step_nonfinite(logs[0], values=logs[1:])


def first_anomaly(rows: Sequence[Any], names: Sequence[str], *, first_global_step: int,
                  position: Callable[[], tuple[int, int]]) -> Anomaly | None:
    """The first of a call's rows whose ``__nonfinite__`` SUM is above zero, as an Anomaly.

    ``first_global_step``: the global step of ``rows[0]``; ``position()``: (the epoch, the
    index of ``rows[0]``'s batch in it), asked only when a row has it (a call never crosses an
    epoch end: runner/state/save_policy.py)."""
    for offset, row in enumerate(rows):
        values, votes = control_row.split(row, names)
        if votes.nonfinite > 0:
            epoch, first_step_in_epoch = position()
            return Anomaly(global_step=first_global_step + offset, epoch=epoch,
                           step_in_epoch=first_step_in_epoch + offset, replicas=int(round(votes.nonfinite)),
                           values={k: v for k, v in values.items() if not k.startswith("__")})
    return None
