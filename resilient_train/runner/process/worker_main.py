"""Worker process wiring: config, TF_CONFIG, events, error file, exit code.

Two entries, one body: :func:`run` takes a job the CLI parsed (``resilient-train worker``),
:func:`main` parses its own argv first (``python -m resilient_train.runner``, a warm
standby) with the same argument helpers, then calls :func:`run`. Everything runs inside
``rundir.errorfile.recording``, the one error path: an exception that ends the worker is
written to ``attempt-<n>/error-<rank>.json`` and becomes the exit code of
``errors.EXIT_RULES`` (exit codes: errors.py).

The start-up a parameter-server process shares (credentials, umask, attempt dir, TMPDIR,
error file, stack dumps, events, SIGTERM/SIGINT) is runner/process/bootstrap.py ``worker_process``;
what is a worker's own (TF_CONFIG, reaching the peers, the recipe, the store, the Trainer)
is here. A worker leaves by ``bootstrap.exit_process``.

Kept separate from ``loop.py`` so that everything up to the TensorFlow import (argument
and TF_CONFIG validation, recipe shape) fails fast with a readable message.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping

from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.slurm_env import DEFAULT_PORT_BASE, add_tf_config_arguments, environ_with_tf_config
from resilient_train.cluster.reach import REACH_SHARE, PortPlaceholder, wait_for_peers, wait_for_server
from resilient_train.cluster.tf_config import ClusterInfo, parse_tf_config
from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig, add_job_arguments, job_from_args
from resilient_train.rundir import events
from resilient_train.rundir.errorfile import Recording, recording
from resilient_train.runner.process.bootstrap import WorkerProcess, worker_process
from resilient_train.runner.process import startup_phases
from resilient_train.runner.outputs.script_output import EVENT as SCRIPT_OUTPUT, tee_stdout

__all__ = ["main", "run", "argument_parser", "parse_args"]

PREFIX = "resilient-train worker"  # of every line the worker's error path prints

# A failing chief lets an in-flight background checkpoint commit for this long (the
# supervisor gives a failing group 3 s before SIGKILL).
_DRAIN_ON_ERROR_S = 2.5


def argument_parser() -> argparse.ArgumentParser:
    """The runner's own command line: ``--job job.json`` or the flags of ``resilient-train run``."""
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner", allow_abbrev=False)
    parser.add_argument("--job", help="job file written by the supervisor (job.json)")
    parser.add_argument("recipe", nargs="?", metavar="RECIPE")
    add_job_arguments(parser)
    add_tf_config_arguments(parser)
    return parser


def parse_args(argv: list[str]) -> tuple[JobConfig, argparse.Namespace]:
    """``argv`` parsed by :func:`argument_parser`: the job (from ``--job``, else from the flags) and the arguments."""
    args = argument_parser().parse_args(argv)
    if args.job:
        with open(args.job) as handle:
            return JobConfig.from_json(handle.read()), args
    return job_from_args(args), args


def main(argv: list[str], *, environ: Mapping[str, str] = os.environ) -> int:
    """``python -m resilient_train.runner ARGV``: parse, then :func:`run`; the exit code."""
    startup_phases.main_entered()
    with recording(PREFIX) as parsing:  # a bad flag or job file: one line, EXIT_USAGE
        job, args = parse_args(argv)
        parsing.exit_code = run(job, tf_config_from=args.tf_config_from, port_base=args.port_base, environ=environ)
    return parsing.exit_code


