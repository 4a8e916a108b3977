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
#    skips step_in_epoch batches, so re-entering mid-epoch replays exactly the batches an
#    uninterrupted run would have seen.
# 5. Save every save_every_steps global steps, when a --save-every-seconds deadline passed
#    on the chief (the flag rides the step's all-reduce, like the stop flag), and at each
#    epoch end. async (default): the chief snapshots into its twin and a background thread
#    persists (runner/checkpointing.py); other workers write nothing. sync: all workers
#    write the tf.train.Checkpoint (variables may need collectives); only the chief's copy
#    is uploaded and committed (MANIFEST.json last), the others write to a private temp
#    dir and delete it.
# 6. Preemption: each worker's stop request (SIGTERM/SIGINT) is summed in the step's
#    all-reduce, so every worker stops after the same step, saves it (flushed) and
#    returns None (the worker exits 143).
#
# The checkpoint holds model, optimizer (iteration counter and slots), epoch,
# step_in_epoch, global_step and every RNG state the model owns (Keras SeedGenerator
# states, e.g. a seeded Dropout). The running epoch loss/metric sums travel in the
# manifest's ``extra`` so an epoch's reported loss is the same whether or not it was
# interrupted.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.cluster import ClusterInfo
from resilient_train.config import JobConfig
from resilient_train.errors import CheckpointIncompatibleError, RecipeError
from resilient_train.events import emit
from resilient_train.fingerprint import fingerprint_for_worker
from resilient_train.recipe import Recipe
from resilient_train.runner.checkpointing import (
    AsyncCheckpointer,
    SaveRequest,
    TwinState,
    commit_checkpoint,
    persist_twin,
    twin_rng_state,
)
from resilient_train.runner.batches import average_loss, per_example_loss, unpack_batch
from resilient_train.runner.data import epoch_dataset
from resilient_train.runner.determinism import InputCheck
from resilient_train.runner.faults import FaultPlan
from resilient_train.stepmarker import StepMarker

__all__ = ["Trainer", "TrainResult", "weights_digest"]

_STOP = "__stop_requested__"
_SAVE_DUE = "__save_due__"


