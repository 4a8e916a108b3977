"""One worker's save and restore, as the Trainer holds them: what a save records and when it
captures the input, the memory tier's snapshots, a rescue's commit, and the restore at start.

checkpointing.py has the mechanisms (the async twin and its persist thread, the sync
writer), save_policy.py says when to save, tier.py holds the memory tier; this object puts
them together for one attempt, so the training loop says "save this step" or "snapshot
here" and nothing more. It refuses to decide when (the loop asks SavePolicy and the tier)
and never trains: every method runs between calls, every worker alike, because a request
may all-reduce (the input's iterator states) and the restore agrees on one checkpoint.

What the Trainer's epoch adds to every save (the running sums, the epoch's results, a
callback's stop) comes in through ``epoch_extra`` and ``stopped_early``, asked at each save.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import keras
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.checkpoint.shares import ShardedSaveChoice
from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import SNAPSHOT_EVERY_AUTO, SNAPSHOT_EVERY_OFF, JobConfig
from resilient_train.job.recipe import Recipe
from resilient_train.rundir.events import emit
from resilient_train.rundir.stepmarker import PHASE_FLUSH, PhaseMarker
from resilient_train.runner.process import startup_phases
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.input.determinism import InputCheck
from resilient_train.runner.input.reentry import EpochInput
from resilient_train.runner.keras_recipes.callbacks import STATE_FILE, CallbackRunner
from resilient_train.runner.state import ckpt_layout
from resilient_train.runner.state.checkpointing import (
    AsyncCheckpointer,
    BackgroundCheckpointer,
    Checkpointer,
    NoCheckpointer,
    SaveRequest,
    SyncCheckpointer,
    TwinState,
    persist_twin,
)
from resilient_train.runner.state import sharded_save
from resilient_train.runner.state.read_once import ReadOnce
from resilient_train.runner.state.memory_tier import RescueUnavailable
from resilient_train.runner.state.model_state import weights_digest
from resilient_train.runner.state.tier import MemoryTier

__all__ = ["Restored", "Saving"]

# The world_size_changed event's note, by input contract (runner/input/indexed.py for the first).
_RESIZE_NOTE_DATASET = ("resuming is sound but the input sharding differs, so weights will not be bit-identical "
                        "to an uninterrupted run")
_RESIZE_NOTE_INDEXED = ("every global step trains on the same examples as an uninterrupted run (indexed input); "
                        "the weights differ from it only by floating-point reduction order")


@dataclass(frozen=True)
class Restored:
    """The checkpoint every worker restored: its manifest, and its callbacks.json (None: none)."""

    manifest: Manifest
    callback_state: bytes | None


@dataclass(frozen=True)
class SaveHooks:
    """What the Trainer's epoch adds to, and hears of, every save (Saving's arguments of the same names)."""

    epoch_extra: Callable[[int], dict[str, Any]]
    stopped_early: Callable[[], bool]
    saved: Callable[[], None]
    before_commit: Callable[[int], None]


class Saving:
    """Save and restore of one worker for one attempt (see the module docstring).

    ``counters``: the checkpoint's ``(epoch, step_in_epoch, global_step)`` variables.
    ``build_twin()``: a second, strategy-free copy of everything ``checkpoint`` holds (the
    async twin). ``gather(value)``: every worker's int, by rank (one all-reduce).
    ``concat_over_workers(tensor)``: every worker's tensor, concatenated by rank (one
    all-gather: a read-once restore's exchange, runner/state/read_once.py).
    ``epoch_extra(global_step)``: what the epoch adds to a save's manifest ``extra``.
    ``saved()``: the group took an agreed save (the save policy's clock restarts, the preemption
    notice watch drops a vote that arrives right after it: runner/process/preemption_notices.py).
    ``finite_only`` (--on-anomaly stop/rollback): a state holding a non-finite value is never
    committed (persist_twin's check: the second guard behind runner/health/).
    ``before_commit(global_step)``: every worker, before a save's request: the replicas'
    comparison when no checked call ended at that step (runner/health/replicas.py).
    """

    def __init__(
        self,
        job: JobConfig,
        cluster: ClusterInfo,
        *,
        store: CheckpointStore,
        run_id: str,
        work_dir: Path,
        faults: FaultPlan,
        checkpoint: tf.train.Checkpoint,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        counters: tuple[tf.Variable, tf.Variable, tf.Variable],
        tier: MemoryTier | None,
        tier_off: str | None,
        phase: PhaseMarker,
        build_twin: Callable[[], tuple[tf.train.Checkpoint, keras.Model]],
        sum_over_workers: Callable[[tf.Tensor], tf.Tensor],
        gather: Callable[[int], list[int]],
        concat_over_workers: Callable[[tf.Tensor], tf.Tensor],
        recipe: Recipe,
        input_check: InputCheck,
        fingerprint: dict[str, Any],
        epoch_extra: Callable[[int], dict[str, Any]],
        stopped_early: Callable[[], bool],
        saved: Callable[[], None],
        finite_only: bool = False,
        before_commit: Callable[[int], None] = lambda global_step: None,
    ) -> None:
        self._job, self._cluster, self._store, self._work_dir = job, cluster, store, work_dir
        self._checkpoint, self._counters, self._tier, self._phase = checkpoint, counters, tier, phase
        self._gather, self._input_check = gather, input_check
        self._recipe, self._fingerprint = recipe, fingerprint
        self._hooks = SaveHooks(epoch_extra=epoch_extra, stopped_early=stopped_early, saved=saved,
                                before_commit=before_commit)
        # Wired after the checkpointer exists (the Trainer builds them after it, in that order).
        self._callbacks: CallbackRunner | None = None
        self._input: EpochInput | None = None
        self._async: AsyncCheckpointer | None = None
        self._last_saved: int | None = None
        self._recipe_source: str | None = None  # the recipe's resolved path, for every save's manifest
        # The background half of an async save (persist thread), or a rescue's commit: _persist.
        self._persist_twin = functools.partial(
            persist_twin, store=store, staging_root=work_dir / "staging", digest=weights_digest, run_id=run_id,
            world_size=cluster.num_workers, faults=faults, keep=job.keep, finite_only=finite_only)
        self._finite_only = finite_only
        # A sharded checkpoint is read once by the group (runner/state/read_once.py); its exchange
        # is an all-gather over replicas, which gives one row per worker only with one replica each.
        replicas = strategy.num_replicas_in_sync
        self._read_once = ReadOnce(
            store=store, rank=cluster.rank, workers=cluster.num_workers, gather=gather,
            concat_over_workers=concat_over_workers,
            unable="--read-once off" if job.read_once == "off" else None if replicas == cluster.num_workers else
            f"{replicas} replicas on {cluster.num_workers} workers: the exchange takes one row per worker")
        self.checkpointer = self._make_checkpointer(model, strategy, tier_off, build_twin, sum_over_workers,
                                                    run_id=run_id, faults=faults)

    def wire(self, *, callbacks: CallbackRunner | None, epoch_input: EpochInput) -> None:
        """The recipe's callbacks (their state is saved) and the epoch input (its iterator state)."""
        self._callbacks, self._input = callbacks, epoch_input

    @property
    def _epoch_input(self) -> EpochInput:
        assert self._input is not None  # wired at setup, before any save or restore
        return self._input

    def _make_checkpointer(self, model: keras.Model, strategy: tf.distribute.Strategy, tier_off: str | None,
                           build_twin: Callable[[], tuple[tf.train.Checkpoint, keras.Model]],
                           sum_over_workers: Callable[[tf.Tensor], tf.Tensor], *, run_id: str,
                           faults: FaultPlan) -> Checkpointer:
        """HOW this worker saves, decided once. async: the chief (and every worker only if
        the model has sync-on-read variables, whose read is a collective) keeps a twin of
        the saved state (runner/state/checkpointing.py); other workers write nothing."""
        job, cluster = self._job, self._cluster
        if self._tier is None and job.snapshot_every == SNAPSHOT_EVERY_AUTO:  # auto resolved to off
            emit("memory_tier", setting=SNAPSHOT_EVERY_AUTO, every_steps=SNAPSHOT_EVERY_OFF, reason=tier_off,
                 rank=cluster.rank)
        if job.checkpoint_mode == "sync":
            self._announce_sharding(sharded_save.choose(job.sharded_save, None, num_workers=cluster.num_workers))
            return SyncCheckpointer(
                self._checkpoint,
                weights_sha256=lambda: weights_digest(model),
                store=self._store,
                staging_root=self._work_dir / "staging",
                is_chief=cluster.is_chief,
                rank=cluster.rank,
                run_id=run_id,
                world_size=cluster.num_workers,
                faults=faults,
                keep=job.keep,
            )
        twin = TwinState.build(self._checkpoint, model, build_twin)
        sharding = sharded_save.choose(job.sharded_save, twin, num_workers=cluster.num_workers)
        self._announce_sharding(sharding)
        if not (cluster.is_chief or twin.sync_on_read or self._tier is not None or sharding.sharded):
            return NoCheckpointer()
        persist: Callable[[SaveRequest], Manifest | None] = self._persist
        on_rescue: Callable[[], None] = lambda: None
        if sharding.sharded:  # every worker uploads its share (runner/state/sharded_save.py); a rescue: _persist
            share_context = sharded_save.ShareContext(
                store=self._store, staging_root=self._work_dir / "staging", rank=cluster.rank,
                digest=weights_digest, run_id=run_id, world_size=cluster.num_workers, faults=faults,
                keep=job.keep, wait_timeout_s=job.startup_timeout, finite_only=self._finite_only)
            persist = functools.partial(sharded_save.persist_share, sharded_save.ShardedWriter(twin, sharding.shards),
                                        twin, context=share_context)
            on_rescue = share_context.rescue_asked.set
        self._async = AsyncCheckpointer(twin, persist, on_rescue=on_rescue)
        if self._tier is not None:
            self._tier.start(self._async, model=model, strategy=strategy,
                             sum_over_workers=sum_over_workers, counters=self._counters,
                             commit=self._commit_rescue, last_committed=self._last_committed_step,
                             unable=self._why_no_rescue_here)
        return BackgroundCheckpointer(self._async, persist=cluster.is_chief or sharding.sharded)

    def _announce_sharding(self, choice: ShardedSaveChoice) -> None:
        emit("sharded_save", group=True, setting=choice.setting, sharded=choice.sharded, shards=choice.shards,
             state_bytes=choice.state_bytes, reason=choice.reason)

    # --------------------------------------------------------------- restore
    def restore_or_start(self) -> Restored | None:
        """Restore the newest checkpoint every worker agrees on (the chief's choice); None:
        a fresh start (no checkpoint)."""
        store, cluster = self._store, self._cluster
        if cluster.is_chief:
            store.collect_garbage()
        cache_dir = self._work_dir / "cache"
        downloaded = store.bytes_downloaded
        read_once = self._read_once.restore(cache_dir)
        found = read_once.found
        if found is None:  # the plain restore: every worker fetches the whole newest checkpoint that verifies
            found = store.restore_latest(cache_dir)
        startup_phases.mark("fetch")
        mine = found[0].global_step if found else -1
        agreed = mine if read_once.found is not None else self._gather(mine)[0]  # read once: agreed already
        startup_phases.mark("agree")
        if agreed < 0:
            emit("fresh_start", group=True, epoch=0, step_in_epoch=0, global_step=0)
            return None
        if found is None or mine != agreed:
            found = store.fetch(agreed, cache_dir)
        emit("restore_read", global_step=agreed, read_once=read_once.found is not None, reason=read_once.reason,
             store_bytes=store.bytes_downloaded - downloaded, peer_bytes=read_once.peer_bytes,
             exchange_s=read_once.exchange_s)
        manifest, local_dir = found
        ckpt_layout.restore(self._checkpoint, local_dir / "ckpt", recipe_name=self._recipe.name,
                            where=f"Checkpoint {store.url}/{CheckpointStore.dir_name(agreed)}")
        state_file = local_dir / STATE_FILE
        callback_state = state_file.read_bytes() if state_file.is_file() else None
        self._input_check.expect(manifest.extra, checkpoint=CheckpointStore.dir_name(agreed),
                                 same_world_size=manifest.world_size == cluster.num_workers)
        self._last_saved = manifest.global_step
        if self._tier is not None:
            self._tier.schedule.taken(manifest.global_step)  # the interval counts from the restored step
        reentry, reentry_reason = self._epoch_input.plan_reentry(manifest, local_dir)
        if manifest.world_size != cluster.num_workers:
            indexed = self._recipe.indexed
            emit(
                "world_size_changed",
                group=True,
                checkpoint_world_size=manifest.world_size,
                world_size=cluster.num_workers,
                input="indexed" if indexed else "dataset",
                note=_RESIZE_NOTE_INDEXED if indexed else _RESIZE_NOTE_DATASET,
            )
        emit(
            "restored",
            group=True,
            epoch=manifest.epoch,
            step_in_epoch=manifest.step_in_epoch,
            global_step=manifest.global_step,
            checkpoint=f"{store.url}/{CheckpointStore.dir_name(manifest.global_step)}",
            input_reentry=reentry,
            input_reentry_reason=reentry_reason,
        )
        return Restored(manifest=manifest, callback_state=callback_state)

    # ------------------------------------------------------------------ save
    def save(self, *, completed: bool = False, flush: bool = False, after_call: bool = False) -> Manifest | None:
        """Checkpoint the current step (once per step), the configured way.

        ``completed`` or ``flush``: return only once the checkpoint is committed (the final
        save and a preemption save: exit 0 / 143 promise a committed step). ``after_call``:
        a mid-epoch save right after a call, whose packed all-reduce may have carried the
        workers' comparison (then the save makes no all-reduce of its own for it).
        """
        self._hooks.saved()
        flush = flush or completed
        global_step = int(self._counters[2].numpy())
        # The request first, still in the training phase: it may all-reduce (the iterator
        # states), and a peer that hangs must meet the hang timeout there, not the start-up
        # allowance of a save (found by benchmarks/hang_detection.py: the chief sat in that
        # gather for 600 s while its peer hung).
        capture = flush or self._save_captures(global_step)
        if global_step != self._last_saved:
            self._hooks.before_commit(global_step)  # the replicas compared, unless at this step already (collective)
        request = None if global_step == self._last_saved else self._request(completed, capture=capture)[0]
        # Any save may block: a flush, a sync write, an async snapshot waiting for the
        # previous upload. The hang watchdog gives the phase its start-up allowance.
        previous = self._phase.enter(PHASE_FLUSH)
        try:
            if request is None:  # e.g. preempted right after a restore or an epoch-end save
                return self.checkpointer.flush() if flush else None
            self._last_saved = global_step
            manifest = self.checkpointer.save(request, flush=flush)
            if self._tier is not None:
                self._tier.schedule.taken(global_step)  # a save is a snapshot too
                if capture:
                    self._tier.schedule.captured(global_step)
                self._tier.compare(global_step, after_call=after_call)
            return manifest
        finally:
            self._phase.restore(previous)

    def _save_captures(self, global_step: int) -> bool:
        """Does the mid-epoch save of ``global_step`` capture the input's iterator state?

        The capture is the dear part of a save on the iterator_state path (digits_cnn: its
        ~570 KB shuffle buffer serialized and all-reduced, 50-70 ms against ~5 ms for the rest
        of a save, so a save every 20 steps cost ~30% of throughput). A restart needs the
        state once, so saves capture on the memory tier's capture interval, which keeps the
        captures' share of training time within its budget (memory_tier.py); the saves
        between carry the newest capture, and a restore replays the batches since it (the
        input pipeline only: at most the interval). A new iterator (an epoch, a restore) is
        captured at its first save; without the tier (off, sync, one worker) every save
        captures, as before. Every worker decides alike (the interval is agreed, the
        iterator's history is the same everywhere): the capture is collective."""
        if self._tier is None:
            return True
        return self._tier.save_captures(global_step, input_captured=self._epoch_input.captured)

    def snapshot(self) -> None:
        """The memory tier: snapshot the current step into this worker's twin, persist
        nothing (every worker at the same agreed step: the request may all-reduce)."""
        tier = self._tier
        assert self._async is not None and tier is not None
        global_step = int(self._counters[2].numpy())
        capture = tier.snapshot_captures(global_step, input_captured=self._epoch_input.captured)
        started = time.perf_counter()
        request, input_state_s = self._request(completed=False, capture=capture)  # (it may all-reduce)
        capture_s = input_state_s if capture else 0.0  # the capture alone (the rest is paid every snapshot)
        if capture:
            tier.schedule.captured(global_step)
        previous = self._phase.enter(PHASE_FLUSH)  # it may wait for the chief's in-flight persist
        try:
            if tier.keeps_snapshot():
                self._async.save(request, persist=False)
        finally:
            self._phase.restore(previous)
        tier.compare(global_step, after_call=True)
        tier.snapshot_timed(time.perf_counter() - started, capture_s=capture_s)
        tier.schedule.taken(global_step)

    def _request(self, completed: bool, *, capture: bool = True) -> tuple[SaveRequest, float]:
        """The save's request, and the seconds the input's iterator state took in it (auto times captures)."""
        # Only the chief's copy is ever committed; the others skip encoding (best_weights can be
        # large), unless the memory tier is on: then any survivor may commit its own snapshot.
        encodes = self._cluster.is_chief or self._tier is not None
        stopped_early = self._hooks.stopped_early()
        files = ({STATE_FILE: self._callbacks.state(stopped=stopped_early)}
                 if self._callbacks and encodes else {})
        # Each counter read once (a distributed variable's read is ~0.1 ms: snapshots pay it every N steps).
        epoch, step_in_epoch, global_step = (int(v.numpy()) for v in self._counters)
        started = time.perf_counter()
        iterator_files, iterator_extra = self._epoch_input.state_to_save(epoch, step_in_epoch,
                                                                         files_everywhere=encodes, capture=capture)
        input_state_s = time.perf_counter() - started
        files.update(iterator_files)
        if self._recipe_source is None:
            self._recipe_source = str(Path(self._recipe.source).resolve())
        return SaveRequest(
            files=files,
            global_step=global_step,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            extra={
                **self._hooks.epoch_extra(global_step),
                "completed": completed,
                **({"stopped_early": True} if stopped_early else {}),
                "epochs": self._job.epochs,
                "steps_per_epoch": self._job.steps_per_epoch,
                "recipe": self._recipe.name,
                "recipe_source": self._recipe_source,  # verify --deep's default recipe
                "fingerprint": self._fingerprint,
                **self._input_check.to_extra(epoch),
                **iterator_extra,
            },
        ), input_state_s

    def drain_pending_checkpoint(self, timeout_s: float) -> None:
        """Before exiting on an error: let an in-flight background save commit (bounded)."""
        self.checkpointer.drain(timeout_s)

    # ---------------------------------------------------------------- rescue
    def _last_committed_step(self) -> int | None:
        manifest = self._store.latest_manifest()
        return None if manifest is None else manifest.global_step

    def _why_no_rescue_here(self) -> str | None:
        """A non-chief does not run the chief-only callbacks (ModelCheckpoint, CSVLogger,
        TensorBoard write files on the chief): their state changes only at epoch ends, which
        always commit, so its rescue takes their entries from the newest commit
        (_commit_rescue). Only a ModelCheckpoint saving at batch ends (an integer save_freq)
        has state that lives on the chief alone between commits: then the rescue is the chief's or none."""
        chief = self._cluster.is_chief
        if self._tier is not None and self._tier.workers_differ is not None and not chief:
            return self._tier.workers_differ
        per_batch = [] if self._callbacks is None or chief else self._callbacks.chief_only_per_batch
        if per_batch:
            return f"the state of chief-only callbacks saving at batch ends ({', '.join(per_batch)}) lives on the chief"
        return None

    def _commit_rescue(self, request: SaveRequest) -> Manifest:
        """A rescue's commit (on the rescue listener's thread): the twin, the ordinary way.
        Its events are this rank's own (a non-chief's group events would be dropped)."""
        assert self._tier is not None  # only the tier's Rescuer commits a rescue
        self._tier.check_rescue(request)
        if self._callbacks is not None and self._callbacks.chief_only and STATE_FILE in request.files:
            request = dataclasses.replace(request, files={
                **request.files, STATE_FILE: self._chief_callback_state(request)})
        return self._persist(request, emit=lambda event, group=False, **fields: emit(event, **fields))

    def _chief_callback_state(self, request: SaveRequest) -> bytes:
        """The snapshot's callbacks.json with the chief-only callbacks' entries of the newest
        commit, which must be of the snapshot's epoch (their state as of its start)."""
        assert self._callbacks is not None  # only called when some callback is chief-only
        epoch_start = request.global_step - request.step_in_epoch
        manifest = self._store.latest_manifest()
        if manifest is None or manifest.global_step < epoch_start:
            newest = "none" if manifest is None else f"step {manifest.global_step}"
            raise RescueUnavailable(
                f"the chief-only callbacks' state at step {epoch_start} (the start of the snapshot's epoch) "
                f"was never committed (newest commit: {newest})")
        return self._callbacks.with_chief_state(request.files[STATE_FILE],
                                                self._store.read_committed_file(manifest, STATE_FILE))

    def _persist(self, request: SaveRequest, *, emit: Callable[..., None] = emit) -> Manifest:
        """The background half of an async save (runs on the persist thread), or a rescue's commit."""
        assert self._async is not None  # only called by the AsyncCheckpointer and the Rescuer
        return self._persist_twin(self._async.twin, request, emit=emit)