def run(
    job: JobConfig,
    *,
    tf_config_from: str = "env",
    port_base: int = DEFAULT_PORT_BASE,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """Be one worker of ``job`` (TF_CONFIG from ``tf_config_from``); the exit code (errors.py)."""
    with recording(PREFIX) as state:
        state.exit_code = _work(state, job, tf_config_from, port_base, environ)
    return state.exit_code


def _work(state: Recording, job: JobConfig, tf_config_from: str, port_base: int, environ: Mapping[str, str]) -> int:
    environ = environ_with_tf_config(environ, tf_config_from, port_base)
    if tf_config_from != "env":  # MultiWorkerMirroredStrategy reads os.environ
        os.environ["TF_CONFIG"] = environ["TF_CONFIG"]
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    # The shared start-up (runner/process/bootstrap.py): credentials, umask, attempt dir, TMPDIR, error
    # file, stack dumps, events, SIGTERM/SIGINT; its until_exit (the chief's stdout tee) is
    # closed, its last line emitted, before an exception is recorded and before exit_process.
    with worker_process(state, job, rank=cluster.rank, role=cluster.role, writes_group_events=cluster.is_chief,
                        environ=environ, watch_notices=True) as process:
        startup_phases.mark("bootstrap")
        worker = _Worker(process, cluster, process.job)
        state.global_step, state.diagnose, state.on_failure = worker.global_step, worker.diagnose, worker.drain
        if cluster.is_chief:  # its prints on the supervisor's console too, once (runner/outputs/script_output.py)
            process.until_exit.enter_context(tee_stdout(lambda line: events.emit(SCRIPT_OUTPUT, echo=False, text=line)))
        return worker.run(environ)


class _Worker:
    """One worker's training, once the process is started: the recipe (or fit script), the
    store, the Trainer it makes and runs, and what the error path reads of them."""

    def __init__(self, process: WorkerProcess, cluster: ClusterInfo, job: JobConfig) -> None:
        self.process = process
        self.cluster = cluster
        self.job = job  # with the recipe's defaults once it is loaded (diagnose reads steps_per_epoch)
        self.trainer: Any = None
        self.store: Any = None
        self.faults: Any = None

    # ------------------------------------------------------------ the error path (rundir/errorfile.py)
    def global_step(self) -> int | None:
        return None if self.trainer is None else int(self.trainer.global_step.numpy())

    def diagnose(self, exc: Exception) -> Exception | None:
        from resilient_train.job.recipe import is_fit_script, recipe_name
        from resilient_train.runner.failures.diagnose import explain, group_broken

        broken = group_broken(exc)  # a peer's failure seen from here: exit 4, never a recipe bug
        if broken is not None:
            return broken
        job = self.job
        label = f"Script {job.recipe}" if is_fit_script(job.recipe) else None
        return explain(exc, recipe_name=recipe_name(job.recipe), trainer=self.trainer,
                       steps_per_epoch=job.steps_per_epoch, job_label=label)

    def drain(self) -> None:
        if self.trainer is not None:
            self.trainer.drain_pending_checkpoint(_DRAIN_ON_ERROR_S)
        if self.job.memory_tier:
            # A peer died: this worker's own collective failed ~8 s later, maybe while its
            # rescue commits on the listener thread. Never race it (bounded by the rescue's deadline).
            from resilient_train.rundir.rescue_signal import RESCUE_ARRIVAL_S, listener, rescue_deadline_s

            listener().before_exit(arrival_s=RESCUE_ARRIVAL_S, finish_s=rescue_deadline_s(self.job.storage_timeout))

    # ------------------------------------------------------------ the run
    def run(self, environ: Mapping[str, str]) -> int:
        """Reach the peers, load the recipe, open the store, train; the exit code."""
        cluster, process = self.cluster, self.process
        # Before anything slow: every peer's TF_CONFIG address must answer within half the
        # start-up timeout (cluster/reach.py), so a worker that cannot reach the chief says so,
        # naming both, before the supervisor's start-up allowance runs out.
        from resilient_train.runner.failures.faults import FaultPlan

        self.faults = FaultPlan.from_env(environ, rank=cluster.rank, attempt=process.launched.attempt)
        placeholder = _reach_peers(cluster, self.job.startup_timeout, unreachable=self.faults.take("before_join", 0))
        startup_phases.mark("reach_peers")

        from resilient_train.job.recipe import is_fit_script

        fit_script = is_fit_script(self.job.recipe)  # a model.fit script runs whole (runner/keras_recipes/fitscript.py)
        if not fit_script:
            recipe, params = self._load_recipe()
        self.store = self._open_store()

        import resilient_train.runner.training.loop  # noqa: F401 (TensorFlow is imported here, after the store)

        startup_phases.mark("recipe_store")

        if cluster.is_chief:  # the chief's TensorBoard log follows the event stream
            from resilient_train.runner.outputs.tensorboard import TensorBoardLog

            events.add_listener(TensorBoardLog(process.run_dir.tensorboard))
        if fit_script:
            from resilient_train.runner.keras_recipes.fitscript import FitScript

            script = FitScript(self.job, cluster, before_strategy=lambda: _before_strategy(cluster, placeholder, self.job),
                               make_trainer=self._make_script_trainer, run_trainer=self._run_trainer)
            result = script.run()  # the script's code after fit() has run when this returns
        else:
            _before_strategy(cluster, placeholder, self.job)
            result = self._run_trainer(self._make_trainer(self.job, recipe, params))
        process.ignore_stop_signals()
        if result is None and process.notices is not None:  # preempted: a notice's time to the save
            process.notices.saved(self.global_step())
        if result is not None and cluster.is_chief:
            from resilient_train.runner.outputs.model_export import export_completed

            export_completed(self.trainer, result, process.run_dir.model)
        return EXIT_PREEMPTED if result is None else EXIT_OK

    def _load_recipe(self) -> tuple[Any, dict[str, Any]]:
        """The recipe and its parameters; ``self.job`` takes the recipe's defaults."""
        from resilient_train.job.fingerprint import fingerprint_for_worker
        from resilient_train.job.recipe import load_recipe, resolve_params

        recipe = load_recipe(self.job.recipe)
        self.job = self.job.with_recipe_defaults(recipe.defaults)
        params = resolve_params(recipe.params, self.job.params)
        fingerprint_for_worker(self.job, recipe.source, params)  # hashes the source as imported (cached)
        return recipe, params

    def _open_store(self) -> Any:
        from resilient_train.checkpoint import CheckpointStore, RetryPolicy

        job, launched = self.job, self.process.launched
        # The host cache (checkpoint/cache.py): the chief's commits are written through to
        # this host's disk, and every rank restores from there before shared storage.
        # An ``other_host`` fault (runner/failures/faults.py): this rank has no host cache, as on a
        # host that never held this run (a replaced node, a rank placed on another host).
        other_host = self.faults is not None and self.faults.take("other_host", 0)
        store = CheckpointStore(job.storage, job.storage_options,
                                host_cache=None if other_host else self.process.run_dir.host_cache,
                                retry=RetryPolicy(stall_timeout_s=job.storage_timeout))
        if self.cluster.is_chief:  # the only writer: fence its commits by this attempt's generation
            store.claim_generation(launched.generation, run_id=launched.run_id, attempt=launched.attempt)
        elif job.memory_tier or job.sharded_save != "off":  # it may commit a rescue, or upload its share
            store.adopt_generation(launched.generation, run_id=launched.run_id, attempt=launched.attempt)
        return store

    def _make_trainer(self, job: JobConfig, recipe: Any, params: dict[str, Any], **seams: Any) -> Any:
        from resilient_train.runner.training.loop import Trainer

        process = self.process
        self.trainer = Trainer(
            job,
            recipe,
            params,
            self.cluster,
            store=self.store,
            run_id=process.launched.run_id,
            work_dir=process.run_dir.work_dir(self.cluster.rank),
            attempt_dir=process.attempt_dir.path,
            stop_requested=process.stop.is_set,
            save_requested=process.notices.save_requested if process.notices is not None else lambda: False,
            saved=process.notices.group_saved if process.notices is not None else lambda: None,
            faults=self.faults,
            **seams,
        )
        return self.trainer

    def _make_script_trainer(self, job: JobConfig, recipe: Any, strategy: Any, input_source: Any) -> Any:
        return self._make_trainer(job, recipe, {}, strategy=strategy, input_source=input_source)

    def _run_trainer(self, trainer: Any) -> Any:
        # The multi-worker coordination service installs its own C++ SIGTERM handler
        # (TF's preemption notifier) when the strategy starts, replacing ours: take it back.
        self.process.watch_stop_signals()
        return trainer.run()


def _before_strategy(cluster: ClusterInfo, placeholder: PortPlaceholder, job: JobConfig) -> None:
    """Right before the strategy: a non-chief waits until the chief's TensorFlow server answers
    (registering earlier costs gRPC's 1 s reconnect backoff, cluster/reach.py), then every
    worker releases its port, which its own server binds next. The placeholder stays open
    through the wait: the chief may still be probing this port (reach_peers)."""
    if not cluster.is_chief and cluster.addresses:
        wait_for_server(cluster.addresses[0], REACH_SHARE * job.startup_timeout)  # bounded; registration follows
        startup_phases.mark("chief_server")
    placeholder.close()


def _reach_peers(cluster: ClusterInfo, startup_timeout: float, *, unreachable: bool = False) -> PortPlaceholder:
    """Hold this worker's port and wait until every peer's answers; the placeholder to close.

    ``unreachable`` (a chaos ``before_join`` fault, runner/failures/faults.py): probe a closed port on
    127.0.0.1 in place of each peer's address, so this rank cannot reach anyone.
    """
    if cluster.num_workers < 2 or not cluster.addresses:
        return PortPlaceholder(None)
    addresses = list(cluster.addresses)
    if unreachable:
        closed = iter(free_ports(len(addresses)))  # bound, then released: nothing listens there
        addresses = [a if r == cluster.rank else f"127.0.0.1:{next(closed)}" for r, a in enumerate(addresses)]
    placeholder = PortPlaceholder(cluster.addresses[cluster.rank])
    try:
        wait_for_peers(addresses, cluster.rank, REACH_SHARE * startup_timeout)
    except BaseException:
        placeholder.close()
        raise
    return placeholder
