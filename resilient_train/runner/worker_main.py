"""Worker process wiring: config, TF_CONFIG, events, error file, exit code.

Two entries, one body: :func:`run` takes a job the CLI parsed (``resilient-train worker``),
:func:`main` parses its own argv first (``python -m resilient_train.runner``, a warm
standby) with the same argument helpers, then calls :func:`run`. Everything runs inside
``rundir.errorfile.recording``, the one error path: an exception that ends the worker is
written to ``attempt-<n>/error-<rank>.json`` and becomes the exit code of
``errors.EXIT_RULES`` (exit codes: errors.py).

Kept separate from ``loop.py`` so that everything up to the TensorFlow import (argument
and TF_CONFIG validation, recipe shape) fails fast with a readable message.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from typing import Any, Mapping

from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.slurm_env import DEFAULT_PORT_BASE, add_tf_config_arguments, environ_with_tf_config
from resilient_train.cluster.reach import REACH_SHARE, PortPlaceholder, wait_for_peers
from resilient_train.cluster.tf_config import ClusterInfo, parse_tf_config
from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig, add_job_arguments, job_from_args
from resilient_train.rundir import events
from resilient_train.rundir.errorfile import Recording, recording
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stacks import register as register_stacks
from resilient_train.rundir.permissions import current_umask
from resilient_train.rundir.redact import register_secrets, secret_values
from resilient_train.rundir.scratch import remove_private_tempdir, use_private_tempdir
from resilient_train.runner.outputs.script_output import EVENT as SCRIPT_OUTPUT, tee_stdout

__all__ = ["main", "run", "argument_parser", "parse_args", "exit_process"]

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
    # ExitStack inside recording: what _work enters (the chief's stdout tee) is closed, its
    # last line emitted, before an exception is recorded and before exit_process's os._exit.
    with recording(PREFIX) as state, contextlib.ExitStack() as until_exit:
        state.exit_code = _work(state, until_exit, job, tf_config_from, port_base, environ)
    return state.exit_code


def _work(state: Recording, until_exit: contextlib.ExitStack, job: JobConfig, tf_config_from: str, port_base: int,
          environ: Mapping[str, str]) -> int:
    environ = environ_with_tf_config(environ, tf_config_from, port_base)
    if tf_config_from != "env":  # MultiWorkerMirroredStrategy reads os.environ
        os.environ["TF_CONFIG"] = environ["TF_CONFIG"]
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    launched = WorkerEnvironment.from_environ(environ)
    # job.json holds *** for credentials; the real ones came in RT_STORAGE_SECRETS.
    job = job.with_secrets(launched.storage_secrets)
    register_secrets(secret_values(job.secrets()))
    if launched.umask is not None:  # the run dir's privacy, also on a node that did not inherit it
        os.umask(current_umask() | launched.umask)
    run_dir = RunDir(job.run_dir)
    attempt_dir = run_dir.attempt(launched.attempt)
    attempt_dir.path.mkdir(parents=True, exist_ok=True)
    use_private_tempdir(run_dir.temp_dir(cluster.rank))  # autograph's files; removed by exit_process
    state.locate(attempt_dir.path, cluster.rank)  # from here on, failures are recorded
    # SIGUSR1 dumps every thread's stack into attempt-<n>/stacks-<rank>.txt: what the
    # supervisor's hang watchdog asks for before it kills a group that stopped progressing.
    stacks_file = register_stacks(attempt_dir.stacks(cluster.rank), rank=cluster.rank)  # noqa: F841 (kept open)

    trainer: Any = None

    def diagnose(exc: Exception) -> Exception | None:
        from resilient_train.job.recipe import is_fit_script, recipe_name
        from resilient_train.runner.failures.diagnose import explain, group_broken

        broken = group_broken(exc)  # a peer's failure seen from here: exit 4, never a recipe bug
        if broken is not None:
            return broken
        label = f"Script {job.recipe}" if is_fit_script(job.recipe) else None
        return explain(exc, recipe_name=recipe_name(job.recipe), trainer=trainer, steps_per_epoch=job.steps_per_epoch,
                       job_label=label)

    def drain() -> None:
        if trainer is not None:
            trainer.drain_pending_checkpoint(_DRAIN_ON_ERROR_S)

    state.global_step = lambda: None if trainer is None else int(trainer.global_step.numpy())
    state.diagnose = diagnose
    state.on_failure = drain

    events.configure(
        run_dir.events,
        console=sys.stderr,
        writes_group_events=cluster.is_chief,
        run_id=launched.run_id,
        attempt=launched.attempt,
        rank=cluster.rank,
        role=cluster.role,
    )
    if cluster.is_chief:  # its prints on the supervisor's console too, once (runner/outputs/script_output.py)
        until_exit.enter_context(tee_stdout(lambda line: events.emit(SCRIPT_OUTPUT, echo=False, text=line)))
    stop = threading.Event()

    def watch_sigterm() -> None:
        # SIGINT too: Ctrl-C in a terminal reaches the whole process group, workers
        # included; it must mean "save at an agreed step and stop", not KeyboardInterrupt.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())

    watch_sigterm()
    # Before anything slow: every peer's TF_CONFIG address must answer within half the
    # start-up timeout (cluster/reach.py), so a worker that cannot reach the chief says so,
    # naming both, before the supervisor's start-up allowance runs out.
    from resilient_train.runner.failures.faults import FaultPlan

    faults = FaultPlan.from_env(environ, rank=cluster.rank, attempt=launched.attempt)
    placeholder = _reach_peers(cluster, job.startup_timeout, unreachable=faults.take("before_join", 0))

    from resilient_train.checkpoint import CheckpointStore, RetryPolicy
    from resilient_train.job.fingerprint import fingerprint_for_worker
    from resilient_train.job.recipe import is_fit_script, load_recipe, resolve_params

    fit_script = is_fit_script(job.recipe)  # a model.fit script runs whole (runner/keras_recipes/fitscript.py)
    if not fit_script:
        recipe = load_recipe(job.recipe)
        job = job.with_recipe_defaults(recipe.defaults)
        params = resolve_params(recipe.params, job.params)
        fingerprint_for_worker(job, recipe.source, params)  # hashes the source as imported (cached)
    # The host cache (checkpoint/cache.py): the chief's commits are written through to
    # this host's disk, and every rank restores from there before shared storage.
    store = CheckpointStore(job.storage, job.storage_options, host_cache=run_dir.host_cache,
                            retry=RetryPolicy(stall_timeout_s=job.storage_timeout))
    if cluster.is_chief:  # the only writer: fence its commits by this attempt's generation
        store.claim_generation(launched.generation, run_id=launched.run_id, attempt=launched.attempt)

    from resilient_train.runner.loop import Trainer  # imports TensorFlow

    if cluster.is_chief:  # the chief's TensorBoard log follows the event stream
        from resilient_train.runner.outputs.tensorboard import TensorBoardLog

        events.add_listener(TensorBoardLog(run_dir.tensorboard))

    def make_trainer(job: JobConfig, recipe: Any, params: dict[str, Any], **seams: Any) -> Any:
        nonlocal trainer
        trainer = Trainer(
            job,
            recipe,
            params,
            cluster,
            store=store,
            run_id=launched.run_id,
            work_dir=run_dir.work_dir(cluster.rank),
            attempt_dir=attempt_dir.path,
            stop_requested=stop.is_set,
            faults=faults,
            **seams,
        )
        return trainer

    def run_trainer(trainer: Any) -> Any:
        # The multi-worker coordination service installs its own C++ SIGTERM handler
        # (TF's preemption notifier) when the strategy starts, replacing ours: take it back.
        watch_sigterm()
        return trainer.run()

    if fit_script:
        from resilient_train.runner.keras_recipes.fitscript import FitScript

        def make_script_trainer(job: JobConfig, recipe: Any, strategy: Any, input_source: Any) -> Any:
            return make_trainer(job, recipe, {}, strategy=strategy, input_source=input_source)

        script = FitScript(job, cluster, before_strategy=placeholder.close, make_trainer=make_script_trainer,
                           run_trainer=run_trainer)
        result = script.run()  # the script's code after fit() has run when this returns
    else:
        placeholder.close()  # the strategy's server binds this port next
        result = run_trainer(make_trainer(job, recipe, params))
    # Done (or saved for preemption): a late SIGTERM must not turn this clean exit into
    # a death by signal while TensorFlow tears down.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if result is not None and cluster.is_chief:
        from resilient_train.runner.outputs.model_export import export_completed

        export_completed(trainer, result, run_dir.model)
    return EXIT_PREEMPTED if result is None else EXIT_OK


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


def exit_process(code: int) -> None:
    """Leave now with ``code``, skipping interpreter and TensorFlow teardown.

    Everything a worker promises is on disk before ``main`` returns (checkpoints committed
    and flushed, events appended with one write each). TensorFlow's teardown adds seconds
    (the multi-worker coordination service waits at a shutdown barrier for its peers) and a
    signal landing in it turns a clean exit into a death by signal.
    """
    remove_private_tempdir()  # the atexit handlers that would have removed its files never run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
