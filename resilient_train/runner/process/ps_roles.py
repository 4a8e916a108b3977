"""The parameter-server tier's processes: coordinator, parameter servers, workers.

``python -m resilient_train.runner.process.ps_roles --job FILE`` with a parameter-server TF_CONFIG
(cluster/ps_cluster.py). What the process does follows from its task:

* ``ps`` and ``worker``: start ``tf.distribute.Server`` for the task and serve until
  SIGTERM (TensorFlow's pattern, ``Server.join()``; join runs on a daemon thread so the
  main thread can take SIGTERM and exit 0: a server holds no state worth saving, and the
  supervisor stops them exactly when the coordinator is done with them).
* ``chief``: the coordinator. It builds the recipe's model and optimizer under
  ``ParameterServerStrategy`` (their variables live on the ps), restores the last committed
  checkpoint, and schedules one closure per training step on whichever worker is free
  (``ClusterCoordinator.schedule``). It is the only writer of checkpoints, and the only
  rank that writes step and phase markers (rundir/stepmarker.py): the supervisor's hang
  watchdog watches it alone (supervisor/ps_supervisor.py).

Every one of them starts as an MWMS worker does (runner/process/bootstrap.py ``worker_process``:
credentials, umask, attempt dir, TMPDIR, error file, stack dumps, events, SIGTERM).

What this tier guarantees (docs/parameter_server.md says it for users):

* ``global_step`` counts steps the coordinator scheduled and saw finish. A save first
  ``join()``s, so every scheduled closure has finished, and then reads the variables from
  the ps: a checkpoint is a consistent snapshot at exactly ``global_step`` closures. A
  closure that TensorFlow re-runs after its worker died is still one step. The Keras 3
  optimizer's ``iterations`` is NOT that count: workers update it concurrently with a
  read-modify-write and lose increments (measured: 140 of 200), so it is saved as it is
  and never used as the step.
* ``updates_applied`` (a ps variable incremented with an atomic ``assign_add`` inside each
  closure) counts closure executions, re-runs included; each manifest records it, so the
  at-least-once surplus is visible (``updates_applied - global_step`` since the restore).
* Updates are asynchronous (workers apply gradients to shared variables without a
  barrier), so a run is not bit-identical to another one, resumed or not.

The checkpoint has the MultiWorkerMirroredStrategy runner's object graph (model, optimizer,
epoch, step_in_epoch, global_step, rng; runner/state/ckpt_layout.py builds both) and goes
through the same store, manifest and generation fence, so ``verify`` (also ``--deep``),
``ls`` and ``export`` read it unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.cluster.ps_cluster import PsTask, parse_ps_tf_config
from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import SNAPSHOT_EVERY_AUTO, SNAPSHOT_EVERY_OFF, JobConfig
from resilient_train.rundir import events
from resilient_train.rundir.errorfile import recording
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stepmarker import PHASE_FINISH, PHASE_FLUSH, PHASE_INPUT, PHASE_TRAIN, PhaseMarker
from resilient_train.runner.process.bootstrap import exit_process, worker_process

__all__ = ["main"]

PREFIX = "resilient-train ps"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner.process.ps_roles", allow_abbrev=False)
    parser.add_argument("--job", required=True, help="job file written by the supervisor (job.json)")
    with recording(PREFIX) as state:
        args = parser.parse_args(argv)
        job = JobConfig.from_json(Path(args.job).read_text())
        task, cluster = parse_ps_tf_config(os.environ.get("TF_CONFIG"))
        # The start-up an MWMS worker shares (runner/process/bootstrap.py); SIGUSR1's stack dumps too:
        # the hang watchdog asks the coordinator for them (and must not kill a server).
        with worker_process(state, job, rank=task.rank, role=task.role, writes_group_events=task.role == "chief",
                            environ=os.environ) as process:
            if task.role == "chief":
                coordinator = Coordinator(process.job, process.launched, process.run_dir,
                                          stop_requested=process.stop.is_set)
                state.global_step = lambda: coordinator.global_step
                state.exit_code = coordinator.run()
            else:
                _serve(task, cluster, process.stop)
    return state.exit_code


def _serve(task: PsTask, cluster: dict, stop: threading.Event) -> NoReturn:
    import tensorflow as tf

    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task.role, task_index=task.index,
                                  protocol="grpc", start=True)
    events.emit("server_started", address=server.target)
    threading.Thread(target=server.join, name="server-join", daemon=True).start()
    while not stop.wait(0.5):
        pass
    # Asked to stop: nothing to save here, the coordinator owns all state. Exit now: the
    # interpreter's teardown of a running server takes seconds (measured 2-4 s), which
    # would outlast the supervisor's teardown grace and turn a clean stop into a SIGKILL.
    events.emit("server_stopped")
    exit_process(EXIT_OK)


class Coordinator:
    """The chief's training loop: schedule closures, save at agreed steps, restore on start."""

    def __init__(self, job: JobConfig, launched: WorkerEnvironment, run_dir: RunDir, *, stop_requested) -> None:
        from resilient_train.checkpoint import CheckpointStore, RetryPolicy
        from resilient_train.job.recipe import load_recipe, resolve_params

        self.recipe = load_recipe(job.recipe)
        self.job = job.with_recipe_defaults(self.recipe.defaults)
        self.params = resolve_params(self.recipe.params, self.job.params)
        self.launched = launched
        self.run_dir = run_dir
        self.attempt_dir = run_dir.attempt(launched.attempt)
        self.stop_requested = stop_requested
        self.store = CheckpointStore(self.job.storage, self.job.storage_options,
                                     retry=RetryPolicy(stall_timeout_s=self.job.storage_timeout))
        self.store.claim_generation(launched.generation, run_id=launched.run_id, attempt=launched.attempt)
        self.global_step = 0
        self.phase = PhaseMarker(self.attempt_dir.phase_marker(0))

    # ------------------------------------------------------------------ setup
    def _build(self) -> None:
        import tensorflow as tf

        from resilient_train.runner.state import ckpt_layout

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        with self.strategy.scope():  # variables on the ps; the optimizer must be built in scope too
            self.model = self.recipe.build_model(dict(self.params))
            self.optimizer = self.recipe.build_optimizer(dict(self.params))
            self.optimizer.build(self.model.trainable_variables)
            self.updates_applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates_applied")
        # The counters live on the coordinator: only it advances them (see the module docstring).
        self.counters = ckpt_layout.new_counters()
        self.checkpoint = ckpt_layout.training_graph(model=self.model, optimizer=self.optimizer,
                                                     counters=self.counters, rng=ckpt_layout.rng_state(self.model))
        self._train_step = self._make_train_step()

    def _make_train_step(self) -> Any:
        import tensorflow as tf

        model, optimizer, loss_fn, applied = self.model, self.optimizer, self.recipe.loss, self.updates_applied

        @tf.function
        def train_step(iterator: Any) -> Any:
            def replica_fn(features: Any, labels: Any) -> Any:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(loss_fn(labels, model(features, training=True)))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                applied.assign_add(1)
                return loss

            features, labels = next(iterator)
            return self.strategy.run(replica_fn, args=(features, labels))

        return train_step

    def _iterator(self, epoch: int) -> Any:
        from resilient_train.runner.input.data import RecipeInputContext
        from resilient_train.runner.input.determinism import seed_input_rng

        recipe, params, seed, batch = self.recipe, dict(self.params), self.job.seed, self.job.global_batch_size

        def dataset_fn(input_context: Any) -> Any:
            seed_input_rng(seed, epoch)
            return recipe.dataset(RecipeInputContext(input_context, batch, params), epoch, seed).repeat()

        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: self.strategy.distribute_datasets_from_function(dataset_fn))
        return iter(per_worker)

    # ------------------------------------------------------------------ checkpoints
    def _restore(self) -> None:
        from resilient_train.checkpoint import CheckpointStore
        from resilient_train.runner.state import ckpt_layout

        self.store.collect_garbage()
        found = self.store.restore_latest(self.run_dir.work_dir(0) / "cache")
        if found is None:
            events.emit("fresh_start", group=True, epoch=0, step_in_epoch=0, global_step=0)
            return
        manifest, local_dir = found
        with self.strategy.scope():
            ckpt_layout.restore(self.checkpoint, local_dir / "ckpt", recipe_name=self.recipe.name,
                                where=f"Checkpoint {self.store.url}/{CheckpointStore.dir_name(manifest.global_step)}")
        self.updates_applied.assign(int(manifest.extra.get("updates_applied", manifest.global_step)))
        self.global_step = int(self.counters["global_step"].numpy())
        events.emit("restored", group=True, epoch=manifest.epoch, step_in_epoch=manifest.step_in_epoch,
                    global_step=manifest.global_step,
                    checkpoint=f"{self.store.url}/{CheckpointStore.dir_name(manifest.global_step)}",
                    updates_applied=manifest.extra.get("updates_applied"))

    def _save(self, *, completed: bool) -> None:
        self.coordinator.join()  # every scheduled closure finished: the ps hold exactly global_step steps
        # The join above is training (the closures run there; the watchdog's hang timeout
        # applies); writing and committing is a save, a slow phase with the start-up allowance.
        previous = self.phase.enter(PHASE_FINISH if completed else PHASE_FLUSH)
        try:
            self._write_and_commit(completed=completed)
        finally:
            if not completed:
                self.phase.restore(previous)

    def _write_and_commit(self, *, completed: bool) -> None:
        import tempfile

        from resilient_train.runner.state.checkpointing import SaveRequest, commit_checkpoint
        from resilient_train.runner.failures.faults import FaultPlan
        from resilient_train.runner.state.model_state import weights_digest

        self.counters["global_step"].assign(self.global_step)
        request = SaveRequest(
            files={}, global_step=self.global_step, epoch=int(self.counters["epoch"].numpy()),
            step_in_epoch=int(self.counters["step_in_epoch"].numpy()),
            extra={"completed": completed, "epochs": self.job.epochs, "steps_per_epoch": self.job.steps_per_epoch,
                   "recipe": self.recipe.name, "recipe_source": str(Path(self.recipe.source).resolve()),
                   "strategy": "parameter-server", "updates_applied": int(self.updates_applied.numpy()),
                   "optimizer_iterations": int(self.optimizer.iterations.numpy())},
        )
        with tempfile.TemporaryDirectory(prefix="rt-ps-save-") as staging:
            self.checkpoint.write(str(Path(staging) / "ckpt"))
            commit_checkpoint(self.store, Path(staging), request, run_id=self.launched.run_id,
                              world_size=self.job.workers, weights_sha256=weights_digest(self.model),
                              faults=FaultPlan.from_env(os.environ, rank=0, attempt=self.launched.attempt),
                              keep=self.job.keep, emit=events.emit)

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        from resilient_train.runner.failures.faults import FaultPlan
        from resilient_train.rundir.stepmarker import StepMarker

        self._build()
        if self.job.memory_tier_off_reason is not None and self.job.snapshot_every == SNAPSHOT_EVERY_AUTO:
            # auto resolved to off (no worker holds the whole state): said once, as the mirrored loop does
            events.emit("memory_tier", setting=SNAPSHOT_EVERY_AUTO, every_steps=SNAPSHOT_EVERY_OFF,
                        reason=self.job.memory_tier_off_reason, rank=0)
        self._restore()
        marker = StepMarker(self.attempt_dir.step_marker(0))
        faults = FaultPlan.from_env(os.environ, rank=0, attempt=self.launched.attempt)
        epochs, steps, every = self.job.epochs, self.job.steps_per_epoch, self.job.save_every_steps
        epoch, in_epoch = int(self.counters["epoch"].numpy()), int(self.counters["step_in_epoch"].numpy())
        if epoch >= epochs:  # a completed checkpoint: commit it again as completed and stop
            self._save(completed=True)
            return EXIT_OK
        while epoch < epochs:
            self.counters["epoch"].assign(epoch)
            self.phase.enter(PHASE_INPUT)  # building each worker's input pipeline
            iterator = self._iterator(epoch)
            self.phase.enter(PHASE_TRAIN, epoch=epoch, epoch_start_step=self.global_step - in_epoch)
            while in_epoch < steps:
                if self.stop_requested():
                    self._save(completed=False)
                    events.emit("preempted", group=True, global_step=self.global_step)
                    return EXIT_PREEMPTED
                self.coordinator.schedule(self._train_step, args=(iterator,))
                in_epoch += 1
                self.global_step += 1
                self.counters["step_in_epoch"].assign(in_epoch)
                marker.write(self.global_step)  # scheduled: an upper bound on steps done
                faults.hit("after_step", self.global_step)
                if every and self.global_step % every == 0 and in_epoch < steps:
                    self._save(completed=False)
            epoch, in_epoch = epoch + 1, 0
            self.coordinator.join()
            self.counters["epoch"].assign(epoch)
            self.counters["step_in_epoch"].assign(0)
            events.emit("epoch_finished", group=True, epoch=epoch - 1, global_step=self.global_step)
            self._save(completed=epoch >= epochs)
        return EXIT_OK


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
