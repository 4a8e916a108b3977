"""``resilient-train run RECIPE``: train on N local workers under the supervisor."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from resilient_train.job.config import add_job_arguments, job_from_args

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="train a recipe on local worker processes")
    parser.add_argument("recipe", nargs="?", help="recipe file or module (e.g. recipes/digits_cnn.py)")
    add_job_arguments(parser)
    parser.add_argument("--accept-changes", action="store_true",
                        help="continue a run whose recipe, params, seed or sizes changed (default: refuse, exit 2)")
    parser.add_argument("--verbose", action="store_true",
                        help="show every event on the console as its key=value line (as events.jsonl records it) "
                        "instead of sentences and the progress line")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.job.preflight import command_line_secret_warning, preflight
    from resilient_train.supervisor.supervisor import Supervisor

    job = job_from_args(args)
    preflight(job)
    warning = command_line_secret_warning(args.storage_options, job.storage)
    if warning is not None:
        print(warning, file=sys.stderr)
    if job.strategy == "parameter-server":
        from resilient_train.supervisor.ps_supervisor import ParameterServerSupervisor

        return ParameterServerSupervisor(job, accept_changes=args.accept_changes, verbose=args.verbose).run()
    return Supervisor(job, accept_changes=args.accept_changes, verbose=args.verbose).run()
