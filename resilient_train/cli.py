"""Command line: argument parsing only; the work happens in the subpackages.

    resilient-train run RECIPE [flags]      train on N local workers (supervised)
    resilient-train worker RECIPE [flags]   one worker, for Kubernetes/Slurm/Ray (TF_CONFIG set,
                                            or --tf-config-from slurm)
    resilient-train verify URL [--json]     check every checkpoint under URL (hashes)
    resilient-train ls URL [--json]         list checkpoints (no hashing)
    resilient-train export URL --recipe R --out DIR [--step N] [--format F]   a checkpoint as a model
    resilient-train doctor [--json] [--storage URL]   check this machine before training
    resilient-train check RECIPE            is the recipe's input deterministic? (two fresh processes)

User errors end in one or two lines on stderr and exit code 2; nothing is started.
"""

from __future__ import annotations

import argparse
import os
import sys

from resilient_train.job.config import add_job_arguments, job_from_args
from resilient_train.errors import EXIT_USAGE, ConfigError, RecipeError, RunDirLockedError, StorageError
from resilient_train.cluster.slurm import add_tf_config_arguments

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resilient-train",
        description="Fault-tolerant TensorFlow training: run a recipe on N workers, checkpoint, resume exactly.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a recipe on local worker processes")
    run.add_argument("recipe", nargs="?", help="recipe file or module (e.g. recipes/digits_cnn.py)")
    add_job_arguments(run)
    run.add_argument("--accept-changes", action="store_true",
                     help="continue a run whose recipe, params, seed or sizes changed (default: refuse, exit 2)")
    worker = sub.add_parser("worker", help="run one worker (TF_CONFIG set by your launcher)")
    worker.add_argument("recipe", nargs="?")
    add_job_arguments(worker)
    add_tf_config_arguments(worker)
    check = sub.add_parser("check", help="build a few batches of epochs 0 and 1 twice in fresh processes; exit 1 if they differ")
    check.add_argument("recipe", help="recipe file or module")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    check.add_argument("--global-batch-size", type=int)
    check.add_argument("--batches", type=int, default=3, help="batches per epoch to compare (default 3)")
    for name, help_text in (("verify", "verify every checkpoint (hashes all files)"), ("ls", "list checkpoints (no hashing)")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("url", help="storage URL (the --storage of the run)")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
        cmd.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    export = sub.add_parser("export", help="export a committed checkpoint as model.keras / SavedModel")
    export.add_argument("url", help="storage URL (the --storage of the run)")
    export.add_argument("--recipe", required=True, help="the recipe that trained it")
    export.add_argument("--out", required=True, metavar="DIR", help="output directory (replaced if it exists)")
    export.add_argument("--step", type=int, help="global step (default: the newest committed checkpoint)")
    export.add_argument("--format", choices=("keras", "saved_model"), action="append",
                        help="keras (model.keras) or saved_model (SavedModel for serving); default both")
    export.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    export.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    doctor = sub.add_parser("doctor", help="check Python, TensorFlow, GPUs, environment, ports and storage")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--storage", metavar="URL", help="also check that URL is reachable and writable")
    doctor.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    doctor.add_argument("--workers", type=int, default=1, help="with --gpus-per-worker: GPUs needed = workers x G")
    doctor.add_argument("--gpus-per-worker", type=int, default=0, metavar="G")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        if args.command in ("verify", "ls"):
            from resilient_train.checkpoint import parse_storage_options
            from resilient_train.commands.verify import verify_command

            options = parse_storage_options(args.storage_option)
            return verify_command(args.url, options, as_json=args.json, hash=args.command == "verify")
        if args.command == "export":
            return _export(args)
        if args.command == "doctor":
            from resilient_train.checkpoint import parse_storage_options
            from resilient_train.commands.doctor import doctor_command

            return doctor_command(as_json=args.json, storage=args.storage,
                                  storage_options=parse_storage_options(args.storage_option),
                                  workers=args.workers, gpus_per_worker=args.gpus_per_worker)
        if args.command == "check":
            return _check(args)
        job = job_from_args(args)
        if args.command == "worker":
            from resilient_train.runner.worker import main as worker_main

            return worker_main(argv[1:])
        from resilient_train.job.preflight import preflight
        from resilient_train.supervisor.supervisor import Supervisor

        preflight(job)
        return Supervisor(job, accept_changes=args.accept_changes).run()
    except (ConfigError, RecipeError, RunDirLockedError, StorageError) as exc:
        print(f"resilient-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _export(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options
    from resilient_train.job.config import parse_set_pairs
    from resilient_train.runner.export import FORMATS, export_command

    return export_command(
        args.url,
        recipe_spec=args.recipe,
        out=args.out,
        step=args.step,
        formats=tuple(args.format or FORMATS),
        storage_options=parse_storage_options(args.storage_option),
        overrides=parse_set_pairs(args.set),
    )
def _check(args: argparse.Namespace) -> int:
    from resilient_train.job.config import parse_set_pairs
    from resilient_train.job.recipe import check_recipe_source
    from resilient_train.runner.check_input import check_command

    check_recipe_source(args.recipe)
    return check_command(args.recipe, seed=args.seed, params=parse_set_pairs(args.set),
                         global_batch_size=args.global_batch_size, batches=args.batches)


if __name__ == "__main__":
    sys.exit(main())
