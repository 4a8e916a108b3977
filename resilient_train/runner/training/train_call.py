"""The training call: one compiled tf.function that runs N training steps, and its host side.

Every host-side call costs about a millisecond (argument conversion, dispatch, reading the
result), so a call runs up to ``--steps-per-execution`` steps (call_size.py sizes them by
time) and the host reads ONE small tensor per call: the packed all-reduce's rows, stacked.
Per step, besides the gradients' all-reduce, that one packed all-reduce carries

    [loss, metric means..., metric state shares..., the control columns, the comparison]

where the control columns are control_row.py's table (the stop and save votes, the chief's
next call size and memory-tier intervals: the single definition of their layout) and the
comparison is the memory tier's fingerprint of the may-differ variables, carried only by
the last step of a call that ends at a snapshot (runner/state/worker_agreement.py).

This module owns the row's layout as traced (``value names``), the call's sizing (the
chief times every call, every worker adopts the agreed size from the call's result), the
step-index record (``--record-indices``) and the fault points that fire at a call's end.
It refuses to decide anything between calls (when to save, snapshot, stop): the Trainer
does that with the ``CallOutcome`` it returns. Counters advance in-graph, step by step,
so a call that fails part-way leaves them at its last finished step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.rundir.stepindices import StepIndexLog
from resilient_train.runner.health import detector as health_detector
from resilient_train.runner.health.anomaly_policy import HealthGuard
from resilient_train.runner.health.injection import NanInjection
from resilient_train.runner.process import startup_phases
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.input.batches import average_loss, per_example_loss, unpack_batch, with_autograph
from resilient_train.runner.keras_recipes.metric_states import is_state_column
from resilient_train.runner.keras_recipes.own_step import LastLogs, OwnStep
from resilient_train.runner.state.tier import MemoryTier
from resilient_train.runner.training import control_row
from resilient_train.runner.training.call_size import CallSizer
from resilient_train.runner.training.epoch_end import EpochStats

__all__ = ["CallOutcome", "TrainCall", "hit_step_faults"]


@dataclass(frozen=True)
class CallOutcome:
    """What every worker agreed in a call's last step."""

    stop: bool  # some worker asked to stop (SIGTERM/SIGINT): every worker stops after this call
    save: bool  # the chief's time-based vote or a preemption notice: every worker saves after it


