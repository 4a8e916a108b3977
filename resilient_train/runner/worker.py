"""Worker process wiring: config, TF_CONFIG, events, error file, exit code.

Kept separate from ``loop.py`` so that everything up to the TensorFlow import (argument
and TF_CONFIG validation, recipe shape) fails fast with a readable message.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Mapping

from resilient_train.rundir import events
from resilient_train.cluster.tf_config import parse_tf_config
from resilient_train.job.config import JobConfig, add_job_arguments, job_from_args
from resilient_train.cluster.slurm import add_tf_config_arguments, environ_with_tf_config
from resilient_train.errors import (
    EXIT_FAILURE,
    EXIT_FATAL,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    CheckpointIncompatibleError,
    ConfigError,
    RecipeError,
    StaleWriterError,
    StorageError,
    StorageUnavailableError,
)

__all__ = ["main", "exit_process"]

# A failing chief lets an in-flight background checkpoint commit for this long (the
# supervisor gives a failing group 3 s before SIGKILL).
_DRAIN_ON_ERROR_S = 2.5


def _parse(argv: list[str]) -> tuple[JobConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner")
    parser.add_argument("--job", help="job file written by the supervisor (job.json)")
    parser.add_argument("recipe_arg", nargs="?", metavar="RECIPE")
    add_job_arguments(parser)
    add_tf_config_arguments(parser)
    args = parser.parse_args(argv)
    if args.job:
        with open(args.job) as handle:
            return JobConfig.from_json(handle.read()), args
    args.recipe = args.recipe_arg
    return job_from_args(args), args


def main(argv: list[str], *, environ: Mapping[str, str] = os.environ) -> int:
    try:
        job, args = _parse(argv)
        environ = environ_with_tf_config(environ, args.tf_config_from, args.port_base)
        if args.tf_config_from != "env":  # MultiWorkerMirroredStrategy reads os.environ
            os.environ["TF_CONFIG"] = environ["TF_CONFIG"]
        cluster = parse_tf_config(environ.get("TF_CONFIG"))
    except (ConfigError, OSError, ValueError) as exc:
        print(f"resilient-train worker: {exc}", file=sys.stderr)
        return EXIT_USAGE

    run_dir = Path(job.run_dir)
    attempt = int(environ.get("RT_ATTEMPT", "1"))
    attempt_dir = run_dir / f"attempt-{attempt}"
    attempt_dir.mkdir(parents=True, exist_ok=True)
    events.configure(
        run_dir / "events.jsonl",
        console=sys.stderr,
        writes_group_events=cluster.is_chief,
        run_id=environ.get("RT_RUN_ID", "standalone"),
        attempt=attempt,
        rank=cluster.rank,
        role=cluster.role,
    )
    stop = threading.Event()

    def watch_sigterm() -> None:
        # SIGINT too: Ctrl-C in a terminal reaches the whole process group, workers
        # included; it must mean "save at an agreed step and stop", not KeyboardInterrupt.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())

    watch_sigterm()

    trainer = None
    try:
        from resilient_train.checkpoint import CheckpointStore
        from resilient_train.job.fingerprint import fingerprint_for_worker
        from resilient_train.job.recipe import load_recipe, resolve_params

        recipe = load_recipe(job.recipe)
        job = job.with_recipe_defaults(recipe.defaults)
        params = resolve_params(recipe.params, job.params)
        fingerprint_for_worker(job, recipe.source, params)  # hashes the source as imported (cached)
        # The host cache (checkpoint/cache.py): the chief's commits are written through to
        # this host's disk, and every rank restores from there before shared storage.
        store = CheckpointStore(job.storage, job.storage_options, host_cache=run_dir / "local" / "host-cache")
        if cluster.is_chief:  # the only writer: fence its commits by this attempt's generation
            store.claim_generation(_generation(environ), run_id=environ.get("RT_RUN_ID", "standalone"), attempt=attempt)

        from resilient_train.runner.faults import FaultPlan
        from resilient_train.runner.loop import Trainer  # imports TensorFlow

        if cluster.is_chief:  # the chief's TensorBoard log follows the event stream
            from resilient_train.runner.tensorboard import TensorBoardLog

            events.add_listener(TensorBoardLog(run_dir / "tensorboard"))

        trainer = Trainer(
            job,
            recipe,
            params,
            cluster,
            store=store,
            run_id=environ.get("RT_RUN_ID", "standalone"),
            work_dir=run_dir / "local" / f"rank-{cluster.rank}",
            attempt_dir=attempt_dir,
            stop_requested=stop.is_set,
            faults=FaultPlan.from_env(environ, rank=cluster.rank, attempt=attempt),
        )
        # The multi-worker coordination service installs its own C++ SIGTERM handler
        # (TF's preemption notifier) when the strategy starts, replacing ours: take it back.
        watch_sigterm()
        result = trainer.run()
        # Done (or saved for preemption): a late SIGTERM must not turn this clean exit into
        # a death by signal while TensorFlow tears down.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if result is not None and cluster.is_chief:
            from resilient_train.runner.export import export_completed

            export_completed(trainer, result, run_dir / "model")
        return EXIT_PREEMPTED if result is None else EXIT_OK
    except (RecipeError, ConfigError, CheckpointIncompatibleError, StaleWriterError) as exc:
        _record(attempt_dir, cluster.rank, exc, trainer)
        print(f"resilient-train worker {cluster.rank}: fatal: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except StorageUnavailableError as exc:
        _record(attempt_dir, cluster.rank, exc, trainer)
        print(f"resilient-train worker {cluster.rank}: storage unavailable: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except StorageError as exc:
        _record(attempt_dir, cluster.rank, exc, trainer)
        print(f"resilient-train worker {cluster.rank}: fatal storage error: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except Exception as exc:  # the recipe's or TensorFlow's: record it for the root-cause report
        from resilient_train.job.recipe import recipe_name
        from resilient_train.runner.diagnose import explain

        fatal = explain(exc, recipe_name=recipe_name(job.recipe), trainer=trainer, steps_per_epoch=job.steps_per_epoch)
        if fatal is not None:  # a recipe bug that every restart would hit again
            _record(attempt_dir, cluster.rank, fatal, trainer)
            print(f"resilient-train worker {cluster.rank}: fatal: {fatal}", file=sys.stderr)
            return EXIT_FATAL
        _record(attempt_dir, cluster.rank, exc, trainer)
        if trainer is not None:
            trainer.drain_pending_checkpoint(_DRAIN_ON_ERROR_S)
        import traceback

        traceback.print_exc()
        return EXIT_FAILURE


def _generation(environ: Mapping[str, str]) -> int | None:
    """``RT_GENERATION`` from the supervisor; None (claim the next free one) for other launchers."""
    text = environ.get("RT_GENERATION", "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"Received RT_GENERATION={text!r}; expected an integer >= 1") from None


def _record(attempt_dir: Path, rank: int, exc: BaseException, trainer) -> None:
    try:
        from resilient_train.rundir.errorfile import record_exception
    except ImportError:  # pragma: no cover - until the error-file module lands
        return
    global_step = None
    if trainer is not None:
        try:
            global_step = int(trainer.global_step.numpy())
        except Exception:  # the variable may not exist yet
            global_step = None
    record_exception(attempt_dir, rank, exc, global_step=global_step)


def exit_process(code: int) -> None:
    """Leave now with ``code``, skipping interpreter and TensorFlow teardown.

    Everything a worker promises is on disk before ``main`` returns (checkpoints committed
    and flushed, events appended with one write each). TensorFlow's teardown adds seconds
    (the multi-worker coordination service waits at a shutdown barrier for its peers) and a
    signal landing in it turns a clean exit into a death by signal.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
