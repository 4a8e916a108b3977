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
# 5. Each tf.function call runs up to --steps-per-execution steps (train_call.py; auto:
#    sized to ~0.1 s, call_size.py), per step ONE packed all-reduce besides the gradients'
#    (loss, metrics, the control columns of control_row.py: votes, the chief's next call
#    size; the replicas' comparison in a checked call's last step, runner/health/). Everything
#    else happens between calls: SavePolicy (runner/state/save_policy.py) ends a call at every
#    step-count save point and at the epoch end, so the committed steps are the same for every N;
#    stop agreement, progress, step markers and fault hooks see call ends only.
# 6. Saving (runner/state/saving.py): the Checkpointer chosen once at setup (checkpointing.py) says how.
#    async (default): the chief snapshots into its twin and a background thread persists;
#    other workers write nothing. sync: all workers write the tf.train.Checkpoint
#    (variables may need collectives); only the chief's copy is committed (MANIFEST.json
#    last). Every epoch end (epoch_end.py EpochEnd) is saved, carrying the epoch's results; then the evaluation
#    (the epoch-end hook) runs and, once that checkpoint is committed, epoch_finished is
#    emitted; a restore at an epoch end reports an epoch whose report a kill prevented
#    (runner/outputs/epoch_results.py).
#    The memory tier (--snapshot-every N, runner/state/memory_tier.py): every worker keeps
#    a twin, calls also end N steps after the last snapshot or save, and there every
#    worker snapshots (Saving.snapshot, runner/state/saving.py: the same request a save builds, nothing persisted); a
#    survivor's Rescuer commits that snapshot when the supervisor reports a peer's death
#    or a hang. auto (the default): a snapshot after every call until the chief, having
#    timed a few, proposes the interval in the packed all-reduce (runner/training/control_row.py) and
#    every worker adopts it at the same call (memory_tier.AutoInterval).
# 7. Preemption (stop_votes.py StopVotes): each worker's stop request (SIGTERM/SIGINT) is
#    summed in the packed all-reduce, so every worker stops after the same call
#    (StopVotes.agreed), saves it (flushed) and returns None (the worker exits 143).
#    Not to be confused with a Keras callback's model.stop_training (EpochEnd.stopped_early): the
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

