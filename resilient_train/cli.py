"""Command line: the top parser and the one handler of user errors; each subcommand is a
module of ``resilient_train/commands/`` (``add_parser(subparsers)``, ``main(args) -> int``).

    resilient-train run RECIPE [flags]      train on N local workers (supervised)
    resilient-train worker RECIPE [flags]   one worker, for Kubernetes/Slurm/Ray (TF_CONFIG set,
                                            or --tf-config-from slurm)
    resilient-train check RECIPE            is the recipe's input deterministic? (two fresh processes)
    resilient-train verify URL [--json]     check every checkpoint under URL (hashes)
    resilient-train ls URL [--json]         list checkpoints (no hashing)
    resilient-train diff A B [--json]       the first committed step where two runs diverge
    resilient-train export URL --recipe R --out DIR [--step N] [--format F]   a checkpoint as a model
    resilient-train doctor [--json] [--storage URL]   check this machine before training

User errors end in one line on stderr (``resilient-train: error: ...``) and exit code 2
(errors.py); nothing is started.
"""

from __future__ import annotations

import argparse
import os
import sys

from resilient_train.commands import check, diff, doctor, export, run, verify, worker
from resilient_train.errors import EXIT_USAGE, ConfigError, RecipeError, RunDirLockedError, StorageError
from resilient_train.rundir.redact import redact_text

__all__ = ["main"]

# In --help order; verify adds both ``verify`` and ``ls``.
_COMMANDS = (run, worker, check, verify, diff, export, doctor)
_USER_ERRORS = (ConfigError, RecipeError, RunDirLockedError, StorageError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resilient-train",
        description="Fault-tolerant TensorFlow training: run a recipe on N workers, checkpoint, resume exactly.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return args.handler(args)
    except _USER_ERRORS as exc:
        print(redact_text(f"resilient-train: error: {exc}"), file=sys.stderr)  # a storage error may quote a URL
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
