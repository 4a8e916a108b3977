"""The training call: one compiled tf.function that runs N training steps, and its host side.

Every host-side call costs about a millisecond (argument conversion, dispatch, reading the
result), so a call runs up to ``--steps-per-execution`` steps (call_size.py sizes them by
time) and the host reads two small tensors per call: the packed all-reduce's rows, stacked,
and the comparisons. Per step, besides the gradients' all-reduce, that one packed all-reduce carries

    [loss, metric means..., metric state shares..., the control columns, the timing block,
     a model's own trackers]

where the control columns are control_row.py's table (the stop and save votes, the chief's
next call size and memory-tier intervals: the single definition of their layout), the timing
block each rank's share of its host time before the call and of the time its process could not
run (control_row.py: the straggler detector's input, runner/health/stragglers.py), and the
trackers' tail, with a model's own train_step on several replicas: their sums, which each
replica keeps as its equal share, the state a restore gives (own_step.py ``OwnStep.fold``;
cut off the row before it leaves the step). The
comparisons, the memory tier's fingerprint of the may-differ variables
(runner/state/worker_agreement.py) and every replica's hash of its trainable weights
(runner/health/replicas.py), are computed after the call's last step and summed by an
all-reduce of their own, in the same call, only when the call is "checked" (zeros otherwise).
A call is checked when it ends at a snapshot, a step-count save point, an epoch end or a
multiple of ``--replica-check-every``: nothing is saved or snapshotted that was not compared
at its step. Checked or not is a tensor argument, so an attempt traces the call once, with
one copy of the step in its graph.

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
from resilient_train.rundir.events import emit
from resilient_train.rundir.stepindices import StepIndexLog
from resilient_train.rundir.stepmarker import StepMarker
from resilient_train.runner.health import detector as health_detector
from resilient_train.runner.health.anomaly_policy import HealthGuard
from resilient_train.runner.health.detector import REPLICAS, SPIKE, Anomaly
from resilient_train.runner.health.injection import BitFlip, NanInjection, Slowdown
from resilient_train.runner.health.replicas import ReplicaCheck
from resilient_train.runner.health.stall_probe import StallProbe
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
    host_s: tuple[float, ...] = ()  # each rank's host seconds before the call (one worker: none)
    stall_s: tuple[float, ...] = ()  # each rank's seconds it could not run since its previous call began
    traced: bool = False  # the call traced a variant (its time is start-up, not the run's pace)


class TrainCall:
    """The compiled training call of one Trainer, and what the host does around it.

    ``counters``: the checkpoint's ``(global_step, step_in_epoch)`` variables, advanced
    in-graph. ``stop_vote(ends)`` / ``save_vote()``: this worker's votes in the call's stop and
    save columns, asked once per call (``ends``: the global step the call ends at, where the group
    saves and stops when the stop is agreed). ``save_at(step)``: is ``step`` a step-count save
    point (a snapshot's comparison then rides the call that reaches it). ``indices``: the
    ``--record-indices`` log (None: not recording; every worker gathers, the chief's log writes).
    ``health``: acts on a call's first non-finite step (--on-anomaly, runner/health/) before
    anything of that call is saved; ``settle()`` first lands the earlier, healthy save in flight;
    ``position(steps)``: (epoch, step in the epoch) of the call's first step, after it.
    ``marker``: the step marker the hang watchdog reads, written after every call.
    ``nan_injection``: RT_FAULTS ``nan_loss`` (compiled in only when armed); ``bitflip``: RT_FAULTS
    ``bitflip`` (between calls). ``replica_check_every``: ``--replica-check-every`` (0: the
    replicas are compared only where something is saved or snapshotted; None: never).
    ``slowdown``: RT_FAULTS ``slow`` (a straggler, after each call; a no-op unless armed).
    ``stall_probe``: this process's stalled seconds (runner/health/stall_probe.py), taken at each
    call's start for the timing block (None: 0, e.g. one worker or the detector off).
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
        stop_vote: Callable[[int], float],
        save_vote: Callable[[], float],
        marker: StepMarker,
        save_at: Callable[[int], bool],
        indices: StepIndexLog | None,
        health: HealthGuard,
        settle: Callable[[], Any],
        position: Callable[[int], tuple[int, int]],
        nan_injection: NanInjection,
        bitflip: BitFlip,
        replica_check_every: int | None,
        rank: int,
        sum_over_workers: Callable[[tf.Tensor], tf.Tensor],
        slowdown: Slowdown | None = None,
        stall_probe: StallProbe | None = None,
    ) -> None:
        self._recipe = recipe
        self._health, self._settle, self._position = health, settle, position
        self._marker, self._counters = marker, counters
        # RT_FAULTS bitflip, between calls (a no-op unless armed)
        self._flip = lambda global_step: bitflip.before_call(global_step, model.trainable_variables, strategy)
        self.replicas = None if replica_check_every is None else ReplicaCheck(
            model.trainable_variables, every=replica_check_every, rank=rank,
            replicas=strategy.num_replicas_in_sync, local_replicas=len(strategy.extended.worker_devices),
            sum_over_workers=sum_over_workers, strategy=strategy)
        local_replicas = len(strategy.extended.worker_devices)
        self._timing = dict(rank=rank, workers=strategy.num_replicas_in_sync // local_replicas,
                            local_replicas=local_replicas)  # the timing block (control_row.py)
        self._slowdown = slowdown or Slowdown()
        self._stall_probe = stall_probe
        self._host_from: float | None = None  # when the previous call's result was read (the host time since: timing block)
        self._tier_width = 0  # the tier's comparison columns in a call's last row (set when traced)
        self._check_width = 0  # all the comparison columns there: the tier's, then the replicas' (set when traced)
        self._tier = tier
        self._is_chief = is_chief
        self._stop_vote, self._save_vote, self._save_at = stop_vote, save_vote, save_at
        self._indices = indices
        self.sizer = CallSizer(steps_per_execution)
        self.steps = self.sizer.initial  # the agreed maximum of the next call
        self._value_names: list[str] = []  # the packed row's layout, filled when traced
        self.trained = False  # a call of this process finished (Trainer.untrained_fresh_start)
        self._call = self._compile(strategy, model, optimizer, own_step, counters, global_batch_size, nan_injection)

    def _compile(self, strategy: tf.distribute.Strategy, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                 own_step: OwnStep | None, counters: tuple[tf.Variable, tf.Variable],
                 global_batch_size: int, nan_injection: NanInjection) -> Callable[..., Any]:
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
        replicas = self.replicas
        timing = self._timing

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

        def step_fn(element, flags, timing_s):
            # An indexed pipeline yields (batch, example indices): runner/input/indexed.py.
            batch, indices = element if indexed else (element, None)
            # A model's own train_step (runner/keras_recipes/own_step.py) or the runner's step.
            folded = tf.zeros([0], tf.float32)  # a model's own trackers, after its step (own_step.py fold)
            if own_step is not None:  # its gradients are not visible: its logs are tested
                values = own_step.step(batch)
                shares, nonfinite = tf.zeros([0], tf.float32), health_detector.logs_nonfinite(values)
                folded = own_step.fold_columns()
            else:
                values, shares, nonfinite = runner_step(batch)
            state_columns = [] if states is None else states.columns()
            names[:] = control_row.layout(list(values) + state_columns, timing["workers"])  # fixed at trace time
            packed = tf.concat([tf.stack([tf.cast(v, tf.float32) for v in values.values()]), shares,
                                control_row.in_replica(flags, nonfinite), control_row.in_replica_host(timing_s, **timing),
                                folded], axis=0)
            context = tf.distribute.get_replica_context()
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, packed)
            if own_step is not None and own_step.fold_width:  # the trackers' sums ride the row's tail
                with tf.control_dependencies(own_step.fold(reduced[-own_step.fold_width:])):
                    reduced = tf.identity(reduced[:-own_step.fold_width])
            if not record:
                return reduced
            # The indices every replica was fed, in replica (= rank) order: the global batch.
            # tf.identity places them on this replica's device (all_gather needs a device;
            # the iterator's output has none).
            return reduced, context.all_gather(tf.identity(indices), axis=0)

        def comparisons_fn():
            # After the call's last update (the variables' reads follow the loop's writes): the
            # memory tier's fingerprint of the may-differ variables (runner/state/worker_agreement.py)
            # and every replica's hash of its weights (runner/health/replicas.py), summed by an
            # all-reduce of their own.
            columns = tier.call_columns() if self._tier_width else tf.zeros([0], tf.float32)
            if replicas is not None:
                columns = tf.concat([columns, replicas.columns()], axis=0)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, columns)

        @tf.function(autograph=False)  # the loop below is a tf.while_loop; the recipe's code is converted (above)
        def train_call(iterator, steps, flags, timing_s, fingerprint):
            # One traced variant per attempt, one step body in it: ``fingerprint`` is a bool
            # tensor, and the comparisons (the memory tier's, the replicas') follow the loop,
            # behind a tf.cond with their own small all-reduce. (Until 2026-11-29 they rode the
            # last step's all-reduce: a second copy of the step in the graph, first in a second
            # variant traced at a restart's first checked call, issue 45.)
            startup_phases.count_trace()  # the Python body runs only when tf.function traces
            # (the tier's agreement exists once the Trainer wired its saving: by the first call)
            tier_compares = tier is not None and tier.agreement is not None and tier.agreement.in_call
            self._tier_width = tier.call_columns(width_only=True) if tier_compares else 0
            self._check_width = width = self._tier_width + (replicas.width if replicas is not None else 0)

            def one_step(i, rows, index_rows):
                result = strategy.run(step_fn, args=(next(iterator), flags, timing_s))
                if record:
                    result, gathered = result
                    index_rows = index_rows.write(i, strategy.experimental_local_results(gathered)[0])
                row = strategy.experimental_local_results(result)[0]
                rows = rows.write(i, row)
                # Step by step, each after its step's result: a call that fails part-way
                # (e.g. the dataset ran out) leaves the counters at the last finished step,
                # which is what the failure report reads (runner/failures/diagnose.py).
                with tf.control_dependencies([row]):
                    global_step.assign_add(1)
                    step_in_epoch.assign_add(1)
                return i + 1, rows, index_rows

            rows = tf.TensorArray(tf.float32, size=steps)
            index_rows = tf.TensorArray(tf.int64, size=steps)
            _, rows, index_rows = tf.while_loop(lambda i, rows, index_rows: i < steps, one_step,
                                                (tf.constant(0, steps.dtype), rows, index_rows))
            stacked = rows.stack()
            if width:  # only when the host asked: the same on every worker, so the collective pairs up
                with tf.control_dependencies([stacked]):
                    checks = tf.cond(fingerprint,
                                     lambda: strategy.experimental_local_results(strategy.run(comparisons_fn))[0],
                                     lambda: tf.zeros([width], tf.float32))
            else:
                checks = tf.zeros([0], tf.float32)
            startup_phases.mark("trace")
            return (stacked, checks, index_rows.stack()) if record else (stacked, checks)

        return train_call

    def call_length(self, *, global_step: int, max_steps: int) -> int:
        """A call also ends at the replicas' next check by step count, and before a skipped
        batch (--deterministic-anomaly skip), which is a call of its own (:meth:`run`)."""
        if self._health.skips(global_step + 1):
            return 1
        max_steps = min([max_steps, *(s - global_step - 1 for s in self._health.skipped if s > global_step + 1)])
        return max_steps if self.replicas is None else self.replicas.call_length(global_step=global_step,
                                                                                max_steps=max_steps)

    def run(self, iterator: Any, steps: int, global_step: int, stats: EpochStats | LastLogs, *,
            ends_epoch: bool = False) -> CallOutcome:
        """Train ``steps`` steps after ``global_step``, add each step's values to ``stats``;
        returns the agreed votes and sets ``self.steps``, the agreed maximum of the next call.
        ``ends_epoch``: the call's last step is its epoch's last (a checked call)."""
        tier, chief = self._tier, self._is_chief
        if self._health.skips(global_step + 1):
            return self._skip(iterator, global_step)
        self._flip(global_step)
        snapshot_every, capture_every = (
            tier.proposal(call_steps=self.steps, proposed_call_steps=self.sizer.proposal(),
                          step_s=self.sizer.step_seconds)
            if chief and tier is not None else (0.0, 0.0))
        flags = control_row.encode(control_row.Votes(
            stop=self._stop_vote(global_step + steps), save=self._save_vote(),
            next_call=self.sizer.proposal() if chief else 0.0, snapshot_every=snapshot_every,
            capture_every=capture_every))
        started, traces = time.perf_counter(), startup_phases.traces()
        # This rank's host time since the previous call's result (its loop, its input, a slow
        # host), a share per step in the timing block; 0 for an attempt's first call.
        host_s = 0.0 if self._host_from is None else (started - self._host_from) / steps
        # ... and the time its process could not run since its previous call began (a quota, a
        # neighbour, a stopped process: runner/health/stall_probe.py), a share per step too.
        stall_s = 0.0 if self._stall_probe is None else self._stall_probe.take() / steps
        # Does a snapshot follow this call? Then its last step fingerprints for the comparison
        # (memory tier; a snapshot after a call without them compares with its own all-reduce).
        ends = global_step + steps
        tier_due = tier is not None and tier.fingerprint_due(ends, save_at=self._save_at)
        check_due = self.replicas is not None and (
            ends_epoch or self.replicas.due(ends) or self._save_at(ends)
            or (tier is not None and tier.schedule.due(ends)))
        fingerprint = bool(tier_due or check_due)
        result = self._call(iterator, tf.constant(steps, tf.int32), flags, tf.constant([host_s, stall_s], tf.float32),
                            tf.constant(fingerprint))
        if self._indices is not None:
            rows_t, checks_t, index_rows = result
            for offset, indices in enumerate(index_rows.numpy(), 1):
                self._indices.write(global_step + offset, indices.tolist())
            self._indices.flush()
        else:
            rows_t, checks_t = result
        rows, checks = rows_t.numpy(), checks_t.numpy()
        self._host_from = time.perf_counter()
        startup_phases.mark("first_call")
        self.trained = True
        # A non-finite step, or replicas that differ, are acted on here (--on-anomaly), before
        # any save or snapshot of it.
        anomaly = health_detector.first_anomaly(
            rows, self._value_names, first_global_step=global_step + 1, position=lambda: self._position(steps))
        if anomaly is None and self._health.spikes is not None:  # --loss-spike (runner/health/spikes.py)
            spike = self._health.spikes.check([control_row.split(row, self._value_names)[0]["loss"] for row in rows])
            if spike is not None:
                epoch, first = self._position(steps)
                anomaly = Anomaly(global_step=global_step + 1 + spike.offset, epoch=epoch,
                                  step_in_epoch=first + spike.offset, replicas=1, kind=SPIKE,
                                  values=control_row.split(rows[spike.offset], self._value_names)[0],
                                  reference={"median": spike.median, "threshold": spike.threshold})
        if anomaly is None and check_due:
            assert self.replicas is not None
            mismatch = self.replicas.read(checks[self._tier_width:self._tier_width + self.replicas.width], ends)
            if mismatch is not None:
                epoch, first = self._position(steps)
                anomaly = Anomaly(global_step=ends, epoch=epoch, step_in_epoch=first + steps - 1,
                                  replicas=len(mismatch.replicas), values={}, kind=REPLICAS, ranks=mismatch.ranks)
        self._health.after_call(anomaly, last_global_step=ends, settle=self._settle)
        if chief:
            self.sizer.observed(steps, time.perf_counter() - started, traced=startup_phases.traces() != traces)
        self._add_rows(rows, stats)
        self._marker.write(ends)  # the hang watchdog's progress (rundir/stepmarker.py)
        if tier is not None:
            tier.saw_call(checks[:self._tier_width], 0, fingerprint=bool(tier_due))
        _, agreed = control_row.split(rows[-1], self._value_names)
        self.steps = max(1, int(round(agreed.next_call)))
        if tier is not None:
            tier.adopt(agreed.snapshot_every, agreed.capture_every)
        if startup_phases.traces() == traces:  # RT_FAULTS slow (a no-op unless armed), not after a tracing call
            self._slowdown.after_call(global_step, self._host_from - started)
        return CallOutcome(stop=agreed.stop > 0, save=agreed.save > 0,
                           host_s=control_row.host_seconds(rows, self._value_names),
                           stall_s=control_row.stall_seconds(rows, self._value_names),
                           traced=startup_phases.traces() != traces)

    def _skip(self, iterator: Any, global_step: int) -> CallOutcome:
        """A skipped batch (a deterministic anomaly, runner/health/anomaly_policy.py): consumed
        from the input and counted as a step, but not trained on (no update, no values in the
        epoch's means), on every worker alike."""
        next(iterator)
        for counter in self._counters:
            counter.assign_add(1)
        epoch, step_in_epoch = self._position(1)
        emit("batch_skipped", group=True, global_step=global_step + 1, epoch=epoch, step_in_epoch=step_in_epoch)
        self._marker.write(global_step + 1)
        return CallOutcome(stop=False, save=False)

    def verify_replicas(self, global_step: int, *, position: tuple[int, int]) -> None:
        """Before a save that follows no checked call (a time-based or a preemption save): the
        replicas' comparison with one all-reduce (every worker, at the same save), acted on as a
        call's anomaly. ``position``: (epoch, step in the epoch) of ``global_step``."""
        if self.replicas is None:
            return
        mismatch = self.replicas.compare_now(global_step)
        if mismatch is not None:
            epoch, step_in_epoch = position
            self._health.after_call(
                Anomaly(global_step=global_step, epoch=epoch, step_in_epoch=max(0, step_in_epoch - 1),
                        replicas=len(mismatch.replicas), values={}, kind=REPLICAS, ranks=mismatch.ranks),
                last_global_step=global_step, settle=self._settle)

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
