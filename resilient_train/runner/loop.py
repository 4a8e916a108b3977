"""The worker's custom training loop under MultiWorkerMirroredStrategy.

# Implementation:
# Every worker runs this same code; TF_CONFIG (already in the environment) tells the
# strategy who is who, and rank 0 is the chief.
#
# 1. Create the strategy first (TF requires collectives to be configured before any op),
#    seed everything and turn on op determinism.
# 2. Build model and optimizer inside the strategy scope; build the optimizer's slots now
#    so a restore has every variable to fill.
# 3. The chief removes uncommitted leftovers, then every worker picks the newest
#    restorable checkpoint; the workers agree on the chief's choice with one all-reduce
#    (so a worker that saw a different listing never trains from another step).
# 4. Train epoch by epoch. The input of epoch e is rebuilt from (seed, e, shard) and
#    positioned at step_in_epoch (runner/input/data.py: the recipe's start_step, else skip()),
#    so re-entering mid-epoch sees exactly the batches an uninterrupted run would have.
#    EpochInput (runner/input/reentry.py) owns it: the iterator for epoch e at step s, the
#    re-entry path of a restore, the iterator state a save records, the epoch end's retirement.
# 5. Each tf.function call runs up to --steps-per-execution steps (_make_train_call; auto:
#    the chief sizes calls to ~0.1 s, runner/call_size.py): per step ONE packed all-reduce
#    besides the gradients' carries loss, metrics, the stop flag, the chief's time-based
#    save vote and its size of the next call; the counters advance in-graph; the host
#    reads one [steps, values] tensor per call. Everything else happens between calls:
#    SavePolicy (runner/state/save_policy.py) ends a call at every step-count save point and at
#    the epoch end, so the committed steps are the same for every N; stop agreement,
#    progress (_Progress), step markers and fault hooks see call ends only.
# 6. Saving: the Checkpointer chosen once at setup (runner/state/checkpointing.py) says how.
#    async (default): the chief snapshots into its twin and a background thread persists;
#    other workers write nothing. sync: all workers write the tf.train.Checkpoint
#    (variables may need collectives); only the chief's copy is committed (MANIFEST.json
#    last). Every epoch end is saved, carrying the epoch's results; then _after_epoch_saved
#    (the epoch-end hook) runs and, once that checkpoint is committed, epoch_finished is
#    emitted; a restore at an epoch end reports an epoch whose report a kill prevented
#    (runner/outputs/epoch_results.py).
#    The memory tier (--snapshot-every N, runner/state/memory_tier.py): every worker keeps
#    a twin, calls also end N steps after the last snapshot or save, and there every
#    worker snapshots (_snapshot: the same request a save builds, nothing persisted); a
#    survivor's Rescuer commits that snapshot when the supervisor reports a peer's death
#    or a hang. auto (the default): a snapshot after every call until the chief, having
#    timed a few, proposes the interval in the packed all-reduce (runner/control_row.py) and
#    every worker adopts it at the same call (memory_tier.AutoInterval).
# 7. Preemption: each worker's stop request (SIGTERM/SIGINT; _preemption_requested) is
#    summed in the packed all-reduce, so every worker stops after the same call
#    (_preemption_agreed), saves it (flushed) and returns None (the worker exits 143).
#    Not to be confused with a Keras callback's model.stop_training (_stopped_early): the
#    run then completes at the epoch's end.
#
# Keras: a compiled model supplies optimizer, loss and metrics (runner/keras_recipes/compiled.py); the
# recipe's callbacks run at the points model.fit would call them (runner/keras_recipes/callbacks.py) and
# their state is committed with every checkpoint as callbacks.json. With callbacks, an
# epoch end evaluates first, then runs on_epoch_end (its logs carry val_*), agrees on
# model.stop_training with one all-reduce, then saves (so the saved callback state has
# seen the epoch); on_train_end runs before the final save.
#
# The checkpoint (its object graph: runner/state/ckpt_layout.py) holds model, optimizer
# (iteration counter and slots), epoch, step_in_epoch, global_step and every RNG state the
# model owns (Keras SeedGenerator states, e.g. a seeded Dropout). The running epoch
# loss/metric sums travel in the manifest's ``extra`` so an epoch's reported loss is the
# same whether or not it was interrupted.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import SNAPSHOT_EVERY_AUTO, SNAPSHOT_EVERY_OFF, JobConfig
from resilient_train.errors import RecipeError
from resilient_train.rundir.events import add_listener, emit
from resilient_train.job.fingerprint import fingerprint_for_worker
from resilient_train.job.recipe import Recipe
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
from resilient_train.runner.input.batches import average_loss, per_example_loss, unpack_batch, with_autograph
from resilient_train.runner import control_row
from resilient_train.runner.call_size import CallSizer
from resilient_train.runner.keras_recipes.callbacks import STATE_FILE, CallbackRunner
from resilient_train.runner.keras_recipes.compiled import from_compiled, is_compiled
from resilient_train.runner.keras_recipes.metric_states import MetricStates, is_state_column
from resilient_train.runner.keras_recipes.own_step import LastLogs, OwnStep, from_own_step, has_own_step
from resilient_train.runner.input.data import epoch_dataset, record_first_batch
from resilient_train.runner.outputs.epoch_results import EpochResults, already_reported
from resilient_train.runner.outputs.evaluation import Evaluator
from resilient_train.runner.input.determinism import InputCheck
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.health import detector as health_detector  # issue 48 hook
from resilient_train.runner.health.injection import NanInjection  # issue 48 hook
from resilient_train.runner.health.anomaly_policy import HealthGuard, arm_replay  # issue 48 hook
from resilient_train.runner.input.reentry import EpochInput
from resilient_train.runner.state.memory_tier import RescueUnavailable
from resilient_train.runner.state.tier import MemoryTier
from resilient_train.runner.state.save_policy import SavePolicy
from resilient_train.runner import startup_phases
from resilient_train.runner.strategy import make_strategy
from resilient_train.rundir.stepmarker import (
    PHASE_EVAL,
    PHASE_FINISH,
    PHASE_FLUSH,
    PHASE_INPUT,
    PHASE_TRAIN,
    PhaseMarker,
    StepMarker,
)
from resilient_train.rundir.layout import AttemptDir, RunDir
from resilient_train.runner.outputs.tensorboard import TensorBoardLog
from resilient_train.rundir.stepindices import StepIndexLog
from resilient_train.runner.state import ckpt_layout
from resilient_train.runner.state.model_state import weights_digest

__all__ = ["Trainer", "TrainResult"]

# The world_size_changed event's note, by input contract (runner/input/indexed.py for the first).
_RESIZE_NOTE_DATASET = ("resuming is sound but the input sharding differs, so weights will not be bit-identical "
                        "to an uninterrupted run")
_RESIZE_NOTE_INDEXED = ("every global step trains on the same examples as an uninterrupted run (indexed input); "
                        "the weights differ from it only by floating-point reduction order")



@dataclass(frozen=True)
class TrainResult:
    global_step: int
    epoch: int
    weights_sha256: str


class _EpochStats:
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


class Trainer:
    """One worker's training run: build, restore, train, checkpoint."""

    def __init__(
        self,
        job: JobConfig,
        recipe: Recipe,
        params: dict[str, Any],
        cluster: ClusterInfo,
        *,
        store: CheckpointStore,
        run_id: str,
        work_dir: Path,
        attempt_dir: Path | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
        save_requested: Callable[[], bool] = lambda: False,
        saved: Callable[[], None] = lambda: None,
        faults: FaultPlan | None = None,
        clock: Callable[[], float] = time.monotonic,
        strategy: tf.distribute.Strategy | None = None,
        input_source: Callable[[int, int], Any] | None = None,
    ) -> None:
        """``strategy``: one made already (a fit script's, runner/keras_recipes/fitscript.py), else made here.
        ``input_source(epoch, start)``: the iterator to train epoch ``epoch`` from step
        ``start`` on, in place of the recipe's per-epoch ``dataset`` (runner/input/data.py).
        ``stop_requested()``: True once SIGTERM/SIGINT asked this worker to stop
        (runner/worker_main.py); it is this worker's preemption vote in every call.
        ``save_requested()``: True once per preemption notice the machine survives
        (runner/preemption_notices.py): this worker's vote in the call's save column, beside
        the chief's time-based one, so the group saves the same step and trains on.
        ``saved()``: the group took an agreed save (the notice watch drops a vote that arrives
        right after one: workers on one node see the same notice, not always in the same call)."""
        self.job = job
        self._given_strategy = strategy
        self._input_source = input_source
        self.recipe = recipe
        self.params = params
        self.cluster = cluster
        self.store = store
        self.run_id = run_id
        self.work_dir = work_dir
        self.stop_requested = stop_requested
        self.save_requested = save_requested
        self._saved = saved
        self.faults = faults or FaultPlan([], rank=cluster.rank, attempt=0)
        self.clock = clock
        self._own_step: OwnStep | None = None  # a model's own train_step (runner/keras_recipes/own_step.py)
        self.stats: _EpochStats | LastLogs = _EpochStats()
        self.input_check = InputCheck(strict=job.strict_resume, recipe_name=recipe.name)  # resume check
        # Once, at start: the recipe file read and hashed as this process imported it (not on
        # every save, and not an edit made to the file while the run goes on).
        self._fingerprint = fingerprint_for_worker(job, recipe.source, params).to_dict()
        # This worker's own stop request (SIGTERM/SIGINT, ``stop_requested``) was seen:
        # preemption_requested is reported once; the request rides every call's all-reduce.
        self._preemption_requested = False
        # The group agreed to stop: some worker's request reached the all-reduce, so every
        # worker stops after the same call, saves it (flushed) and returns None (exit 143).
        self._preemption_agreed = False
        # True from a fresh start (no checkpoint) until this process's first call of steps
        # finished: a failure in between is the job's bug, not a fault (runner/failures/diagnose.py).
        self.untrained_fresh_start = False
        self._last_saved: int | None = None
        # A Keras callback (EarlyStopping, TerminateOnNaN...) set model.stop_training, agreed by
        # every worker: the run completes at this epoch's end (training_stopped; the manifest's
        # stopped_early, callbacks.json's stopped). Not a preemption.
        self._stopped_early = False
        self._callback_state: bytes | None = None  # the restored checkpoint's callbacks.json
        # The epoch just ended, carried by its epoch-end checkpoint (runner/outputs/epoch_results.py).
        self._epoch_results: EpochResults | None = None
        self._async: AsyncCheckpointer | None = None
        self.policy = SavePolicy(
            every_steps=job.save_every_steps or 0,
            every_seconds=job.save_every_seconds,
            is_chief=cluster.is_chief,
            clock=clock,
        )
        self.sizer = CallSizer(job.steps_per_execution)
        # The memory tier (--snapshot-every, runner/state/tier.py): None when off.
        self._tier_off = MemoryTier.off_reason(job, cluster)
        self._tier = MemoryTier(job, cluster) if self._tier_off is None else None
        self._input_state_s = 0.0  # the last _save_request's time in state_to_save (auto times captures)
        self._recipe_source: str | None = None  # the recipe's resolved path, for every save's manifest
        self._call_steps = self.sizer.initial  # the agreed maximum of the next call
        self._marker = StepMarker(AttemptDir.at(attempt_dir).step_marker(cluster.rank)) if attempt_dir else StepMarker(None)
        # What the supervisor's hang watchdog reads besides the step: a phase that may take
        # long without a step (eval, a blocking save) gets the start-up allowance.
        self._phase = PhaseMarker(AttemptDir.at(attempt_dir).phase_marker(cluster.rank) if attempt_dir else None)
        # --record-indices (indexed recipes): every worker gathers, the chief writes.
        self._record_indices = job.record_indices and recipe.indexed
        self._step_indices = StepIndexLog(
            AttemptDir.at(attempt_dir).step_indices if attempt_dir and cluster.is_chief and self._record_indices else None)
        self._setup()

    # ----------------------------------------------------------------- setup
    def _setup(self) -> None:
        # What is loaded by now (TensorFlow, Keras, the recipe: ~350k objects) lives as long
        # as the process: frozen out of the cyclic collector's sight, a full collection no
        # longer walks it. One such collection took 0.15-0.18 s of every restart (measured
        # in the restore phase on both ranks; benchmarks/README.md).
        gc.freeze()
        # The strategy must exist before any other op (collectives are configured at start);
        # runner/strategy.py adds the heartbeat, registration and collective timeouts.
        self.strategy = self._given_strategy or make_strategy(self.job, self.cluster)
        startup_phases.mark("strategy")
        keras.utils.set_random_seed(self.job.seed)
        tf.config.experimental.enable_op_determinism()
        with self.strategy.scope():
            self.model = _call_recipe(self.recipe, "build_model", self.params)
            own_step = isinstance(self.model, keras.Model) and is_compiled(self.model) and has_own_step(self.model)
            if not isinstance(self.model, keras.Model) or not (self.model.built or own_step and self.model.weights):
                raise RecipeError(
                    f"recipe {self.recipe.name}: build_model() must return a built keras.Model "
                    "(start it with keras.Input(shape=...))"
                )
            self._compiled = is_compiled(self.model)
            if own_step:  # its train_step is the step; the optimizer comes from compile()
                self.recipe = from_own_step(self.recipe, self.model)
                self._own_step = OwnStep(self.model, self.strategy, self.recipe)
                self.stats = LastLogs()
            elif self._compiled:  # optimizer, loss and metrics come from compile()
                self.recipe = from_compiled(self.recipe, self.model)
            elif self.recipe.build_optimizer is None or self.recipe.loss is None:
                missing = [n for n in ("build_optimizer", "loss") if getattr(self.recipe, n) is None]
                raise RecipeError(
                    f"recipe {self.recipe.name}: defines no {' or '.join(missing)} and build_model() returned a "
                    "model that is not compiled; define them or call model.compile(optimizer=..., loss=...)"
                )
            if not own_step:
                self.stats = _EpochStats(self.recipe.metric_states)
            self.optimizer = _call_recipe(self.recipe, "build_optimizer", self.params)
            self.optimizer.build(self.model.trainable_variables)
            counters = ckpt_layout.new_counters()
        self.epoch, self.step_in_epoch, self.global_step = (counters[name] for name in ckpt_layout.COUNTERS)
        self.checkpoint = ckpt_layout.training_graph(
            model=self.model, optimizer=self.optimizer, counters=counters, rng=ckpt_layout.rng_state(self.model),
            metrics=ckpt_layout.metric_state(self.model) if self._own_step else None)
        startup_phases.mark("model_build")
        self._value_names: list[str] = []  # the packed row's layout, filled when traced
        self._health = HealthGuard(self.job.on_anomaly, emit=emit)  # issue 48 hook: --on-anomaly
        self._nan_injection = NanInjection.from_plan(self.faults)  # issue 48 hook: RT_FAULTS nan_loss
        self._train_call = self._make_train_call()
        self._sum_over_workers = _make_sum_over_workers(self.strategy)
        self.checkpointer = self._make_checkpointer()
        self._evaluator = Evaluator.for_job(self.strategy, self.model, self.recipe, self.params, self.job)
        self._callbacks = self._make_callbacks()
        self._input = self._make_epoch_input()
        if self._evaluator is not None:  # its iterators are torn down by the same reaper
            self._evaluator.retire = self._input.retire_evaluation
        startup_phases.mark("setup")

    def _make_epoch_input(self) -> EpochInput:
        """The epoch input (runner/input/reentry.py): each epoch's iterator, how a resumed
        epoch is re-entered (iterator_state may turn into skip at the first mid-epoch save,
        when the state is measured too large), what a save records of it, its retirement."""
        common = dict(rank=self.cluster.rank, workers=self.cluster.num_workers, gather=self._gather,
                      gather_bytes=self._gather_bytes, current_epoch=lambda: int(self.epoch.numpy()))
        if self._input_source is not None:  # a fit script's one iterator (runner/keras_recipes/fitscript.py)
            return EpochInput.for_fit_script(self._input_source, **common)
        job = self.job

        def dataset(epoch: int, start_step: int, worker: tuple[int, int] | None, symbolic: bool = False) -> Any:
            return epoch_dataset(
                self.strategy, self.recipe, epoch=epoch, seed=job.seed, start_step=start_step,
                steps_per_epoch=job.steps_per_epoch, global_batch_size=job.global_batch_size, params=self.params,
                input_check=self.input_check, worker=worker, symbolic=symbolic,
            )

        return EpochInput.for_recipe(
            self.recipe, dataset=dataset, max_state_bytes=job.max_iterator_state_bytes,
            replicas_per_worker=self.strategy.num_replicas_in_sync // self.cluster.num_workers, **common)

    def _make_callbacks(self) -> CallbackRunner | None:
        if self.recipe.callbacks is None:
            return None
        callbacks = _call_recipe(self.recipe, "callbacks", self.params)
        if not isinstance(callbacks, (list, tuple)):
            raise RecipeError(
                f"recipe {self.recipe.name}: callbacks() returned {type(callbacks).__name__}; "
                "expected a list of keras.callbacks.Callback"
            )
        if getattr(self.model, "optimizer", None) is None:
            # Callbacks reach the optimizer as model.optimizer (ReduceLROnPlateau). Set
            # without Keras' tracking so the checkpoint's object graph stays the twin's.
            object.__setattr__(self.model, "optimizer", self.optimizer)
        runner = CallbackRunner(
            callbacks, self.model, recipe_name=self.recipe.name, is_chief=self.cluster.is_chief,
            # A fit script's (it has an input_source) relative paths mean what they mean in plain
            # Keras: the working directory; a recipe's land in the run directory.
            output_dir=None if self._input_source is not None else Path(self.job.run_dir),
            epochs=self.job.epochs, steps_per_epoch=self.job.steps_per_epoch,
            validates=self._evaluator is not None,
        )
        for log_dir in runner.tensorboard_dirs:  # a TensorBoard callback: the runner's scalars there too
            add_listener(TensorBoardLog(log_dir))
        return runner

    def _make_checkpointer(self) -> Checkpointer:
        """HOW this worker saves, decided once. async: the chief (and every worker only if
        the model has sync-on-read variables, whose read is a collective) keeps a twin of
        the saved state (runner/state/checkpointing.py); other workers write nothing."""
        if self._tier is None and self.job.snapshot_every == SNAPSHOT_EVERY_AUTO:  # auto resolved to off
            emit("memory_tier", setting=SNAPSHOT_EVERY_AUTO, every_steps=SNAPSHOT_EVERY_OFF, reason=self._tier_off,
                 rank=self.cluster.rank)
        if self.job.checkpoint_mode == "sync":
            return SyncCheckpointer(
                self.checkpoint,
                weights_sha256=lambda: weights_digest(self.model),
                store=self.store,
                staging_root=self.work_dir / "staging",
                is_chief=self.cluster.is_chief,
                rank=self.cluster.rank,
                run_id=self.run_id,
                world_size=self.cluster.num_workers,
                faults=self.faults,
                keep=self.job.keep,
            )
        twin = TwinState.build(self.checkpoint, self.model, self._build_twin)
        if not (self.cluster.is_chief or twin.sync_on_read or self._tier is not None):
            return NoCheckpointer()
        self._async = AsyncCheckpointer(twin, self._persist)
        if self._tier is not None:
            self._tier.start(self._async, model=self.model, strategy=self.strategy,
                             sum_over_workers=self._sum_over_workers,
                             counters=(self.epoch, self.step_in_epoch, self.global_step),
                             commit=self._commit_rescue, last_committed=self._last_committed_step,
                             unable=self._why_no_rescue_here)
        return BackgroundCheckpointer(self._async, persist=self.cluster.is_chief)

    def _last_committed_step(self) -> int | None:
        manifest = self.store.latest_manifest()
        return None if manifest is None else manifest.global_step

    def _why_no_rescue_here(self) -> str | None:
        """A non-chief does not run the chief-only callbacks (ModelCheckpoint, CSVLogger,
        TensorBoard write files on the chief): their state changes only at epoch ends, which
        always commit, so its rescue takes their entries from the newest commit
        (_commit_rescue). Only a ModelCheckpoint saving at batch ends (an integer save_freq)
        has state that lives on the chief alone between commits: then the rescue is the chief's or none."""
        if self._tier is not None and self._tier.workers_differ is not None and not self.cluster.is_chief:
            return self._tier.workers_differ
        per_batch = [] if self._callbacks is None or self.cluster.is_chief else self._callbacks.chief_only_per_batch
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
        epoch_start = request.global_step - request.step_in_epoch
        manifest = self.store.latest_manifest()
        if manifest is None or manifest.global_step < epoch_start:
            newest = "none" if manifest is None else f"step {manifest.global_step}"
            raise RescueUnavailable(
                f"the chief-only callbacks' state at step {epoch_start} (the start of the snapshot's epoch) "
                f"was never committed (newest commit: {newest})")
        return self._callbacks.with_chief_state(request.files[STATE_FILE],
                                                self.store.read_committed_file(manifest, STATE_FILE))

    def _build_twin(self) -> tuple[tf.train.Checkpoint, keras.Model]:
        """A second, strategy-free copy of everything ``self.checkpoint`` holds (same keys)."""
        model = _call_recipe(self.recipe, "build_model", self.params)
        optimizer = model.optimizer if self._compiled else _call_recipe(self.recipe, "build_optimizer", self.params)
        optimizer.build(model.trainable_variables)
        checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer,
                                                counters=ckpt_layout.new_counters(name_prefix="twin_"),
                                                rng=ckpt_layout.twin_rng_state(self.model, model),
                                                metrics=(ckpt_layout.twin_metric_state(self.model, model)
                                                         if self._own_step else None))
        return checkpoint, model

    def _persist(self, request: SaveRequest, *, emit: Callable[..., None] = emit) -> Manifest:
        """The background half of an async save (runs on the persist thread), or a rescue's commit."""
        assert self._async is not None  # only called by the AsyncCheckpointer and the Rescuer
        return persist_twin(
            self._async.twin,
            request,
            store=self.store,
            staging_root=self.work_dir / "staging",
            digest=weights_digest,
            run_id=self.run_id,
            world_size=self.cluster.num_workers,
            faults=self.faults,
            keep=self.job.keep,
            emit=emit,
            finite_only=self._health.requires_finite_commit,  # issue 48 hook: the commit's second guard
        )

    def _make_train_call(self):
        """One compiled call: ``steps`` training steps, counters advanced in-graph.

        Per step, besides the gradients' all-reduce, ONE packed all-reduce carries
        [loss, metric means..., the control columns (runner/control_row.py: the stop and
        save votes, the chief's next call size and memory-tier intervals), the memory tier's
        comparison in a call's last step when a snapshot follows]. The call
        returns the reduced rows stacked, shape [steps, values]: the
        host reads one small tensor per call and sums the epoch's loss per step exactly as
        a one-step-per-call loop would (bit-identical epoch means for every N).
        """
        model, optimizer, recipe, strategy = self.model, self.optimizer, self.recipe, self.strategy
        global_batch_size = self.job.global_batch_size
        names = self._value_names

        indexed, record = recipe.indexed, self._record_indices
        own_step = self._own_step
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
                loss = nan_injection.poisoned(loss, self.global_step)  # issue 48 hook (no-op unless armed)
            gradients = tape.gradient(loss, model.trainable_variables)
            nonfinite = health_detector.step_nonfinite(loss, gradients)  # issue 48 hook
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
            if own_step is not None:  # its gradients are not visible: its logs are tested (issue 48 hook)
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
            if fingerprint and self._tier is not None and self._tier.agreement is not None:
                agreement = self._tier.call_columns()
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
            width = (self._tier.call_columns(width_only=True)
                     if fingerprint and self._tier is not None and self._tier.agreement is not None else 0)

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
                    self.global_step.assign_add(1)
                    self.step_in_epoch.assign_add(1)
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

    def _gather(self, value: int) -> list[int]:
        """Every worker's ``value``, indexed by rank (one all-reduce)."""
        vector = np.zeros(self.cluster.num_workers, dtype=np.float64)
        vector[self.cluster.rank] = value
        summed = self._sum_over_workers(tf.constant(vector))
        return [int(v) for v in summed.numpy()]

    def _gather_bytes(self, mine: bytes, sizes: list[int]) -> list[bytes]:
        """Every worker's ``mine`` (of the given sizes), indexed by rank (one all-reduce)."""
        # Four bytes to an int32: each row is one worker's and zero elsewhere, so the SUM is
        # that worker's bits exactly (a byte to an int32 moved 4x the data: 20-35 ms of every
        # capture of digits_cnn's ~580 KB states, against ~8 ms).
        width = -(-max(sizes) // 4)
        rows = np.zeros((self.cluster.num_workers, width * 4), dtype=np.uint8)
        rows[self.cluster.rank, :len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        summed = self._sum_over_workers(tf.constant(rows.view(np.int32)))
        packed = np.ascontiguousarray(summed.numpy()).view(np.uint8)
        return [packed[rank, :size].tobytes() for rank, size in enumerate(sizes)]

    # --------------------------------------------------------------- restore
    def _restore_or_start(self) -> None:
        if self.cluster.is_chief:
            self.store.collect_garbage()
        cache_dir = self.work_dir / "cache"
        found = self.store.restore_latest(cache_dir)
        startup_phases.mark("fetch")
        mine = found[0].global_step if found else -1
        agreed = self._gather(mine)[0]
        startup_phases.mark("agree")
        if agreed < 0:
            emit("fresh_start", group=True, epoch=0, step_in_epoch=0, global_step=0)
            self.untrained_fresh_start = True
            return
        if found is None or mine != agreed:
            found = self.store.fetch(agreed, cache_dir)
        manifest, local_dir = found
        ckpt_layout.restore(self.checkpoint, local_dir / "ckpt", recipe_name=self.recipe.name,
                            where=f"Checkpoint {self.store.url}/{CheckpointStore.dir_name(agreed)}")
        self.stats.load_extra(manifest.extra)
        state_file = local_dir / STATE_FILE
        self._callback_state = state_file.read_bytes() if state_file.is_file() else None
        self.input_check.expect(manifest.extra, checkpoint=CheckpointStore.dir_name(agreed),
                                same_world_size=manifest.world_size == self.cluster.num_workers)
        self._last_saved = manifest.global_step
        if self._tier is not None:
            self._tier.schedule.taken(manifest.global_step)  # the interval counts from the restored step
        reentry, reentry_reason = self._input.plan_reentry(manifest, local_dir)
        if manifest.world_size != self.cluster.num_workers:
            emit(
                "world_size_changed",
                group=True,
                checkpoint_world_size=manifest.world_size,
                world_size=self.cluster.num_workers,
                input="indexed" if self.recipe.indexed else "dataset",
                note=_RESIZE_NOTE_INDEXED if self.recipe.indexed else _RESIZE_NOTE_DATASET,
            )
        emit(
            "restored",
            group=True,
            epoch=manifest.epoch,
            step_in_epoch=manifest.step_in_epoch,
            global_step=manifest.global_step,
            checkpoint=f"{self.store.url}/{CheckpointStore.dir_name(manifest.global_step)}",
            input_reentry=reentry,
            input_reentry_reason=reentry_reason,
        )
        self._report_epoch_end_after_restore(manifest)

    # ------------------------------------------------------------------ save
    def save(self, *, completed: bool = False, flush: bool = False, after_call: bool = False) -> Manifest | None:
        """Checkpoint the current step (once per step), the configured way.

        ``completed`` or ``flush``: return only once the checkpoint is committed (the final
        save and a preemption save: exit 0 / 143 promise a committed step). ``after_call``:
        a mid-epoch save right after a call, whose packed all-reduce may have carried the
        workers' comparison (then the save makes no all-reduce of its own for it).
        """
        self.policy.saved()
        self._saved()
        flush = flush or completed
        global_step = int(self.global_step.numpy())
        # The request first, still in the training phase: it may all-reduce (the iterator
        # states), and a peer that hangs must meet the hang timeout there, not the start-up
        # allowance of a save (found by benchmarks/hang_detection.py: the chief sat in that
        # gather for 600 s while its peer hung).
        capture = flush or self._save_captures(global_step)
        request = None if global_step == self._last_saved else self._save_request(completed, capture=capture)
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
        return self._tier.save_captures(global_step, input_captured=self._input.captured)

    def _snapshot(self) -> None:
        """The memory tier: snapshot the current step into this worker's twin, persist
        nothing (every worker at the same agreed step: the request may all-reduce)."""
        tier = self._tier
        assert self._async is not None and tier is not None
        global_step = int(self.global_step.numpy())
        capture = tier.snapshot_captures(global_step, input_captured=self._input.captured)
        started = time.perf_counter()
        request = self._save_request(completed=False, capture=capture)  # (it may all-reduce)
        capture_s = self._input_state_s if capture else 0.0  # the capture alone (the rest is paid every snapshot)
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

    def _save_request(self, completed: bool, *, capture: bool = True) -> SaveRequest:
        # Only the chief's copy is ever committed; the others skip encoding (best_weights can be
        # large), unless the memory tier is on: then any survivor may commit its own snapshot.
        encodes = self.cluster.is_chief or self._tier is not None
        files = ({STATE_FILE: self._callbacks.state(stopped=self._stopped_early)}
                 if self._callbacks and encodes else {})
        # Each counter read once (a distributed variable's read is ~0.1 ms: snapshots pay it every N steps).
        epoch, step_in_epoch, global_step = (int(v.numpy()) for v in (self.epoch, self.step_in_epoch, self.global_step))
        started = time.perf_counter()
        iterator_files, iterator_extra = self._input.state_to_save(epoch, step_in_epoch, files_everywhere=encodes,
                                                                  capture=capture)
        self._input_state_s = time.perf_counter() - started
        files.update(iterator_files)
        if self._recipe_source is None:
            self._recipe_source = str(Path(self.recipe.source).resolve())
        return SaveRequest(
            files=files,
            global_step=global_step,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            extra={
                **self.stats.to_extra(),
                **(self._epoch_results.to_extra()
                   if self._epoch_results is not None and self._epoch_results.global_step == global_step else {}),
                "completed": completed,
                **({"stopped_early": True} if self._stopped_early else {}),
                "epochs": self.job.epochs,
                "steps_per_epoch": self.job.steps_per_epoch,
                "recipe": self.recipe.name,
                "recipe_source": self._recipe_source,  # verify --deep's default recipe
                "fingerprint": self._fingerprint,
                **self.input_check.to_extra(epoch),
                **iterator_extra,
            },
        )

    # ----------------------------------------------------------------- train
    def drain_pending_checkpoint(self, timeout_s: float) -> None:
        """Before exiting on an error: let an in-flight background save commit (bounded)."""
        self.checkpointer.drain(timeout_s)

    def _preemption_flag(self) -> float:
        """This worker's vote in the call's stop column: 1.0 once it was asked to stop."""
        if self.stop_requested():
            if not self._preemption_requested:
                self._preemption_requested = True
                emit("preemption_requested", source=f"worker:{self.cluster.rank}")  # SIGTERM or SIGINT
            return 1.0
        return 0.0

    def _preempt(self) -> None:
        """Everyone agreed to stop after this call: save it (zero lost steps) and return."""
        self.save(flush=True)  # exit 143 only after the save committed
        emit("preempted", group=True, global_step=int(self.global_step.numpy()), epoch=int(self.epoch.numpy()),
             step_in_epoch=int(self.step_in_epoch.numpy()))
        return None

    def _run_call(self, iterator, steps: int, global_step: int) -> tuple[bool, bool]:
        """Train ``steps`` steps after ``global_step``; returns the agreed (preempt, save) flags
        and sets the agreed maximum steps of the next call."""
        self.checkpointer.raise_if_failed()  # a background persist failed: stop with its error
        chief = self.cluster.is_chief
        snapshot_every, capture_every = (
            self._tier.proposal(call_steps=self._call_steps, proposed_call_steps=self.sizer.proposal(),
                                step_s=self.sizer.step_seconds)
            if chief and self._tier is not None else (0.0, 0.0))
        flags = control_row.encode(control_row.Votes(
            stop=self._preemption_flag(), save=max(self.policy.time_flag(), float(self.save_requested())),
            next_call=self.sizer.proposal() if chief else 0.0, snapshot_every=snapshot_every,
            capture_every=capture_every))
        started, traces = time.perf_counter(), startup_phases.traces()
        # Does a snapshot follow this call? Then its last step fingerprints for the comparison
        # (memory tier; a snapshot after a call without them compares with its own all-reduce).
        fingerprint = self._tier is not None and self._tier.fingerprint_due(global_step + steps,
                                                                             save_at=self.policy.counts_to)
        result = self._train_call(iterator, tf.constant(steps, tf.int32), flags, bool(fingerprint))
        if self._record_indices:
            result, index_rows = result
            for offset, indices in enumerate(index_rows.numpy(), 1):
                self._step_indices.write(global_step + offset, indices.tolist())
            self._step_indices.flush()
        rows = result.numpy()
        startup_phases.mark("first_call")
        self.untrained_fresh_start = False  # a step finished: later failures may be faults
        # issue 48 hook: a non-finite step is acted on here (--on-anomaly), before any save or snapshot of it.
        self._health.after_call(health_detector.first_anomaly(
            rows, self._value_names, first_global_step=global_step + 1,
            position=lambda: (int(self.epoch.numpy()), int(self.step_in_epoch.numpy()) - steps)),
            last_global_step=global_step + steps, settle=self.checkpointer.flush)
        if chief:
            self.sizer.observed(steps, time.perf_counter() - started, traced=startup_phases.traces() != traces)
        names = self._value_names
        states = self.recipe.metric_states  # its columns follow the named values (_make_train_call)
        for row in rows:
            values, _ = control_row.split(row, names)
            self.stats.add({name: value for name, value in values.items() if not is_state_column(name)})
            if states is not None:
                self.stats.add_states(row[len(values) - states.width:len(values)])
        if self._tier is not None:
            self._tier.saw_call(rows[-1], len(names), fingerprint=fingerprint)
        self._marker.write(global_step + steps)
        _, agreed = control_row.split(rows[-1], names)
        self._call_steps = max(1, int(round(agreed.next_call)))
        if self._tier is not None:
            self._tier.adopt(agreed.snapshot_every, agreed.capture_every)
        return agreed.stop > 0, agreed.save > 0

    def _hit_step_faults(self, first: int, last: int) -> None:
        """Faults address single steps; one inside a call fires at the call's end (the
        first moment the host sees that step done), in step order."""
        for step in range(first, last + 1):
            self.faults.hit("raise", step)
            self.faults.hit("after_step", step)

    def _train_epoch(self, epoch: int, start: int, progress: "_Progress") -> bool:
        """Train epoch ``epoch`` from ``start`` to its end; False if preempted mid-epoch."""
        self._phase.enter(PHASE_INPUT)  # a slow phase: a big input pipeline may take a while to build
        iterator = self._input.iterator(epoch, start)
        if self.input_check.agreement_pending and self._tier is not None:
            # The chief checked the input a restore entered; with the memory tier a survivor may
            # commit its own snapshot (a rescue), so every worker records the chief's verdict.
            self.input_check.agreed(self._gather(int(self.input_check.restore_mismatched))[0] > 0)
        startup_phases.mark("input")
        ended = self._train_steps(iterator, epoch, start, progress)
        if ended and not self._preemption_agreed:
            self._input.retire(iterator, epoch)
        else:
            self._input.keep(iterator)  # past the preemption save: no teardown on the way out
        del iterator
        return ended

    def _train_steps(self, iterator: Any, epoch: int, start: int, progress: "_Progress") -> bool:
        """Train epoch ``epoch`` from ``start`` on ``iterator``; False if preempted mid-epoch."""
        job = self.job
        steps_per_epoch = job.steps_per_epoch
        step_in_epoch, global_step = start, int(self.global_step.numpy())
        self._phase.enter(PHASE_TRAIN, epoch=epoch, epoch_start_step=global_step - start)
        while step_in_epoch < steps_per_epoch:
            steps = self.policy.call_length(global_step=global_step, step_in_epoch=step_in_epoch,
                                            steps_per_epoch=steps_per_epoch, max_steps=self._call_steps)
            if self._tier is not None:  # a call also ends at the memory tier's next snapshot
                steps = self._tier.schedule.call_length(global_step=global_step, max_steps=steps)
            if self._callbacks:
                self._callbacks.batch_begin(step_in_epoch)
            preempt, save_due = self._run_call(iterator, steps, global_step)
            step_in_epoch, global_step = step_in_epoch + steps, global_step + steps
            progress.advanced(steps, epoch=epoch, step_in_epoch=step_in_epoch, global_step=global_step,
                              means=self.stats.means(), steps_per_call=self._call_steps)
            self._hit_step_faults(global_step - steps + 1, global_step)
            if self._callbacks and self._batch_end_stops_early(step_in_epoch - 1):
                return True  # Keras ends the epoch here: on_epoch_end, on_train_end, final save
            if preempt:
                self._preemption_agreed = True
                if step_in_epoch < steps_per_epoch:
                    return False
            elif self.policy.save_after(global_step=global_step, step_in_epoch=step_in_epoch,
                                        steps_per_epoch=steps_per_epoch, agreed_time_flag=save_due):
                self.save(after_call=True)
            elif self._tier is not None and step_in_epoch < steps_per_epoch and self._tier.schedule.due(global_step):
                self._snapshot()  # (the epoch end saves, which snapshots too)
        return True

    def _record_next_input(self, epoch: int) -> None:
        """The chief hashes epoch ``epoch``'s first batch before the epoch-end save, so that
        checkpoint (the one a resume at this boundary restores) carries it for the resume
        check (runner/input/determinism.py). It replaces the hash :func:`epoch_dataset` would take
        on entering the epoch: one first-batch build per epoch either way.

        Not for a fit script's input (the runner does not build it), and not when a stop was
        agreed: the preemption grace period is not spent on it (that boundary then resumes
        unchecked, as before)."""
        if self._input_source is not None or self._preemption_agreed or self.cluster.rank != 0:
            return
        previous = self._phase.enter(PHASE_INPUT)
        try:
            record_first_batch(
                self.strategy, self.recipe, self.input_check, epoch=epoch, seed=self.job.seed,
                steps_per_epoch=self.job.steps_per_epoch, global_batch_size=self.job.global_batch_size,
                params=self.params, workers=self.cluster.num_workers, plain=self._input.plain,
            )
        finally:
            self._phase.restore(previous)

    def _batch_end_stops_early(self, batch: int) -> bool:
        """``on_train_batch_end``; True when the callbacks stopped training (all agree)."""
        assert self._callbacks is not None
        self._callbacks.batch_end(batch, self.stats.means())
        # One all-reduce per call, only when some callback has batch hooks (every worker
        # decides this from the full list, so all take part or none).
        if self._callbacks.has_batch_hooks and self._agree(self._callbacks.stop_training):
            self._stopped_early = True
        return self._stopped_early

    def _agree(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is true on any (one all-reduce)."""
        agreed = any(self._gather(int(flag)))
        if self._callbacks:
            self.model.stop_training = agreed
        return agreed

    def _after_epoch_saved(self, epoch: int) -> dict[str, Any]:
        """Epoch-end hook: runs after epoch ``epoch``'s checkpoint is saved, before
        ``epoch_finished`` is emitted; returns extra fields for that event: the held-out
        evaluation's results. It reads the weights only, so an async commit overlaps it.
        With callbacks it runs before the save instead (on_epoch_end needs val_*); after a
        restore at an epoch end whose evaluation never finished, it runs then."""
        if self._evaluator is None:
            return {}
        previous = self._phase.enter(PHASE_EVAL)
        try:
            fields = self._evaluator.after_epoch(epoch + 1)
        finally:
            self._phase.restore(previous)
        self.faults.hit("after_evaluation", int(self.global_step.numpy()))
        return fields

    def _finish_epoch(self, epoch: int) -> None:
        """Advance the counters past epoch ``epoch``, save, report ``epoch_finished``.

        With callbacks, the evaluation comes first and ``on_epoch_end`` (its logs carry
        ``val_*``) runs before the save, with the stop agreed by every worker, so the saved
        callback state has seen the epoch; ``on_train_end`` runs before the final save.
        Without, the evaluation follows the save (an async commit overlaps it).

        The epoch-end checkpoint carries the epoch's numbers, and ``epoch_finished`` waits
        for its commit (runner/outputs/epoch_results.py): a kill before the commit trains
        the epoch again, which reports it then; a kill after it leaves the report to the
        restore (``_report_epoch_end_after_restore``). Exactly once either way.
        """
        means = self.stats.means()
        if self._own_step is not None:  # the trackers' results, or the last step's logs (Keras' choice)
            means = self._own_step.epoch_logs(means)
        validation, logs = self._callbacks_epoch_end(epoch, means) if self._callbacks else (None, None)
        self.epoch.assign_add(1)
        self.step_in_epoch.assign(0)
        self.stats = LastLogs() if self._own_step is not None else _EpochStats(self.recipe.metric_states)
        global_step = int(self.global_step.numpy())
        self._epoch_results = EpochResults(epoch=epoch, global_step=global_step, loss=means.pop("loss", None),
                                           metrics=means, validation=validation)
        completed = self._stopped_early or epoch + 1 >= self.job.epochs
        if completed and self._callbacks:
            self._callbacks.train_end(logs)  # e.g. restore_best_weights: the final checkpoint holds it
        if not completed:
            self._record_next_input(epoch + 1)
        self.save(completed=completed)
        if validation is None:
            validation = self._after_epoch_saved(epoch)
        self.checkpointer.flush()  # the epoch-end checkpoint is committed (the chief's wait; others have none)
        self._report_epoch(self._epoch_results, validation, stopped_early=self._stopped_early)
        self.faults.hit("after_epoch_finished", global_step)

    @staticmethod
    def _report_epoch(results: EpochResults, validation: dict[str, Any], *, stopped_early: bool,
                      after_restore: bool = False) -> None:
        """``epoch_finished`` (and ``training_stopped`` when a callback ended training there)."""
        emit("epoch_finished", group=True, **results.event_fields(validation),
             **({"after_restore": True} if after_restore else {}))
        if stopped_early:
            emit("training_stopped", group=True, epoch=results.epoch, global_step=results.global_step,
                 reason="model.stop_training")

    def _report_epoch_end_after_restore(self, manifest: Manifest) -> None:
        """A restore exactly at an epoch end whose ``epoch_finished`` was never written (the
        previous attempt died between the commit and the report): report it now, with the
        numbers the checkpoint carries, evaluating first if the evaluation had not finished
        before the save. The chief decides from this run's events.jsonl (it alone writes
        group events there); every worker follows its answer (one all-reduce), since the
        evaluation is collective."""
        results = EpochResults.from_extra(manifest.extra) if manifest.step_in_epoch == 0 else None
        if results is None or results.global_step != manifest.global_step:
            return  # mid-epoch: the epoch before was reported before any step of this one
        missing = self.cluster.is_chief and not already_reported(
            RunDir(self.job.run_dir).events, run_id=self.run_id, epoch=results.epoch, global_step=results.global_step)
        if not self._gather(int(missing))[0]:  # the chief's answer, on every worker
            return
        validation = results.validation
        if validation is None:  # evaluated after the save: again now (deterministic, the same numbers)
            validation = self._after_epoch_saved(results.epoch)
        self._report_epoch(results, validation, stopped_early=bool(manifest.extra.get("stopped_early")),
                           after_restore=True)

    def _callbacks_epoch_end(self, epoch: int, means: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Evaluate, ``on_epoch_end``, agree on stopping; (the evaluation's event fields, the logs)."""
        assert self._callbacks is not None
        extra = self._after_epoch_saved(epoch)
        logs = dict(means)
        if "val_loss" in extra:
            logs["val_loss"] = extra["val_loss"]
            logs.update({f"val_{name}": value for name, value in extra["val_metrics"].items()})
        logs = self._callbacks.epoch_end(epoch, logs)
        self._stopped_early = self._agree(self._callbacks.stop_training) or self._stopped_early
        self.faults.hit("after_epoch_end_callbacks", int(self.global_step.numpy()))
        return extra, logs

    def run(self) -> TrainResult | None:
        """Train to the end (returns the result) or until preempted (returns None)."""
        self._restore_or_start()
        if self._health.rolls_back:  # issue 48 hook: a replay after a rollback? (the chief's answer, one all-reduce)
            arm_replay(self._health, is_chief=self.cluster.is_chief, events_path=RunDir(self.job.run_dir).events,
                       run_id=self.run_id, restored_step=int(self.global_step.numpy()), gather=self._gather)
        startup_phases.mark("restore")
        if self._callbacks:
            self._callbacks.train_begin(resuming=self._callback_state is not None)
            if self._callback_state is not None:
                self._stopped_early = self._callbacks.restore(self._callback_state)
        progress = _Progress(self.job.progress_every_s, self.job.steps_per_epoch, self.job.epochs, self.clock)
        while not self._stopped_early and (epoch := int(self.epoch.numpy())) < self.job.epochs:
            start = min(int(self.step_in_epoch.numpy()), self.job.steps_per_epoch)  # a longer epoch's checkpoint
            if self._own_step is not None and start == 0:  # Keras' fit resets the trackers every epoch
                self._own_step.reset()
            if self._callbacks and start == 0:  # not again when re-entering the epoch mid-way
                self._callbacks.epoch_begin(epoch)
            if not self._train_epoch(epoch, start, progress):
                return self._preempt()
            self._finish_epoch(epoch)
            if self._preemption_agreed:  # agreed in the epoch's last call: _preempt flushes the epoch-end save
                return self._preempt()
        self._phase.enter(PHASE_FINISH)  # the final flush, then the export
        self.checkpointer.flush()  # the completed checkpoint is committed before exit 0
        result = TrainResult(
            global_step=int(self.global_step.numpy()),
            epoch=int(self.epoch.numpy()),
            weights_sha256=weights_digest(self.model),
        )
        emit(
            "training_completed",
            group=True,
            global_step=result.global_step,
            epoch=result.epoch,
            weights_sha256=result.weights_sha256,
        )
        return result


class _Progress:
    """``first_step`` once per attempt, then ``train_progress`` at most every ``every_s``
    (with ``epochs``, the planned total: the console's percentage and ETA, a fit script's too)."""

    def __init__(self, every_s: float, steps_per_epoch: int, epochs: int, clock: Callable[[], float]) -> None:
        self.every_s = every_s
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.clock = clock
        self.first_pending = True
        self.last = self.window_start = clock()
        self.window_steps = 0

    def advanced(self, steps: int, *, epoch: int, step_in_epoch: int, global_step: int, means: dict[str, float],
                 steps_per_call: int) -> None:
        if self.first_pending:  # the recovery benchmark's "training again" moment
            self.first_pending = False
            emit("first_step", group=True, global_step=global_step)
            # Every rank's: the chief's strategy/agree phases wait for the slowest peer's own start-up.
            emit("startup_phases", global_step=global_step, **startup_phases.report())
        self.window_steps += steps
        now = self.clock()
        if now - self.last < self.every_s:
            return
        emit(
            "train_progress",
            group=True,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            steps_per_epoch=self.steps_per_epoch,
            epochs=self.epochs,
            global_step=global_step,
            steps_per_s=round(self.window_steps / max(now - self.window_start, 1e-9), 2),
            steps_per_call=steps_per_call,
            **{k: round(v, 6) for k, v in means.items()},
        )
        self.last = self.window_start = now
        self.window_steps = 0


def _make_sum_over_workers(strategy: Any) -> Callable[[tf.Tensor], tf.Tensor]:
    """``sum(value)`` over every worker (one all-reduce), as a tf.function.

    Called eagerly, ``strategy.run`` costs a per-call retrace and TensorFlow logs "Using
    CollectiveAllReduceStrategy eagerly has significant overhead" (up to 5 times a process:
    it crowded the root cause's log tail). Traced once per dtype; ``reduce_retracing`` lets
    the iterator-state rows (their width varies with the states' size) share one trace.
    Every worker calls it at the same points in the same order, as it did eagerly, so the
    collectives still pair up.
    """

    @tf.function(reduce_retracing=True, autograph=False)  # nothing to convert: ~20 ms less of the agree phase
    def sum_over_workers(value: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(value,)), axis=None)

    return sum_over_workers


def _call_recipe(recipe: Recipe, name: str, params: dict[str, Any]) -> Any:
    """Call a recipe builder; its failure is the recipe's (fatal: a restart cannot fix it)."""
    try:
        return getattr(recipe, name)(params)
    except Exception as exc:
        raise RecipeError(f"recipe {recipe.name}: {name}() failed: {type(exc).__name__}: {exc}") from exc