class TrainCall:
    """The compiled training call of one Trainer, and what the host does around it.

    ``counters``: the checkpoint's ``(global_step, step_in_epoch)`` variables, advanced
    in-graph. ``stop_vote()`` / ``save_vote()``: this worker's votes in the call's stop and
    save columns, asked once per call. ``save_at(step)``: is ``step`` a step-count save
    point (a snapshot's comparison then rides the call that reaches it). ``indices``: the
    ``--record-indices`` log (None: not recording; every worker gathers, the chief's log writes).
    ``health``: acts on a call's first non-finite step (--on-anomaly, runner/health/) before
    anything of that call is saved; ``settle()`` first lands the earlier, healthy save in flight;
    ``position(steps)``: (epoch, step in the epoch) of the call's first step, after it.
    ``nan_injection``: RT_FAULTS ``nan_loss`` (compiled in only when armed).
    """

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        recipe: Recipe,
        own_step: OwnStep | None,
        counters: tuple[tf.Variable, tf.Variable],
        global_batch_size: int,
        steps_per_execution: int | str,
        tier: MemoryTier | None,
        is_chief: bool,
        stop_vote: Callable[[], float],
        save_vote: Callable[[], float],
        save_at: Callable[[int], bool],
        indices: StepIndexLog | None,
        health: HealthGuard,
        settle: Callable[[], Any],
        position: Callable[[int], tuple[int, int]],
        nan_injection: NanInjection,
    ) -> None:
        self._recipe = recipe
        self._health, self._settle, self._position = health, settle, position
        self._nan_injection = nan_injection
        self._tier = tier
        self._is_chief = is_chief
        self._stop_vote, self._save_vote, self._save_at = stop_vote, save_vote, save_at
        self._indices = indices
        self.sizer = CallSizer(steps_per_execution)
        self.steps = self.sizer.initial  # the agreed maximum of the next call
        self._value_names: list[str] = []  # the packed row's layout, filled when traced
        self.trained = False  # a call of this process finished (Trainer.untrained_fresh_start)
        self._call = self._compile(strategy, model, optimizer, own_step, counters, global_batch_size)

    def _compile(self, strategy: tf.distribute.Strategy, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                 own_step: OwnStep | None, counters: tuple[tf.Variable, tf.Variable],
                 global_batch_size: int) -> Callable[..., Any]:
        """One compiled call: ``steps`` training steps, counters advanced in-graph.

        The call returns the reduced rows stacked, shape [steps, values]: the host sums the
        epoch's loss per step exactly as a one-step-per-call loop would (bit-identical epoch
        means for every N).
        """
        recipe, tier = self._recipe, self._tier
        names = self._value_names
        global_step, step_in_epoch = counters
        indexed, record = recipe.indexed, self._indices is not None
        # The recipe's own functions keep AutoGraph (Python control flow on tensors works in
        # them as in any tf.function); the runner's code around them is written for graph mode
        # and is not converted: converting it was ~0.5 s of every attempt's trace (0.59 s;
        # benchmarks/README.md), the largest phase of a warm restart.
        recipe_loss = with_autograph(recipe.loss)
        recipe_metrics = None if recipe.metrics is None else with_autograph(recipe.metrics)
        states = recipe.metric_states  # summed metric states (AUC, Precision...): metric_states.py
        nan_injection = self._nan_injection

        def runner_step(batch):
            features, labels, sample_weight = unpack_batch(batch, recipe.name)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example = per_example_loss(recipe, labels, predictions, loss=recipe_loss)
                loss = average_loss(per_example, sample_weight, global_batch_size)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                loss = nan_injection.poisoned(loss, global_step)  # RT_FAULTS nan_loss (no-op unless armed)
            gradients = tape.gradient(loss, model.trainable_variables)
            nonfinite = health_detector.step_nonfinite(loss, gradients)  # the __nonfinite__ column
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            values = {"loss": loss}
            if recipe_metrics is not None:
                for name, metric in recipe_metrics(labels, predictions).items():
                    values[name] = tf.nn.compute_average_loss(
                        tf.cast(metric, tf.float32), global_batch_size=global_batch_size
                    )
            # The summed metric states: this replica's batch's share, summed by the step's
            # all-reduce (runner/keras_recipes/metric_states.py).
            shares = tf.zeros([0], tf.float32) if states is None else states.shares(labels, predictions, sample_weight)
            return values, shares, nonfinite

        def step_fn(element, flags, fingerprint: bool):
            # An indexed pipeline yields (batch, example indices): runner/input/indexed.py.
            batch, indices = element if indexed else (element, None)
            # A model's own train_step (runner/keras_recipes/own_step.py) or the runner's step.
            if own_step is not None:  # its gradients are not visible: its logs are tested
                values = own_step.step(batch)
                shares, nonfinite = tf.zeros([0], tf.float32), health_detector.logs_nonfinite(values)
            else:
                values, shares, nonfinite = runner_step(batch)
            # The memory tier's comparison of the may-differ variables, after this step's
            # update (runner/state/worker_agreement.py): the columns after the named ones,
            # only in the last step of a call that ends at a snapshot (``fingerprint``).
            # Reading the variables holds that step's all-reduce back until the update is
            # done, and even zero columns cost 0.1-0.25 ms of a 4 ms step (digits_cnn): so
            # no other step carries them (a tf.cond in every step cost ~5%).
            if fingerprint and tier is not None and tier.agreement is not None:
                agreement = tier.call_columns()
            else:
                agreement = tf.zeros([0], tf.float32)
            state_columns = [] if states is None else states.columns()
            names[:] = control_row.layout(list(values) + state_columns)  # fixed at trace time
            packed = tf.concat([tf.stack([tf.cast(v, tf.float32) for v in values.values()]), shares,
                                control_row.in_replica(flags, nonfinite), agreement], axis=0)
            context = tf.distribute.get_replica_context()
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, packed)
            if not record:
                return reduced
            # The indices every replica was fed, in replica (= rank) order: the global batch.
            # tf.identity places them on this replica's device (all_gather needs a device;
            # the iterator's output has none).
            return reduced, context.all_gather(tf.identity(indices), axis=0)

        @tf.function(autograph=False)  # the loop below is a tf.while_loop; the recipe's code is converted (above)
        def train_call(iterator, steps, flags, fingerprint: bool):
            # ``fingerprint`` is a Python bool, so two variants: the second, whose last step
            # also carries the comparison's columns, is traced at the first call that ends at
            # a memory-tier snapshot (every worker at the same call). Its other rows are
            # padded with zeros after their all-reduce (a local op), to stack with the last.
            startup_phases.count_trace()  # the Python body runs only when tf.function traces
            width = (tier.call_columns(width_only=True)
                     if fingerprint and tier is not None and tier.agreement is not None else 0)

            def one_step(i, rows, index_rows, with_fingerprint: bool):
                result = strategy.run(step_fn, args=(next(iterator), flags), kwargs={"fingerprint": with_fingerprint})
                if record:
                    result, gathered = result
                    index_rows = index_rows.write(i, strategy.experimental_local_results(gathered)[0])
                row = strategy.experimental_local_results(result)[0]
                rows = rows.write(i, tf.pad(row, [[0, width]]) if width and not with_fingerprint else row)
                # Step by step, each after its step's result: a call that fails part-way
                # (e.g. the dataset ran out) leaves the counters at the last finished step,
                # which is what the failure report reads (runner/failures/diagnose.py).
                with tf.control_dependencies([row]):
                    global_step.assign_add(1)
                    step_in_epoch.assign_add(1)
                return rows, index_rows

            def plain_step(i, rows, index_rows):
                return (i + 1, *one_step(i, rows, index_rows, False))

            rows = tf.TensorArray(tf.float32, size=steps)
            index_rows = tf.TensorArray(tf.int64, size=steps)
            plain = steps - 1 if fingerprint else steps
            _, rows, index_rows = tf.while_loop(lambda i, rows, index_rows: i < plain, plain_step,
                                                (tf.constant(0, steps.dtype), rows, index_rows))
            if fingerprint:
                rows, index_rows = one_step(steps - 1, rows, index_rows, True)
            startup_phases.mark("trace")
            return (rows.stack(), index_rows.stack()) if record else rows.stack()

        return train_call

    def run(self, iterator: Any, steps: int, global_step: int, stats: EpochStats | LastLogs) -> CallOutcome:
        """Train ``steps`` steps after ``global_step``, add each step's values to ``stats``;
        returns the agreed votes and sets ``self.steps``, the agreed maximum of the next call."""
        tier, chief = self._tier, self._is_chief
        snapshot_every, capture_every = (
            tier.proposal(call_steps=self.steps, proposed_call_steps=self.sizer.proposal(),
                          step_s=self.sizer.step_seconds)
            if chief and tier is not None else (0.0, 0.0))
        flags = control_row.encode(control_row.Votes(
            stop=self._stop_vote(), save=self._save_vote(),
            next_call=self.sizer.proposal() if chief else 0.0, snapshot_every=snapshot_every,
            capture_every=capture_every))
        started, traces = time.perf_counter(), startup_phases.traces()
        # Does a snapshot follow this call? Then its last step fingerprints for the comparison
        # (memory tier; a snapshot after a call without them compares with its own all-reduce).
        fingerprint = tier is not None and tier.fingerprint_due(global_step + steps, save_at=self._save_at)
        result = self._call(iterator, tf.constant(steps, tf.int32), flags, bool(fingerprint))
        if self._indices is not None:
            result, index_rows = result
            for offset, indices in enumerate(index_rows.numpy(), 1):
                self._indices.write(global_step + offset, indices.tolist())
            self._indices.flush()
        rows = result.numpy()
        startup_phases.mark("first_call")
        self.trained = True
        # A non-finite step is acted on here (--on-anomaly), before any save or snapshot of it.
        self._health.after_call(health_detector.first_anomaly(
            rows, self._value_names, first_global_step=global_step + 1, position=lambda: self._position(steps)),
            last_global_step=global_step + steps, settle=self._settle)
        if chief:
            self.sizer.observed(steps, time.perf_counter() - started, traced=startup_phases.traces() != traces)
        self._add_rows(rows, stats)
        if tier is not None:
            tier.saw_call(rows[-1], len(self._value_names), fingerprint=fingerprint)
        _, agreed = control_row.split(rows[-1], self._value_names)
        self.steps = max(1, int(round(agreed.next_call)))
        if tier is not None:
            tier.adopt(agreed.snapshot_every, agreed.capture_every)
        return CallOutcome(stop=agreed.stop > 0, save=agreed.save > 0)

    def _add_rows(self, rows: np.ndarray, stats: EpochStats | LastLogs) -> None:
        """Each step's named values, and its summed metric states (their columns follow the
        named values), one step at a time as a one-step-per-call loop would add them."""
        names, states = self._value_names, self._recipe.metric_states
        for row in rows:
            values, _ = control_row.split(row, names)
            stats.add({name: value for name, value in values.items() if not is_state_column(name)})
            if states is not None:
                assert isinstance(stats, EpochStats)  # a model's own step sums no states (own_step.py)
                stats.add_states(row[len(values) - states.width:len(values)])


def hit_step_faults(faults: FaultPlan, first: int, last: int) -> None:
    """Faults address single steps; one inside a call fires at the call's end (the first
    moment the host sees that step done), in step order."""
    for step in range(first, last + 1):
        faults.hit("raise", step)
        faults.hit("after_step", step)
