"""An epoch's running numbers, and what happens at its end.

``EpochStats`` sums every step's loss and metrics as the training call returns them
(train_call.py adds each step's row, so the epoch's means are the same for every steps per
call), and the summed states of metrics that keep counts (runner/keras_recipes/metric_states.py).
The sums travel in every checkpoint's ``extra``, so an epoch's reported loss is the same
whether or not it was interrupted.

``EpochEnd`` is what the trainer (loop.py) does between an epoch's last call and the next
epoch's first: evaluate, the callbacks' ``on_epoch_end`` and their agreed stop, advance the
counters, save the epoch-end checkpoint carrying the epoch's results, and report
``epoch_finished`` once that checkpoint is committed; and, after a restore exactly at an
epoch end whose report a kill prevented, that report (runner/outputs/epoch_results.py).
It owns the two things the epoch end decides: the epoch's results (carried by the save of
its last step: :meth:`EpochEnd.extra`) and whether a callback stopped training
(``stopped_early``: the run then completes at this epoch's end; not a preemption).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import Manifest
from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import emit
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stepmarker import PHASE_EVAL, PhaseMarker
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.keras_recipes.callbacks import CallbackRunner
from resilient_train.runner.keras_recipes.metric_states import MetricStates
from resilient_train.runner.keras_recipes.own_step import OwnStep
from resilient_train.runner.outputs.epoch_results import EpochResults, already_reported
from resilient_train.runner.outputs.evaluation import Evaluator
from resilient_train.runner.state.saving import Saving

__all__ = ["EpochEnd", "EpochStats"]


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


@dataclass(frozen=True)
class Counters:
    """The checkpointed counters the epoch end advances (runner/state/ckpt_layout.py)."""

    epoch: tf.Variable
    step_in_epoch: tf.Variable
    global_step: tf.Variable


class EpochEnd:
    """One worker's epoch ends (see the module docstring); every worker runs them in step."""

    def __init__(self, job: JobConfig, cluster: ClusterInfo, *, run_id: str, counters: Counters, saving: Saving,
                 evaluator: Evaluator | None, callbacks: CallbackRunner | None, own_step: OwnStep | None,
                 phase: PhaseMarker, faults: FaultPlan, agree: Callable[[bool], bool],
                 gather: Callable[[int], list[int]], record_input: Callable[[int], None]) -> None:
        """``agree(flag)``: True on every worker when ``flag`` is on any (one all-reduce);
        ``gather(value)``: every worker's value by rank; ``record_input(epoch)``: the chief
        hashes epoch ``epoch``'s first batch for the resume check before the epoch-end save."""
        self._job, self._cluster, self._run_id, self._counters = job, cluster, run_id, counters
        self._saving, self._evaluator, self._callbacks, self._own_step = saving, evaluator, callbacks, own_step
        self._phase, self._faults = phase, faults
        self._agree, self._gather, self._record_input = agree, gather, record_input
        self.results: EpochResults | None = None  # the epoch just ended, carried by its epoch-end checkpoint
        # A Keras callback (EarlyStopping, TerminateOnNaN...) set model.stop_training, agreed by
        # every worker: the run completes at this epoch's end (training_stopped; the manifest's
        # stopped_early, callbacks.json's stopped). Not a preemption.
        self.stopped_early = False
        self._eval_s = 0.0  # this epoch end's evaluation so far (epoch_finished's eval_s)

    def extra(self, global_step: int) -> dict[str, Any]:
        """The epoch's results for the save of ``global_step`` when it is the epoch-end checkpoint."""
        results = self.results
        return results.to_extra() if results is not None and results.global_step == global_step else {}

    def finish(self, epoch: int, means: dict[str, float]) -> None:
        """Advance the counters past epoch ``epoch`` (its means: ``means``), save, report ``epoch_finished``.

        With callbacks, the evaluation comes first and ``on_epoch_end`` (its logs carry
        ``val_*``) runs before the save, with the stop agreed by every worker, so the saved
        callback state has seen the epoch; ``on_train_end`` runs before the final save.
        Without, the evaluation follows the save (an async commit overlaps it).

        The epoch-end checkpoint carries the epoch's numbers, and ``epoch_finished`` waits
        for its commit (runner/outputs/epoch_results.py): a kill before the commit trains
        the epoch again, which reports it then; a kill after it leaves the report to the
        restore (:meth:`report_after_restore`). Exactly once either way.
        """
        started, self._eval_s = time.perf_counter(), 0.0
        if self._own_step is not None:  # the trackers' results, or the last step's logs (Keras' choice)
            means = self._own_step.epoch_logs(means)
        validation, logs = self._callbacks_epoch_end(epoch, means) if self._callbacks else (None, None)
        self._counters.epoch.assign_add(1)
        self._counters.step_in_epoch.assign(0)
        global_step = int(self._counters.global_step.numpy())
        self.results = EpochResults(epoch=epoch, global_step=global_step, loss=means.pop("loss", None),
                                    metrics=means, validation=validation)
        completed = self.stopped_early or epoch + 1 >= self._job.epochs
        if completed and self._callbacks:
            self._callbacks.train_end(logs)  # e.g. restore_best_weights: the final checkpoint holds it
        if not completed:
            self._record_input(epoch + 1)
        self._saving.save(completed=completed)
        if validation is None:
            validation = self.evaluate(epoch)
        self._saving.checkpointer.flush()  # the epoch-end checkpoint is committed (the chief's wait; others have none)
        # Where the epoch end's time went (rundir/time_account.py): the whole of it, and its evaluation.
        timing = {"seconds": round(time.perf_counter() - started, 4), "eval_s": round(self._eval_s, 4)}
        self._report(self.results, validation, stopped_early=self.stopped_early, timing=timing)
        self._faults.hit("after_epoch_finished", global_step)

    def evaluate(self, epoch: int) -> dict[str, Any]:
        """The held-out evaluation after epoch ``epoch``: the extra fields of its ``epoch_finished``.
        It reads the weights only, so an async commit overlaps it. With callbacks it runs before
        the save instead (on_epoch_end needs val_*); after a restore at an epoch end whose
        evaluation never finished, it runs then."""
        if self._evaluator is None:
            return {}
        previous, started = self._phase.enter(PHASE_EVAL), time.perf_counter()
        try:
            fields = self._evaluator.after_epoch(epoch + 1)
        finally:
            self._phase.restore(previous)
            self._eval_s += time.perf_counter() - started
        self._faults.hit("after_evaluation", int(self._counters.global_step.numpy()))
        return fields

    def report_after_restore(self, manifest: Manifest) -> None:
        """A restore exactly at an epoch end whose ``epoch_finished`` was never written (the
        previous attempt died between the commit and the report): report it now, with the
        numbers the checkpoint carries, evaluating first if the evaluation had not finished
        before the save. The chief decides from this run's events.jsonl (it alone writes
        group events there); every worker follows its answer (one all-reduce), since the
        evaluation is collective."""
        results = EpochResults.from_extra(manifest.extra) if manifest.step_in_epoch == 0 else None
        if results is None or results.global_step != manifest.global_step:
            return  # mid-epoch: the epoch before was reported before any step of this one
        missing = self._cluster.is_chief and not already_reported(
            RunDir(self._job.run_dir).events, run_id=self._run_id, epoch=results.epoch,
            global_step=results.global_step)
        if not self._gather(int(missing))[0]:  # the chief's answer, on every worker
            return
        validation = results.validation
        if validation is None:  # evaluated after the save: again now (deterministic, the same numbers)
            validation = self.evaluate(results.epoch)
        self._report(results, validation, stopped_early=bool(manifest.extra.get("stopped_early")),
                     after_restore=True)

    @staticmethod
    def _report(results: EpochResults, validation: dict[str, Any], *, stopped_early: bool,
                after_restore: bool = False, timing: dict[str, float] | None = None) -> None:
        """``epoch_finished`` (and ``training_stopped`` when a callback ended training there)."""
        emit("epoch_finished", group=True, **results.event_fields(validation),
             **({"after_restore": True} if after_restore else {}), **(timing or {}))
        if stopped_early:
            emit("training_stopped", group=True, epoch=results.epoch, global_step=results.global_step,
                 reason="model.stop_training")

    def _callbacks_epoch_end(self, epoch: int, means: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Evaluate, ``on_epoch_end``, agree on stopping; (the evaluation's event fields, the logs)."""
        assert self._callbacks is not None
        extra = self.evaluate(epoch)
        logs = dict(means)
        if "val_loss" in extra:
            logs["val_loss"] = extra["val_loss"]
            logs.update({f"val_{name}": value for name, value in extra["val_metrics"].items()})
        logs = self._callbacks.epoch_end(epoch, logs)
        self.stopped_early = self._agree(self._callbacks.stop_training) or self.stopped_early
        self._faults.hit("after_epoch_end_callbacks", int(self._counters.global_step.numpy()))
        return extra, logs
