"""Command line: argument parsing only; the work happens in the subpackages.

    resilient-train run RECIPE [flags]      train on N local workers (supervised)
    resilient-train worker RECIPE [flags]   one worker, for Kubernetes/Slurm/Ray (TF_CONFIG set)
    resilient-train verify URL [--json]     check every checkpoint under URL (hashes)
    resilient-train ls URL [--json]         list checkpoints (no hashing)

User errors end in one or two lines on stderr and exit code 2; nothing is started.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from resilient_train.config import JobConfig, load_toml, parse_set_pairs
from resilient_train.errors import EXIT_USAGE, ConfigError, RecipeError, StorageError

__all__ = ["main", "add_job_arguments", "job_from_args"]

_JOB_FLAGS = (
    "workers", "run_dir", "storage", "epochs", "steps_per_epoch", "global_batch_size",
    "save_every_steps", "seed", "keep", "max_restarts", "max_preemptions", "grace_period",
    "gpus_per_worker", "checkpoint_mode", "save_every_seconds",
    "warm_standby",
)


def _positive_or_zero_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``worker`` (all default to None = config file / recipe)."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="TOML file with the same keys as the flags")
    add("--workers", type=_positive_or_zero_int, help="worker processes (default 2)")
    add("--run-dir", help="where logs, events and summary go (default runs/<recipe>)")
    add("--storage", metavar="URL", help="checkpoint storage: path, file://, s3://, gs://, memory:// (default <run-dir>/checkpoints)")
    add("--storage-option", action="append", default=[], metavar="KEY=VALUE", help="passed to the fsspec filesystem")
    add("--epochs", type=_positive_or_zero_int)
    add("--steps-per-epoch", type=_positive_or_zero_int)
    add("--global-batch-size", type=_positive_or_zero_int)
    add("--save-every-steps", type=_positive_or_zero_int, metavar="K", help="checkpoint every K global steps (0: only at epoch ends)")
    add("--save-every-seconds", type=float, metavar="T",
        help="also checkpoint when T seconds passed since the last save (the chief's clock; all workers agree on the step)")
    add("--checkpoint-mode", choices=("async", "sync"),
        help="async (default): block only to snapshot, persist in the background; sync: write and upload before training on")
    add("--seed", type=_positive_or_zero_int)
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    add("--keep", type=_positive_or_zero_int, help="committed checkpoints to keep (default 3)")
    add("--max-restarts", type=_positive_or_zero_int, help="gang restarts after failures (default 3)")
    add("--max-preemptions", type=_positive_or_zero_int, help="cap on restarts after preemptions (default: unlimited)")
    add("--grace-period", type=float, help="seconds workers get to save after SIGTERM (default 30)")
    add("--gpus-per-worker", type=_positive_or_zero_int, help="CUDA_VISIBLE_DEVICES slice per local worker (default 0)")
    add("--warm-standby", action=argparse.BooleanOptionalAction, default=None,
        help="keep workers with TensorFlow already imported waiting, so a restart skips the import (default on)")


def job_from_args(args: argparse.Namespace) -> JobConfig:
    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    values = {key.replace("-", "_"): value for key, value in values.items()}
    for name in _JOB_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.recipe:
        values["recipe"] = args.recipe
    if "recipe" not in values:
        raise ConfigError("No recipe given; expected `resilient-train run RECIPE` (e.g. recipes/digits_cnn.py)")
    params = dict(values.pop("params", {}) or {})
    params.update(parse_set_pairs(args.set))
    values["params"] = params
    from resilient_train.checkpoint import parse_storage_options

    options = dict(values.pop("storage_options", {}) or {})
    options.update(parse_storage_options(args.storage_option))
    values["storage_options"] = options
    return JobConfig.from_mapping(values, source=args.config or "flags")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resilient-train",
        description="Fault-tolerant TensorFlow training: run a recipe on N workers, checkpoint, resume exactly.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a recipe on local worker processes")
    run.add_argument("recipe", nargs="?", help="recipe file or module (e.g. recipes/digits_cnn.py)")
    add_job_arguments(run)
    worker = sub.add_parser("worker", help="run one worker (TF_CONFIG set by your launcher)")
    worker.add_argument("recipe", nargs="?")
    add_job_arguments(worker)
    for name, help_text in (("verify", "verify every checkpoint (hashes all files)"), ("ls", "list checkpoints (no hashing)")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("url", help="storage URL (the --storage of the run)")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
        cmd.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        if args.command in ("verify", "ls"):
            from resilient_train.checkpoint import parse_storage_options
            from resilient_train.checkpoint.verify import verify_command

            options = parse_storage_options(args.storage_option)
            return verify_command(args.url, options, as_json=args.json, hash=args.command == "verify")
        job = job_from_args(args)
        if args.command == "worker":
            from resilient_train.runner.worker import main as worker_main

            return worker_main(argv[1:])
        from resilient_train.recipe import check_recipe_source
        from resilient_train.supervisor.supervisor import Supervisor

        check_recipe_source(job.recipe)
        return Supervisor(job).run()
    except (ConfigError, RecipeError, StorageError) as exc:
        print(f"resilient-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
