"""A NaN loss at a chosen global step: the reusable injection for the chaos catalogue and
for users' own recipes.

``RT_FAULTS`` (runner/failures/faults.py) arms it like any fault, at point ``nan_loss``::

    [{"point": "nan_loss", "global_step": 5, "rank": 1}]

The step whose global step is 5 gets ``loss + NaN`` on that rank's replicas, inside the
gradient tape, so its gradients and the weights it updates are NaN too, what a poisoned batch
does. ``attempt`` (default 1) selects the attempt, as for every fault; ``"signal"`` is
ignored. Nothing is added to the step when no such fault is armed for this process.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from resilient_train.runner.failures.faults import FaultPlan

__all__ = ["NanInjection"]

POINT = "nan_loss"


class NanInjection:
    """The global steps this process poisons (decided at start, fixed in the traced step)."""

    def __init__(self, steps: Sequence[int]) -> None:
        self.steps = tuple(sorted(set(int(s) for s in steps)))

    @classmethod
    def from_plan(cls, plan: FaultPlan) -> "NanInjection":
        return cls(plan.armed_steps(POINT))

    def poisoned(self, loss: tf.Tensor, global_step: tf.Variable) -> tf.Tensor:
        """``loss``, plus NaN when the step being trained (``global_step`` + 1) is armed."""
        if not self.steps:
            return loss
        step = tf.cast(global_step.read_value(), tf.int64) + 1
        hit = tf.reduce_any(tf.equal(step, tf.constant(self.steps, tf.int64)))
        return loss + tf.where(hit, tf.constant(float("nan"), loss.dtype), tf.zeros([], loss.dtype))
