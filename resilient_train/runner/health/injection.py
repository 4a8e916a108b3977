"""A NaN loss, or a flipped bit in one rank's weights, at a chosen global step: the reusable
injections for the chaos catalogue and for users' own recipes.

``RT_FAULTS`` (runner/failures/faults.py) arms it like any fault, at point ``nan_loss``::

    [{"point": "nan_loss", "global_step": 5, "rank": 1}]

The step whose global step is 5 gets ``loss + NaN`` on that rank's replicas, inside the
gradient tape, so its gradients and the weights it updates are NaN too, what a poisoned batch
does. ``attempt`` (default 1) selects the attempt, as for every fault: attempt 1 only is a
transient (a flipped bit that a replay does not meet again); ``"attempt": "all"`` is a poisoned
batch, NaN whenever step 5 is trained, in every attempt, so the replay meets it again
(``deterministic``) and the run skips that batch (runner/health/anomaly_policy.py). A skipped
batch is consumed without a training step, so the injection never fires on it. ``"signal"`` is
ignored. Nothing is added to the step when no such fault is armed for this process.

The injection sits in the runner's own training step (runner/training/train_call.py), so it
works on any recipe the runner trains with its step, a user's too, armed from the environment
of ``resilient-train run`` (docs/failures.md). A model with its own ``train_step``
(runner/keras_recipes/own_step.py) computes its loss itself: there it is not armed.

Point ``loss_spike`` multiplies that rank's loss at that step by 100 instead (a poisoned batch:
its gradients too), for ``--loss-spike`` (runner/health/spikes.py); ``"attempt": "all"`` as above;
``"factor": F`` multiplies by F instead of 100. The detector wants the step's reduced loss above
twice the largest of the last 100 (spikes.py ``OVER_MAX``): a batch whose own loss is small may
need more than 100 (the catalogue's ``loss-spike`` uses 10000, whatever the seed).

Point ``bitflip`` (silent data corruption)::

    [{"point": "bitflip", "global_step": 8, "rank": 1}]

flips bit 23 of element 0 of the first trainable variable in that rank's copies (float32's
lowest exponent bit: the value halves or doubles and stays finite, so only the replicas'
comparison can see it, runner/health/replicas.py), once, between calls: before the first call
that starts at or after global step 8. The other ranks' copies are untouched.

Point ``slow`` (a straggler: a noisy neighbour, a throttled CPU)::

    [{"point": "slow", "global_step": 0, "rank": 1, "factor": 3}]

makes that rank about ``factor`` times slower for the rest of the attempt, from the first call
that starts after global step 0: after each training call the rank's host loop sleeps
``factor - 1`` times the call's own duration on that rank (its peers wait for it in the next
call's all-reduce). The straggler detector names it (runner/health/stragglers.py).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.health.replicas import tf_variable_of

__all__ = ["NanInjection", "BitFlip", "Slowdown"]

POINT = "nan_loss"
SPIKE_POINT = "loss_spike"
SPIKE_FACTOR = 100.0
FLIP_POINT = "bitflip"
FLIPPED_BIT = 23
SLOW_POINT = "slow"


class NanInjection:
    """The global steps this process poisons (decided at start, fixed in the traced step):
    ``steps`` with a NaN, ``spike_steps`` with SPIKE_FACTOR times the loss (point ``loss_spike``:
    a poisoned batch whose gradients are that much larger too, runner/health/spikes.py), or
    ``spike_factors`` times it, one per spike step."""

    def __init__(self, steps: Sequence[int], spike_steps: Sequence[int] = (),
                 spike_factors: Sequence[float] | None = None) -> None:
        self.steps = tuple(sorted(set(int(s) for s in steps)))
        factors = dict(zip((int(s) for s in spike_steps), spike_factors or [SPIKE_FACTOR] * len(spike_steps)))
        self.spike_steps = tuple(sorted(factors))
        self.spike_factors = tuple(float(factors[s]) for s in self.spike_steps)

    @classmethod
    def from_plan(cls, plan: FaultPlan) -> "NanInjection":
        """A ``loss_spike`` without a ``factor`` (the fault's default 1) is SPIKE_FACTOR times the loss."""
        spikes = plan.armed(SPIKE_POINT)
        return cls(plan.armed_steps(POINT), [step for step, _ in spikes],
                   [SPIKE_FACTOR if factor == 1 else factor for _, factor in spikes])

    def poisoned(self, loss: tf.Tensor, global_step: tf.Variable) -> tf.Tensor:
        """``loss``, plus NaN when the step being trained (``global_step`` + 1) is armed, or
        SPIKE_FACTOR times it."""
        if not self.steps and not self.spike_steps:
            return loss
        step = tf.cast(global_step.read_value(), tf.int64) + 1
        if self.spike_steps:
            spiked = tf.equal(step, tf.constant(self.spike_steps, tf.int64))
            factors = tf.constant(self.spike_factors, loss.dtype)
            loss = loss * tf.reduce_max(tf.where(spiked, factors, tf.ones_like(factors)))
        if not self.steps:
            return loss
        hit = tf.reduce_any(tf.equal(step, tf.constant(self.steps, tf.int64)))
        return loss + tf.where(hit, tf.constant(float("nan"), loss.dtype), tf.zeros([], loss.dtype))


class BitFlip:
    """The global steps after which this process flips a bit of its weights (host side, once each)."""

    def __init__(self, steps: Sequence[int]) -> None:
        self._pending = sorted(set(int(s) for s in steps))

    @classmethod
    def from_plan(cls, plan: FaultPlan) -> "BitFlip":
        return cls(plan.armed_steps(FLIP_POINT))

    def before_call(self, global_step: int, variables: Sequence[Any], strategy: tf.distribute.Strategy) -> None:
        """Before a call that starts after ``global_step``: flip, if a flip is due by then."""
        if not self._pending or self._pending[0] > global_step or not variables:
            return
        self._pending = [s for s in self._pending if s > global_step]
        for copy in strategy.experimental_local_results(tf_variable_of(variables[0])):  # this worker's copies only
            value = np.array(copy.numpy())
            flat = value.reshape(-1).view(f"u{value.dtype.itemsize}")
            flat[0] ^= np.array(1 << FLIPPED_BIT, dtype=flat.dtype)
            copy.assign(value)


class Slowdown:
    """RT_FAULTS ``slow``: after global step ``after``, this process's host loop sleeps
    ``factor - 1`` times each training call's duration (``factor`` 1: never armed)."""

    def __init__(self, after: int = 0, factor: float = 1.0) -> None:
        if not factor >= 1:
            raise ValueError(f"Received factor={factor!r}; expected a number >= 1 (how many times slower)")
        self.after, self.factor = after, factor

    @classmethod
    def from_plan(cls, plan: FaultPlan) -> "Slowdown":
        armed = plan.armed(SLOW_POINT)
        return cls(*armed[0]) if armed else cls()

    def after_call(self, started_at_step: int, call_s: float) -> None:
        """At a call's end, on the host: the slow rank's extra time (a no-op unless armed)."""
        if self.factor > 1 and started_at_step >= self.after:
            time.sleep((self.factor - 1) * call_s)