import gc
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import keras
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore
from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import (
    DETERMINISTIC_SKIP, LOSS_SPIKE_OFF, REPLICA_CHECK_OFF, STRAGGLER_OFF, TRANSIENTS_OFF, JobConfig,
)
from resilient_train.errors import RecipeError
from resilient_train.rundir.events import add_listener, emit
from resilient_train.job.fingerprint import fingerprint_for_worker
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.callbacks import CallbackRunner
from resilient_train.runner.keras_recipes.compiled import from_compiled, is_compiled
from resilient_train.runner.keras_recipes.own_step import (
    LastLogs, OwnStep, build_twin_optimizers, from_own_step, has_own_step,
)
from resilient_train.runner.input.data import epoch_dataset, record_first_batch
from resilient_train.runner.outputs.evaluation import Evaluator
from resilient_train.runner.input.determinism import InputCheck
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.input.reentry import EpochInput
from resilient_train.runner.state.tier import MemoryTier
from resilient_train.runner.state.save_policy import SavePolicy
from resilient_train.runner.state.saving import Saving
from resilient_train.runner.process import startup_phases
from resilient_train.runner.health.anomaly_policy import HealthGuard, HostSuspicion
from resilient_train.runner.health.spikes import LossSpikes
from resilient_train.runner.health.injection import BitFlip, NanInjection, Slowdown
from resilient_train.runner.health import stall_probe
from resilient_train.runner.health.straggler_replace import StragglerReplacement
from resilient_train.runner.health.stragglers import StragglerDetector, StragglerOptions
from resilient_train.runner.training.epoch_end import Counters, EpochEnd, EpochStats
from resilient_train.runner.training.collectives import Collectives
from resilient_train.runner.training.progress import Progress
from resilient_train.runner.training.stop_votes import StopVotes
from resilient_train.runner.training.strategy import make_strategy
from resilient_train.runner.training.train_call import TrainCall, hit_step_faults
from resilient_train.rundir.stepmarker import (
    PHASE_FINISH,
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

@dataclass(frozen=True)
class TrainResult:
    global_step: int
    epoch: int
    weights_sha256: str


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
        (runner/process/worker_main.py); it is this worker's preemption vote in every call.
        ``save_requested()``: True once per preemption notice the machine survives
        (runner/process/preemption_notices.py): this worker's vote in the call's save column, beside
        the chief's time-based one, so the group saves the same step and trains on.
        ``saved()``: the group took an agreed save (the notice watch drops a vote that arrives
        right after one: workers on one node see the same notice, not always in the same call)."""
        self.job = job
        self.recipe = recipe
        self.params = params
        self.cluster = cluster
        self.faults = faults or FaultPlan([], rank=cluster.rank, attempt=0)
        self._own_step: OwnStep | None = None  # a model's own train_step (runner/keras_recipes/own_step.py)
        self.stats: EpochStats | LastLogs = EpochStats()
        self.input_check = InputCheck(strict=job.strict_resume, recipe_name=recipe.name)  # resume check
        self._fresh_start = False  # no checkpoint was restored (untrained_fresh_start)
        policy = SavePolicy(
            every_steps=job.save_every_steps or 0,
            every_seconds=job.save_every_seconds,
            is_chief=cluster.is_chief,
            clock=clock,
        )
        # --max-transients-per-host: the chief's stop once a host is suspected (runner/health/).
        suspicion = HostSuspicion(attempt_dir if cluster.is_chief else None)
        # --straggler-policy (runner/health/straggler_replace.py): the chief's decision on a named
        # straggler; a replace is its stop request, as a suspected host's is.
        replacement = StragglerReplacement(
            job.straggler_policy, job.straggler_cooldown, attempt_dir=attempt_dir, events=RunDir(job.run_dir).events,
            run_id=run_id) if cluster.is_chief and cluster.num_workers > 1 and job.straggler_threshold != STRAGGLER_OFF \
            else None
        self._replacement = replacement
        self._votes = StopVotes(cluster.rank, policy,
                                stop_requested=lambda: stop_requested() or suspicion.stop_requested()
                                or (replacement is not None and replacement.stop_requested()),
                                source=lambda: suspicion.source() or (replacement.source() if replacement else None),
                                save_requested=save_requested, saved=saved)
        # The memory tier (--snapshot-every, runner/state/tier.py): None when off.
        tier_off = MemoryTier.off_reason(job, cluster)
        self._tier = MemoryTier(job, cluster) if tier_off is None else None
        marker = StepMarker(AttemptDir.at(attempt_dir).step_marker(cluster.rank) if attempt_dir else None)
        # What the supervisor's hang watchdog reads besides the step: a phase that may take
        # long without a step (eval, a blocking save) gets the start-up allowance.
        self._phase = PhaseMarker(AttemptDir.at(attempt_dir).phase_marker(cluster.rank) if attempt_dir else None)
        # --record-indices (indexed recipes): every worker gathers, the chief writes.
        indices = (StepIndexLog(AttemptDir.at(attempt_dir).step_indices if attempt_dir and cluster.is_chief else None)
                   if job.record_indices and recipe.indexed else None)
        # Once, at start: the recipe file read and hashed as this process imported it (not on
        # every save, and not an edit made to the file while the run goes on).
        fingerprint = fingerprint_for_worker(job, recipe.source, params).to_dict()
        self._setup(strategy, indices, tier_off, store=store, work_dir=work_dir, fingerprint=fingerprint,
                    run_id=run_id, marker=marker, input_source=input_source, suspicion=suspicion)

    # ----------------------------------------------------------------- setup
    def _setup(self, strategy: tf.distribute.Strategy | None, indices: StepIndexLog | None, tier_off: str | None, *,
               store: CheckpointStore, work_dir: Path, fingerprint: dict[str, Any], run_id: str, marker: StepMarker,
               input_source: Callable[[int, int], Any] | None, suspicion: HostSuspicion) -> None:
        # What is loaded by now (TensorFlow, Keras, the recipe: ~350k objects) lives as long
        # as the process: frozen out of the cyclic collector's sight, a full collection no
        # longer walks it. One such collection took 0.15-0.18 s of every restart (measured
        # in the restore phase on both ranks; benchmarks/README.md).
        gc.freeze()
        # The strategy must exist before any other op (collectives are configured at start);
        # runner/training/strategy.py adds the heartbeat, registration and collective timeouts.
        self.strategy = strategy or make_strategy(self.job, self.cluster)
        startup_phases.mark("strategy")
        keras.utils.set_random_seed(self.job.seed)
        tf.config.experimental.enable_op_determinism()
        with self.strategy.scope():
            self.model = _call_recipe(self.recipe, "build_model", self.params)
            own_step = isinstance(self.model, keras.Model) and is_compiled(self.model) and has_own_step(self.model)
            if not isinstance(self.model, keras.Model) or not (self.model.built or own_step and self.model.weights):
                raise RecipeError(f"recipe {self.recipe.name}: build_model() must return a built keras.Model "
                                  "(start it with keras.Input(shape=...))")
            if own_step:  # its train_step is the step; the optimizer comes from compile()
                self.recipe = from_own_step(self.recipe, self.model)
                self._own_step = OwnStep(self.model, self.strategy, self.recipe)
                # its own optimizers, before a restore or a twin, from a batch's spec: a fit
                # script's input, or this worker's dataset of epoch 0 (built, never iterated;
                # the recipe's RNGs are reseeded before each build, runner/input/data.py)
                spec = input_source.element_spec if input_source is not None else epoch_dataset(
                    self.strategy, self.recipe, epoch=0, seed=self.job.seed, start_step=0,
                    steps_per_epoch=self.job.steps_per_epoch, global_batch_size=self.job.global_batch_size,
                    params=self.params, worker=(self.cluster.rank, self.cluster.num_workers)).element_spec
                self._own_step.build_own_optimizers(spec)
                self.stats = LastLogs()
            elif is_compiled(self.model):  # optimizer, loss and metrics come from compile()
                self.recipe = from_compiled(self.recipe, self.model)
            elif self.recipe.build_optimizer is None or self.recipe.loss is None:
                missing = [n for n in ("build_optimizer", "loss") if getattr(self.recipe, n) is None]
                raise RecipeError(
                    f"recipe {self.recipe.name}: defines no {' or '.join(missing)} and build_model() returned a "
                    "model that is not compiled; define them or call model.compile(optimizer=..., loss=...)"
                )
            if not own_step:
                self.stats = EpochStats(self.recipe.metric_states)
            optimizer = _call_recipe(self.recipe, "build_optimizer", self.params)
            optimizer.build(self.model.trainable_variables)
            counters = ckpt_layout.new_counters()
        self.counters = Counters(*(counters[name] for name in ckpt_layout.COUNTERS))
        checkpoint = ckpt_layout.training_graph(
            model=self.model, optimizer=optimizer, counters=counters, rng=ckpt_layout.rng_state(self.model),
            metrics=ckpt_layout.metric_state(self.model) if self._own_step else None)
        startup_phases.mark("model_build")
        self._health = HealthGuard(self.job.on_anomaly, emit=emit, run_id=run_id,  # --on-anomaly (runner/health/)
                                   events_path=RunDir(self.job.run_dir).events,
                                   skip=self.job.deterministic_anomaly == DETERMINISTIC_SKIP,
                                   spikes=None if self.job.loss_spike == LOSS_SPIKE_OFF else LossSpikes(
                                       float(self.job.loss_spike)),
                                   hosts=[address.rsplit(":", 1)[0] for address in self.cluster.addresses],
                                   max_transients=(None if self.job.max_transients_per_host == TRANSIENTS_OFF
                                                   else int(self.job.max_transients_per_host)),
                                   suspect=suspicion)
        self._collectives = Collectives(self.strategy, rank=self.cluster.rank, workers=self.cluster.num_workers)
        self._call = TrainCall(
            strategy=self.strategy, model=self.model, optimizer=optimizer, recipe=self.recipe,
            own_step=self._own_step, counters=(self.global_step, self.step_in_epoch),
            global_batch_size=self.job.global_batch_size, steps_per_execution=self.job.steps_per_execution,
            tier=self._tier, is_chief=self.cluster.is_chief, stop_vote=self._votes.stop,
            save_vote=self._votes.save, marker=marker,
            save_at=self._votes.policy.counts_to, indices=indices, health=self._health,
            settle=lambda: self._saving.checkpointer.flush(),
            position=lambda steps: (int(self.epoch.numpy()), int(self.step_in_epoch.numpy()) - steps),
            nan_injection=NanInjection.from_plan(self.faults), bitflip=BitFlip.from_plan(self.faults),
            replica_check_every=(None if self.job.replica_check_every == REPLICA_CHECK_OFF
                                 else int(self.job.replica_check_every)), rank=self.cluster.rank,
            sum_over_workers=self._collectives.sum, slowdown=Slowdown.from_plan(self.faults),
            stall_probe=(stall_probe.shared() if self.cluster.num_workers > 1
                         and self.job.straggler_threshold != STRAGGLER_OFF else None))  # runner/health/stall_probe.py
        self._saving = Saving(
            self.job, self.cluster, store=store, run_id=run_id, work_dir=work_dir, faults=self.faults,
            checkpoint=checkpoint, model=self.model, strategy=self.strategy,
            counters=(self.epoch, self.step_in_epoch, self.global_step), tier=self._tier, tier_off=tier_off,
            phase=self._phase, build_twin=self._build_twin, sum_over_workers=self._collectives.sum,
            gather=self._collectives.gather, concat_over_workers=self._collectives.concat, recipe=self.recipe,
            input_check=self.input_check, fingerprint=fingerprint,
            epoch_extra=self._epoch_extra, stopped_early=lambda: self._epoch_end.stopped_early, saved=self._votes.saved,
            finite_only=self._health.requires_finite_commit, before_commit=lambda step: self._call.verify_replicas(
                step, position=(int(self.epoch.numpy()), int(self.step_in_epoch.numpy()))))
        evaluator = Evaluator.for_job(self.strategy, self.model, self.recipe, self.params, self.job)
        self._callbacks = self._make_callbacks(optimizer, validates=evaluator is not None, script=input_source is not None)
        self._input = self._make_epoch_input(input_source)
        self._saving.wire(callbacks=self._callbacks, epoch_input=self._input)
        if evaluator is not None:  # its iterators are torn down by the same reaper
            evaluator.retire = self._input.retire_evaluation
        self._epoch_end = EpochEnd(
            self.job, self.cluster, run_id=run_id, counters=self.counters, saving=self._saving,
            evaluator=evaluator, callbacks=self._callbacks, own_step=self._own_step, phase=self._phase,
            faults=self.faults, agree=self._agree, gather=self._collectives.gather, record_input=self._record_next_input)
        startup_phases.mark("setup")

    @property
    def untrained_fresh_start(self) -> bool:
        """True from a fresh start (no checkpoint) until this process's first call of steps
        finished: a failure in between is the job's bug, not a fault (runner/failures/diagnose.py)."""
        return self._fresh_start and not self._call.trained

    # The checkpointed counters (runner/state/ckpt_layout.py), read by the failure report
    # (runner/failures/diagnose.py) and the worker's exit (runner/process/worker_main.py).
    @property
    def epoch(self) -> tf.Variable:
        return self.counters.epoch

    @property
    def step_in_epoch(self) -> tf.Variable:
        return self.counters.step_in_epoch

    @property
    def global_step(self) -> tf.Variable:
        return self.counters.global_step

    def _make_epoch_input(self, input_source: Callable[[int, int], Any] | None) -> EpochInput:
        """The epoch input (runner/input/reentry.py): each epoch's iterator, how a resumed
        epoch is re-entered (iterator_state may turn into skip at the first mid-epoch save,
        when the state is measured too large), what a save records of it, its retirement."""
        common = dict(rank=self.cluster.rank, workers=self.cluster.num_workers, gather=self._collectives.gather,
                      gather_bytes=self._collectives.gather_bytes, current_epoch=lambda: int(self.epoch.numpy()))
        if input_source is not None:  # a fit script's one iterator (runner/keras_recipes/fitscript.py)
            return EpochInput.for_fit_script(input_source, **common)
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

    def _make_callbacks(self, optimizer: keras.optimizers.Optimizer, *, validates: bool,
                        script: bool) -> CallbackRunner | None:
        if self.recipe.callbacks is None:
            return None
        runner = CallbackRunner.for_recipe(
            _call_recipe(self.recipe, "callbacks", self.params), self.model, optimizer, recipe_name=self.recipe.name,
            is_chief=self.cluster.is_chief, epochs=self.job.epochs, steps_per_epoch=self.job.steps_per_epoch,
            # A fit script's relative paths mean what they mean in plain Keras: the working
            # directory; a recipe's land in the run directory.
            output_dir=None if script else Path(self.job.run_dir), validates=validates)
        for log_dir in runner.tensorboard_dirs:  # a TensorBoard callback: the runner's scalars there too
            add_listener(TensorBoardLog(log_dir))
        return runner

    def _build_twin(self) -> tuple[tf.train.Checkpoint, keras.Model]:
        """A second, strategy-free copy of everything the training checkpoint holds (same keys)."""
        model = _call_recipe(self.recipe, "build_model", self.params)
        optimizer = model.optimizer if is_compiled(self.model) else _call_recipe(self.recipe, "build_optimizer", self.params)
        optimizer.build(model.trainable_variables)
        if self._own_step is not None:  # a recipe's own optimizers (a fit script's twin has them built)
            build_twin_optimizers(self.model, model)
        checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer,
                                                counters=ckpt_layout.new_counters(name_prefix="twin_"),
                                                rng=ckpt_layout.twin_rng_state(self.model, model),
                                                metrics=(ckpt_layout.twin_metric_state(self.model, model)
                                                         if self._own_step else None))
        return checkpoint, model

    # ----------------------------------------------------------------- train
    def drain_pending_checkpoint(self, timeout_s: float) -> None:
        """Before exiting on an error: let an in-flight background save commit (bounded)."""
        self._saving.drain_pending_checkpoint(timeout_s)

    def _epoch_extra(self, global_step: int) -> dict[str, Any]:
        """What the epoch adds to the save of ``global_step``: its running sums, and its
        results when the save is its epoch-end checkpoint (runner/outputs/epoch_results.py)."""
        return {**self.stats.to_extra(), **self._epoch_end.extra(global_step), **self._health.extra()}

    def _preempt(self) -> None:
        """Everyone agreed to stop after this call: save it (zero lost steps) and return."""
        self._saving.save(flush=True)  # exit 143 only after the save committed
        emit("preempted", group=True, global_step=int(self.global_step.numpy()), epoch=int(self.epoch.numpy()),
             step_in_epoch=int(self.step_in_epoch.numpy()))
        return None

    def _train_epoch(self, epoch: int, start: int, progress: Progress) -> bool:
        """Train epoch ``epoch`` from ``start`` to its end; False if preempted mid-epoch."""
        self._phase.enter(PHASE_INPUT)  # a slow phase: a big input pipeline may take a while to build
        iterator = self._input.iterator(epoch, start)
        if self.input_check.agreement_pending and self._tier is not None:
            # The chief checked the input a restore entered; with the memory tier a survivor may
            # commit its own snapshot (a rescue), so every worker records the chief's verdict.
            self.input_check.agreed(self._collectives.gather(int(self.input_check.restore_mismatched))[0] > 0)
        startup_phases.mark("input")
        ended = self._train_steps(iterator, epoch, start, progress)
        if ended and not self._votes.agreed:
            self._input.retire(iterator, epoch)
        else:
            self._input.keep(iterator)  # past the preemption save: no teardown on the way out
        del iterator
        return ended

    def _train_steps(self, iterator: Any, epoch: int, start: int, progress: Progress) -> bool:
        """Train epoch ``epoch`` from ``start`` on ``iterator``; False if preempted mid-epoch."""
        steps_per_epoch, policy = self.job.steps_per_epoch, self._votes.policy
        step_in_epoch, global_step = start, int(self.global_step.numpy())
        self._phase.enter(PHASE_TRAIN, epoch=epoch, epoch_start_step=global_step - start)
        while step_in_epoch < steps_per_epoch:
            steps = policy.call_length(global_step=global_step, step_in_epoch=step_in_epoch,
                                            steps_per_epoch=steps_per_epoch, max_steps=self._call.steps)
            if self._tier is not None:  # a call also ends at the memory tier's next snapshot
                steps = self._tier.schedule.call_length(global_step=global_step, max_steps=steps)
            steps = self._call.call_length(global_step=global_step, max_steps=steps)  # and at a replica check
            if self._callbacks:
                self._callbacks.batch_begin(step_in_epoch)
            self._saving.checkpointer.raise_if_failed()  # a background persist failed: stop with its error
            agreed = self._call.run(iterator, steps, global_step, self.stats,
                                    ends_epoch=step_in_epoch + steps == steps_per_epoch)
            step_in_epoch, global_step = step_in_epoch + steps, global_step + steps
            progress.advanced(steps, epoch=epoch, step_in_epoch=step_in_epoch, global_step=global_step,
                              means=self.stats.means(), steps_per_call=self._call.steps, host_s=agreed.host_s,
                              stall_s=agreed.stall_s, traced=agreed.traced)
            hit_step_faults(self.faults, global_step - steps + 1, global_step)
            if self._callbacks and self._batch_end_stops_early(step_in_epoch - 1):
                return True  # Keras ends the epoch here: on_epoch_end, on_train_end, final save
            if agreed.stop:
                self._votes.agreed = True
                if step_in_epoch < steps_per_epoch:
                    return False
            elif policy.save_after(global_step=global_step, step_in_epoch=step_in_epoch,
                                        steps_per_epoch=steps_per_epoch, agreed_time_flag=agreed.save):
                self._saving.save(after_call=True)
            elif self._tier is not None and step_in_epoch < steps_per_epoch and self._tier.schedule.due(global_step):
                self._saving.snapshot()  # (the epoch end saves, which snapshots too)
        return True

    def _record_next_input(self, epoch: int) -> None:
        """The chief hashes epoch ``epoch``'s first batch before the epoch-end save, so that
        checkpoint (the one a resume at this boundary restores) carries it for the resume
        check (runner/input/determinism.py). It replaces the hash :func:`epoch_dataset` would take
        on entering the epoch: one first-batch build per epoch either way.

        Not for a fit script's input (the runner does not build it), and not when a stop was
        agreed: the preemption grace period is not spent on it (that boundary then resumes
        unchecked, as before)."""
        if self._input.fit_script or self._votes.agreed or self.cluster.rank != 0:
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
            self._epoch_end.stopped_early = True
        return self._epoch_end.stopped_early

    def _agree(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is true on any (one all-reduce)."""
        agreed = self._collectives.any(flag)
        if self._callbacks:
            self.model.stop_training = agreed
        return agreed

    def _finish_epoch(self, epoch: int) -> None:
        """The epoch end (epoch_end.py ``EpochEnd.finish``) with the epoch's means; the next
        epoch's running numbers start from zero (the epoch-end checkpoint carries none)."""
        means = self.stats.means()
        self.stats = LastLogs() if self._own_step is not None else EpochStats(self.recipe.metric_states)
        self._epoch_end.finish(epoch, means)

    def run(self) -> TrainResult | None:
        """Train to the end (returns the result) or until preempted (returns None)."""
        restored = self._saving.restore_or_start()
        if restored is None:
            self._fresh_start = True
        else:
            self.stats.load_extra(restored.manifest.extra)
            self._health.load_extra(restored.manifest.extra)  # the skip list, the loss window
            self._epoch_end.report_after_restore(restored.manifest)
        if self._health.rolls_back:  # a replay after a rollback? (the chief's answer, one all-reduce)
            self._health.arm_replay(is_chief=self.cluster.is_chief, restored_step=int(self.global_step.numpy()),
                                    gather=self._collectives.gather)
        startup_phases.mark("restore")
        callback_state = None if restored is None else restored.callback_state
        if self._callbacks:
            self._callbacks.train_begin(resuming=callback_state is not None)
            if callback_state is not None:
                self._epoch_end.stopped_early = self._callbacks.restore(callback_state)
        stragglers = None if self.cluster.num_workers < 2 or self.job.straggler_threshold == STRAGGLER_OFF \
            else StragglerDetector(StragglerOptions(float(self.job.straggler_threshold), self.job.straggler_window),
                                   [address.rsplit(":", 1)[0] for address in self.cluster.addresses],
                                   self._votes.policy.clock)  # runner/health/stragglers.py
        progress = Progress(self.job.progress_every_s, self.job.steps_per_epoch, self.job.epochs,
                            self._votes.policy.clock, stragglers, self._replacement)
        while not self._epoch_end.stopped_early and (epoch := int(self.epoch.numpy())) < self.job.epochs:
            start = min(int(self.step_in_epoch.numpy()), self.job.steps_per_epoch)  # a longer epoch's checkpoint
            if self._own_step is not None and start == 0:  # Keras' fit resets the trackers every epoch
                self._own_step.reset()
            if self._callbacks and start == 0:  # not again when re-entering the epoch mid-way
                self._callbacks.epoch_begin(epoch)
            if not self._train_epoch(epoch, start, progress):
                return self._preempt()
            self._finish_epoch(epoch)
            if self._votes.agreed:  # agreed in the epoch's last call: _preempt flushes the epoch-end save
                return self._preempt()
        self._phase.enter(PHASE_FINISH)  # the final flush, then the export
        self._saving.checkpointer.flush()  # the completed checkpoint is committed before exit 0
        result = TrainResult(
            global_step=int(self.global_step.numpy()),
            epoch=int(self.epoch.numpy()),
            weights_sha256=weights_digest(self.model),
        )
        emit("training_completed", group=True, **asdict(result))  # global_step, epoch, weights_sha256
        return result


def _call_recipe(recipe: Recipe, name: str, params: dict[str, Any]) -> Any:
    """Call a recipe builder; its failure is the recipe's (fatal: a restart cannot fix it)."""
    try:
        return getattr(recipe, name)(params)
    except Exception as exc:
        raise RecipeError(f"recipe {recipe.name}: {name}() failed: {type(exc).__name__}: {exc}") from exc