def weights_digest(model: keras.Model) -> str:
    """SHA-256 over the model's weights, in a fixed, documented order.

    Variables are taken from ``model.weights`` (trainable and non-trainable, not the
    optimizer, not RNG state), sorted by ``variable.path``; for each one the digest is fed
    ``"<path>|<numpy dtype str>|<shape tuple>\\n"`` followed by the raw C-order bytes.
    """
    digest = hashlib.sha256()
    for variable in sorted(model.weights, key=lambda v: v.path):
        array = np.ascontiguousarray(variable.numpy())
        digest.update(f"{variable.path}|{array.dtype.str}|{tuple(array.shape)}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class TrainResult:
    global_step: int
    epoch: int
    weights_sha256: str


class _EpochStats:
    """Running sums of the per-step loss and metrics of the current epoch."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.batches = 0

    def add(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.batches += 1

    def means(self) -> dict[str, float]:
        return {key: total / self.batches for key, total in self.sums.items()} if self.batches else {}

    def to_extra(self) -> dict[str, Any]:
        return {"epoch_sums": dict(self.sums), "epoch_batches": self.batches}

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.sums = {k: float(v) for k, v in extra.get("epoch_sums", {}).items()}
        self.batches = int(extra.get("epoch_batches", 0))


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
        faults: FaultPlan | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.recipe = recipe
        self.params = params
        self.cluster = cluster
        self.store = store
        self.run_id = run_id
        self.work_dir = work_dir
        self.stop_requested = stop_requested
        self.faults = faults or FaultPlan([], rank=cluster.rank, attempt=0)
        self.clock = clock
        self.stats = _EpochStats()
        self.input_check = InputCheck(strict=job.strict_resume, recipe_name=recipe.name)  # resume check
        self._stop_noticed = False
        self._last_committed: int | None = None
        self._flush_next_save = False
        self._last_save_clock = clock()
        self._marker = StepMarker(attempt_dir / f"step-{cluster.rank}.txt") if attempt_dir else StepMarker(None)
        self._setup()

    # ----------------------------------------------------------------- setup
    def _setup(self) -> None:
        # The strategy must exist before any other op (collectives are configured at start).
        communication = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
        keras.utils.set_random_seed(self.job.seed)
        tf.config.experimental.enable_op_determinism()
        with self.strategy.scope():
            self.model = _call_recipe(self.recipe, "build_model", self.params)
            if not isinstance(self.model, keras.Model) or not self.model.built:
                raise RecipeError(
                    f"recipe {self.recipe.name}: build_model() must return a built keras.Model "
                    "(start it with keras.Input(shape=...))"
                )
            self.optimizer = _call_recipe(self.recipe, "build_optimizer", self.params)
            self.optimizer.build(self.model.trainable_variables)
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        weight_paths = {v.path for v in self.model.weights}
        rng_state = {
            re.sub(r"\W", "_", v.path): v for v in self.model.variables if v.path not in weight_paths
        }
        self.checkpoint = tf.train.Checkpoint(
            model=self.model,
            optimizer=self.optimizer,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
            global_step=self.global_step,
            rng=rng_state,
        )
        self._train_step = self._make_train_step()
        # Async mode: the chief (and every worker only if the model has sync-on-read
        # variables, whose read is a collective) keeps a twin of the saved state; see
        # runner/checkpointing.py. Non-chief workers otherwise never save in async mode.
        self._async: AsyncCheckpointer | None = None
        if self.job.checkpoint_mode == "async":
            twin = TwinState.build(self.checkpoint, self.model, self._build_twin)
            if self.cluster.is_chief or twin.sync_on_read:
                self._async = AsyncCheckpointer(twin, self._persist)

    def _build_twin(self) -> tuple[tf.train.Checkpoint, keras.Model]:
        """A second, strategy-free copy of everything ``self.checkpoint`` holds (same keys)."""
        model = _call_recipe(self.recipe, "build_model", self.params)
        optimizer = _call_recipe(self.recipe, "build_optimizer", self.params)
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=optimizer,
            epoch=tf.Variable(0, dtype=tf.int64, trainable=False, name="twin_epoch"),
            step_in_epoch=tf.Variable(0, dtype=tf.int64, trainable=False, name="twin_step_in_epoch"),
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False, name="twin_global_step"),
            rng=twin_rng_state(self.model, model, lambda path: re.sub(r"\W", "_", path)),
        )
        return checkpoint, model

    def _persist(self, request: SaveRequest) -> Manifest:
        """The background half of an async save (runs on the persist thread)."""
        assert self._async is not None  # only called by the AsyncCheckpointer
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
        )

    def _make_train_step(self):
        model, optimizer, recipe, strategy = self.model, self.optimizer, self.recipe, self.strategy
        global_batch_size = self.job.global_batch_size

        def step_fn(batch, stop_flag, save_flag):
            features, labels, sample_weight = unpack_batch(batch, recipe.name)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                per_example = per_example_loss(recipe, labels, predictions)
                loss = average_loss(per_example, sample_weight, global_batch_size)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            # Each replica adds its own worker's stop request; the SUM tells every worker
            # whether anyone was asked to stop, so all of them stop after the same step.
            # Same for the chief's time-based save decision (--save-every-seconds).
            outputs = {"loss": loss, _STOP: stop_flag, _SAVE_DUE: save_flag}
            if recipe.metrics is not None:
                for name, values in recipe.metrics(labels, predictions).items():
                    outputs[name] = tf.nn.compute_average_loss(
                        tf.cast(values, tf.float32), global_batch_size=global_batch_size
                    )
            return outputs

        @tf.function
        def train_step(iterator, stop_flag, save_flag):
            batch = next(iterator)
            per_replica = strategy.run(step_fn, args=(batch, stop_flag, save_flag))
            return {
                name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for name, value in per_replica.items()
            }

        return train_step

    def _gather(self, value: int) -> list[int]:
        """Every worker's ``value``, indexed by rank (one all-reduce)."""
        vector = np.zeros(self.cluster.num_workers, dtype=np.float64)
        vector[self.cluster.rank] = value
        summed = self.strategy.reduce(
            tf.distribute.ReduceOp.SUM,
            self.strategy.run(lambda: tf.constant(vector)),
            axis=None,
        )
        return [int(v) for v in summed.numpy()]

    # --------------------------------------------------------------- restore
    def _restore_or_start(self) -> None:
        if self.cluster.is_chief:
            self.store.collect_garbage()
        cache_dir = self.work_dir / "cache"
        found = self.store.restore_latest(cache_dir)
        mine = found[0].global_step if found else -1
        agreed = self._gather(mine)[0]
        if agreed < 0:
            emit("fresh_start", group=True, epoch=0, step_in_epoch=0, global_step=0)
            return
        if found is None or mine != agreed:
            found = self.store.fetch(agreed, cache_dir)
        manifest, local_dir = found
        try:
            self.checkpoint.read(str(local_dir / "ckpt")).assert_existing_objects_matched()
        except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as exc:
            raise CheckpointIncompatibleError(
                f"Checkpoint {self.store.url}/{CheckpointStore.dir_name(agreed)} does not fit recipe "
                f"{self.recipe.name}'s model: {_first_line(exc)}"
            ) from None
        self.stats.load_extra(manifest.extra)
        self.input_check.expect(manifest.extra, checkpoint=CheckpointStore.dir_name(agreed),
                                same_world_size=manifest.world_size == self.cluster.num_workers)
        self._last_committed = manifest.global_step
        if manifest.world_size != self.cluster.num_workers:
            emit(
                "world_size_changed",
                group=True,
                checkpoint_world_size=manifest.world_size,
                world_size=self.cluster.num_workers,
                note="resuming is sound but the input sharding differs, so weights will not be bit-identical "
                "to an uninterrupted run",
            )
        emit(
            "restored",
            group=True,
            epoch=manifest.epoch,
            step_in_epoch=manifest.step_in_epoch,
            global_step=manifest.global_step,
            checkpoint=f"{self.store.url}/{CheckpointStore.dir_name(manifest.global_step)}",
        )

    # ------------------------------------------------------------------ save
    def save(self, *, completed: bool = False) -> Manifest | None:
        """Checkpoint the current step.

        sync: all workers write; the chief uploads and commits before returning.
        async: the chief snapshots into the twin and persists in the background (returns
        None); the final save (``completed``) and a preemption save wait for their commit
        (flush) and return the manifest. Non-chief workers do nothing in async mode.
        """
        global_step = int(self.global_step.numpy())
        flush = completed or self._flush_next_save
        self._last_save_clock = self.clock()
        if self.job.checkpoint_mode == "async":
            if global_step != self._last_committed:
                self._last_committed = global_step
                if self._async is not None:
                    self._async.save(self._save_request(completed), persist=self.cluster.is_chief)
            if flush and self._async is not None:
                return self._async.flush()
            return None
        if global_step == self._last_committed:
            return None  # e.g. preempted right after a restore or an epoch-end save
        if self.cluster.is_chief:
            local_dir = self.work_dir / "staging" / CheckpointStore.dir_name(global_step)
            shutil.rmtree(local_dir, ignore_errors=True)
            local_dir.mkdir(parents=True)
        else:
            local_dir = Path(tempfile.mkdtemp(prefix=f"rt-rank{self.cluster.rank}-"))
        try:
            self.checkpoint.write(str(local_dir / "ckpt"))
            self._last_committed = global_step
            if not self.cluster.is_chief:
                return None
            return commit_checkpoint(
                self.store,
                local_dir,
                self._save_request(completed),
                run_id=self.run_id,
                world_size=self.cluster.num_workers,
                weights_sha256=weights_digest(self.model),
                faults=self.faults,
                keep=self.job.keep,
            )
        finally:
            shutil.rmtree(local_dir, ignore_errors=True)

    def _save_request(self, completed: bool) -> SaveRequest:
        return SaveRequest(
            global_step=int(self.global_step.numpy()),
            epoch=int(self.epoch.numpy()),
            step_in_epoch=int(self.step_in_epoch.numpy()),
            extra={
                **self.stats.to_extra(),
                "completed": completed,
                "epochs": self.job.epochs,
                "steps_per_epoch": self.job.steps_per_epoch,
                "recipe": self.recipe.name,
                "fingerprint": fingerprint_for_worker(self.job, self.recipe.source, self.params).to_dict(),
                **self.input_check.to_extra(int(self.epoch.numpy())),
            },
        )

    # ----------------------------------------------------------------- train
    def drain_pending_checkpoint(self, timeout_s: float) -> None:
        """Before exiting on an error: let an in-flight background save commit (bounded)."""
        if self._async is not None:
            self._async.drain(timeout_s)

    def _local_stop_flag(self) -> float:
        if self.stop_requested():
            if not self._stop_noticed:
                self._stop_noticed = True
                emit("preemption_requested", source=f"worker:{self.cluster.rank}")  # SIGTERM or SIGINT
            return 1.0
        return 0.0

    def _local_save_due(self) -> float:
        """1.0 when the chief's clock says a time-based save is due (others always 0.0)."""
        every = self.job.save_every_seconds
        if every is None or not self.cluster.is_chief:
            return 0.0
        return 1.0 if self.clock() - self._last_save_clock >= every else 0.0

    def _preempt(self, global_step: int) -> None:
        """Everyone agreed to stop after ``global_step``: save it (zero lost steps) and return."""
        self.save()
        emit("preempted", group=True, global_step=global_step, epoch=int(self.epoch.numpy()),
             step_in_epoch=int(self.step_in_epoch.numpy()))
        return None

    def run(self) -> TrainResult | None:
        """Train to the end (returns the result) or until preempted (returns None)."""
        self._restore_or_start()
        job = self.job
        stop = False
        steps_per_epoch, save_every = job.steps_per_epoch, job.save_every_steps
        last_progress = self.clock()
        steps_since, time_since = 0, self.clock()
        first_step_pending = True
        while int(self.epoch.numpy()) < job.epochs:
            epoch, start = int(self.epoch.numpy()), int(self.step_in_epoch.numpy())
            if start >= steps_per_epoch:  # checkpoint from a run with a longer epoch
                start = steps_per_epoch
            iterator = iter(
                epoch_dataset(
                    self.strategy,
                    self.recipe,
                    epoch=epoch,
                    seed=job.seed,
                    start_step=start,
                    steps_per_epoch=steps_per_epoch,
                    global_batch_size=job.global_batch_size,
                    params=self.params,
                    input_check=self.input_check,
                )
            )
            for step in range(start, steps_per_epoch):
                if self._async is not None:
                    self._async.raise_if_failed()  # a background persist failed: stop with its error
                outputs = self._train_step(
                    iterator,
                    tf.constant(self._local_stop_flag(), tf.float32),
                    tf.constant(self._local_save_due(), tf.float32),
                )
                stop = float(outputs.pop(_STOP)) > 0
                save_due = float(outputs.pop(_SAVE_DUE)) > 0
                self.stats.add({name: float(value) for name, value in outputs.items()})
                self.step_in_epoch.assign_add(1)
                self.global_step.assign_add(1)
                steps_since += 1
                global_step = int(self.global_step.numpy())
                self._marker.write(global_step)
                if first_step_pending:  # the recovery benchmark's "training again" moment
                    first_step_pending = False
                    emit("first_step", group=True, global_step=global_step)
                self.faults.hit("raise", global_step)
                self.faults.hit("after_step", global_step)
                if stop and step + 1 < steps_per_epoch:
                    self._flush_next_save = True  # exit 143 only after the save committed
                    return self._preempt(global_step)
                now = self.clock()
                if now - last_progress >= job.progress_every_s:
                    emit(
                        "train_progress",
                        group=True,
                        epoch=epoch,
                        step_in_epoch=step + 1,
                        steps_per_epoch=steps_per_epoch,
                        global_step=global_step,
                        steps_per_s=round(steps_since / max(now - time_since, 1e-9), 2),
                        **{k: round(v, 6) for k, v in self.stats.means().items()},
                    )
                    last_progress, steps_since, time_since = now, 0, now
                step_due = bool(save_every) and global_step % save_every == 0
                if step + 1 < steps_per_epoch and (step_due or save_due):
                    self.save()
            means = self.stats.means()
            emit(
                "epoch_finished",
                group=True,
                epoch=epoch,
                global_step=int(self.global_step.numpy()),
                loss=means.pop("loss", None),
                metrics=means,
            )
            self.epoch.assign_add(1)
            self.step_in_epoch.assign(0)
            self.stats = _EpochStats()
            self.save(completed=int(self.epoch.numpy()) >= job.epochs)
            if stop:
                self._flush_next_save = True
                return self._preempt(int(self.global_step.numpy()))
        if self._async is not None:
            self._async.flush()  # the completed checkpoint is committed before exit 0
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


def _call_recipe(recipe: Recipe, name: str, params: dict[str, Any]) -> Any:
    """Call a recipe builder; its failure is the recipe's (fatal: a restart cannot fix it)."""
    try:
        return getattr(recipe, name)(params)
    except Exception as exc:
        raise RecipeError(f"recipe {recipe.name}: {name}() failed: {type(exc).__name__}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
