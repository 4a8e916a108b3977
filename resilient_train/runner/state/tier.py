"""One worker's memory tier, as the Trainer holds it: its schedule, auto's interval, the
workers' agreement on their snapshots, and what a rescue may commit.

runner/state/memory_tier.py has the parts (SnapshotSchedule, AutoInterval, Rescuer);
runner/state/worker_agreement.py the comparison. This object keeps their state for one
attempt, so the training loop asks it questions (is a snapshot due, does this save capture
the input, may this rank rescue) instead of holding ten attributes of its own. It runs no
training step and owns no thread: the Trainer calls it between calls, every worker alike.

The Trainer holds one only while the tier is on (``MemoryTier.off_reason`` says why not);
``start`` runs once the twin exists (the async checkpointer's), before the first call.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import Manifest
from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import SNAPSHOT_EVERY_AUTO, JobConfig
from resilient_train.rundir import rescue_signal
from resilient_train.rundir.events import emit
from resilient_train.runner.state.checkpointing import AsyncCheckpointer, SaveRequest
from resilient_train.runner.state.memory_tier import (AUTO_PROBES, AutoInterval, Rescuer, RescueUnavailable,
                                                      SnapshotSchedule)
from resilient_train.runner.state.worker_agreement import WorkerAgreement, divergence_reason

__all__ = ["MemoryTier"]

_SINGLE_WORKER = "a single worker: no survivor to rescue from"


class MemoryTier:
    """The memory tier of one worker for one attempt (see the module docstring)."""

    @staticmethod
    def off_reason(job: JobConfig, cluster: ClusterInfo) -> str | None:
        """Why the tier is off for this attempt (None: on). auto also turns off for an
        attempt of one worker (an explicit N does not)."""
        reason = job.memory_tier_off_reason
        if reason is None and job.snapshot_every_steps is None and cluster.num_workers == 1:
            reason = _SINGLE_WORKER
        return reason

    def __init__(self, job: JobConfig, cluster: ClusterInfo) -> None:
        self._job = job
        self._cluster = cluster
        self.schedule = SnapshotSchedule(job.snapshot_every_steps, capture_every=job.snapshot_capture_every)
        # auto: the chief times the first snapshots and proposes the interval (None: not auto, or not the chief)
        self._auto = AutoInterval() if self.schedule.pending and cluster.is_chief else None
        self._twin_bytes = 0
        # The comparison of every worker's snapshot (runner/state/worker_agreement.py): the
        # last step whose snapshot was found equal on every worker, and once they differ, why
        # a non-chief's snapshot is never committed (for the rest of the attempt).
        self.agreement: WorkerAgreement | None = None
        self._call_agreement: np.ndarray | None = None  # the last call's summed comparison columns (None: not computed)
        self._pending_captures = 0  # captures while auto has not decided (every worker alike)
        self._agreed_step: int | None = None
        self.workers_differ: str | None = None

    # -------------------------------------------------------------- start
    def start(self, saver: AsyncCheckpointer, *, model: keras.Model, strategy: tf.distribute.Strategy,
              sum_over_workers: Callable[[tf.Tensor], tf.Tensor], counters: tuple[Any, Any, Any],
              commit: Callable[[SaveRequest], Manifest], last_committed: Callable[[], int | None],
              unable: Callable[[], str | None]) -> None:
        """Every worker keeps a twin; the rescue request (rundir/rescue_signal.py) commits it
        (``commit``, unless ``unable()`` says why this rank cannot)."""
        rank = self._cluster.rank
        rescuer = Rescuer(saver, rank=rank, commit=commit, last_committed=last_committed,
                          deadline_s=rescue_signal.rescue_hold_s(self._job.storage_timeout), unable=unable)
        rescue_signal.listener().set_target(rescuer.rescue)
        self._twin_bytes = saver.twin.state_bytes
        keras_paths = {id(getattr(w, "value", w)): w.path for w in model.weights}  # named as Keras names them
        self.agreement = WorkerAgreement(saver.twin.pairs, workers=self._cluster.num_workers,
                                         sum_over_workers=sum_over_workers,
                                         label=lambda path, live: keras_paths.get(id(live), path),
                                         counters=counters, replicas=strategy.num_replicas_in_sync)
        if not self.schedule.pending:  # auto announces its interval once decided (adopt)
            emit("memory_tier", setting=self.schedule.every_steps, every_steps=self.schedule.every_steps,
                 twin_bytes=self._twin_bytes, rank=rank)

    # ------------------------------------------------------- the interval
    def proposal(self, *, call_steps: int, proposed_call_steps: int, step_s: float | None) -> tuple[float, float]:
        """The chief's votes in the call's snapshot and capture interval columns (0: nothing
        to propose). ``call_steps``: the agreed size of the coming call; ``proposed_call_steps``:
        the size the chief proposes next (runner/training/call_size.py)."""
        if self._auto is None:
            return 0.0, 0.0
        if not self.schedule.pending:  # decided: a revision when the step time moved (memory_tier.py)
            every = self._auto.revision(step_s=step_s, call_steps=proposed_call_steps)
            return (float(every), float(self._auto.capture_every)) if every else (0.0, 0.0)
        if call_steps * 5 < proposed_call_steps * 4:
            # The calls are still growing (every attempt starts at one step per call): their
            # per-step time still holds each call's fixed cost, which made the first steps look
            # 2-4x slower than the run's (step_ms 13-25 against ~5 later on digits_cnn) and
            # auto's interval that much too short. Decided once the calls are near their size.
            return 0.0, 0.0
        every = self._auto.proposal(step_s=step_s, call_steps=proposed_call_steps)
        return float(every), float(self._auto.capture_every)

    def adopt(self, proposed: float, capture_proposed: float) -> None:
        """auto: the intervals the chief proposed, read by every worker from the same call."""
        every, capture_every = int(round(proposed)), int(round(capture_proposed))
        if every < 1:
            return
        schedule = self.schedule
        previous = None if schedule.pending else (schedule.every_steps, schedule.capture_every)
        schedule.decide(every, capture_every)
        measured = dict(self._auto.chosen or {}) if self._auto is not None else {}
        measured.pop("every_steps", None)
        measured.pop("capture_every_steps", None)
        if previous is not None:  # a revision (the chief's step time moved): said once, by the chief
            if previous != (schedule.every_steps, schedule.capture_every):
                emit("snapshot_interval_revised", group=True, every_steps=every,
                     capture_every_steps=schedule.capture_every, previous_every_steps=previous[0],
                     previous_capture_every_steps=previous[1], **measured)
            return
        emit("memory_tier", setting=SNAPSHOT_EVERY_AUTO, every_steps=every,
             capture_every_steps=schedule.capture_every, twin_bytes=self._twin_bytes,
             rank=self._cluster.rank, **measured)

    # -------------------------------------------------- captures, snapshots
    def save_captures(self, global_step: int, *, input_captured: bool) -> bool:
        """Does the mid-epoch save of ``global_step`` capture the input's iterator state?
        (Trainer._save_captures says why; a new iterator is captured at its first save.)"""
        if not input_captured:
            return True
        if self.schedule.pending:  # (auto's probes capture at their snapshots; a save carries the newest)
            return False
        return self.schedule.capture_due(global_step)

    def snapshot_captures(self, global_step: int, *, input_captured: bool) -> bool:
        """Does the snapshot of ``global_step`` capture the input (the dear part: an iterator
        state)? Only every capture_every steps; between, the snapshot carries the newest."""
        if self.schedule.pending:  # auto times AUTO_PROBES captures; later snapshots until it decides carry the newest
            capture = self._pending_captures < AUTO_PROBES or not input_captured
            self._pending_captures += capture
            return capture
        return self.schedule.capture_due(global_step) or not input_captured

    def snapshot_timed(self, seconds: float, *, capture_s: float) -> None:
        """A snapshot took ``seconds`` (its capture ``capture_s``): auto keeps timing, it may revise."""
        if self._auto is not None:
            self._auto.snapshot_took(seconds, capture_s=capture_s)

    def keeps_snapshot(self) -> bool:
        """Is this rank's snapshot worth taking? A non-chief's is never committed once the workers differ."""
        return self.workers_differ is None or self._cluster.is_chief

    # ------------------------------------------------------ the comparison
    def fingerprint_due(self, call_ends: int, *, save_at: Callable[[int], bool]) -> bool:
        """Does the coming call's last step carry the comparison's columns? When a snapshot
        (or a save: it snapshots too) follows the call; not before the attempt's first
        comparison (every variable, with its own all-reduce anyway), nor once the workers differ."""
        agreement = self.agreement
        return bool((self.schedule.due(call_ends) or save_at(call_ends))
                    and agreement is not None and agreement.in_call and agreement.compared > 0
                    and self.workers_differ is None)

    def call_columns(self, width_only: bool = False) -> Any:
        """The comparison's columns for the step function (graph code), or their width."""
        assert self.agreement is not None
        return self.agreement.call_width if width_only else self.agreement.call_columns()

    def saw_call(self, last_row: np.ndarray, named: int, *, fingerprint: bool) -> None:
        """The state at the call's end, when the call computed it (the columns after the ``named`` ones)."""
        self._call_agreement = last_row[named:].astype(np.float64) if fingerprint else None

    def compare(self, global_step: int, *, after_call: bool = False) -> None:
        """After a snapshot every worker took at this step: are they all equal? (one all-reduce,
        runner/state/worker_agreement.py; ``after_call``: a snapshot right after a call, whose
        packed all-reduce already carried the comparison, except the attempt's first). Once
        they differ, a non-chief's snapshot is never committed for the rest of the attempt,
        and no more comparisons are made."""
        if self.agreement is None or self.workers_differ is not None:
            return
        if after_call and self.agreement.compared > 0 and self.agreement.in_call and self._call_agreement is not None:
            differ = self.agreement.compare_in_call(self._call_agreement)
        else:
            differ = self.agreement.compare()
        if not differ:
            self._agreed_step = global_step
            return
        self.workers_differ = divergence_reason(differ)
        emit("workers_differ", group=True, global_step=global_step, variables=differ, reason=self.workers_differ)

    def check_rescue(self, request: SaveRequest) -> None:
        """RescueUnavailable unless this rank may commit its snapshot ``request`` (a
        non-chief's only when it was found equal to the chief's)."""
        if not self._cluster.is_chief and request.global_step != self._agreed_step:
            raise RescueUnavailable(self.workers_differ or f"the snapshot of step {request.global_step} was not "
                                    "found equal to the chief's (the comparison did not finish)")
