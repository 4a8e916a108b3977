"""``resilient-train run RECIPE``: train on N local workers under the supervisor, then write the run's page.

The page (``RUN_DIR/report.html``, commands/run_report.py) is written here, after the
supervisor returns, because the supervisor sits below the commands (docs/design.md, the
layering rule) and cannot import the page writer. It is written at the end of every run that
got as far as its supervisor's exit code (completed, failed, stopped), so the ``Page:`` line
names a file that exists. The page is a view: a failure to write it is one line on stderr
and never changes the run's exit code.

``RT_FAULTS`` (runner/failures/faults.py: injected faults, e.g. a poisoned batch at a step of
the user's own recipe, docs/failures.md) reaches every worker through the environment; a bad
value is refused here, before anything starts (exit 2, one line), not in every worker of every
attempt.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping

from resilient_train.errors import ConfigError
from resilient_train.job.config import JobConfig, add_job_arguments, job_from_args

__all__ = ["add_parser", "main", "write_page_after_run", "check_fault_plan"]


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
    check_fault_plan(os.environ)
    preflight(job)
    warning = command_line_secret_warning(args.storage_options, job.storage)
    if warning is not None:
        print(warning, file=sys.stderr)
    if job.strategy == "parameter-server":
        from resilient_train.supervisor.ps_supervisor import ParameterServerSupervisor

        code = ParameterServerSupervisor(job, accept_changes=args.accept_changes, verbose=args.verbose).run()
    else:
        code = Supervisor(job, accept_changes=args.accept_changes, verbose=args.verbose).run()
    write_page_after_run(job)
    return code


def check_fault_plan(environ: Mapping[str, str]) -> None:
    """ConfigError (exit 2) when ``RT_FAULTS`` is set and not a valid fault list."""
    from resilient_train.runner.failures.faults import parse_faults

    try:
        parse_faults(environ.get("RT_FAULTS", ""))
    except ValueError as exc:
        raise ConfigError(f"{exc} (runner/failures/faults.py; docs/failures.md)") from None


def write_page_after_run(job: JobConfig) -> None:
    """Write ``job``'s run dir page and print ``Page: PATH``; on any failure print one line on
    stderr instead. Under the run dir's umask (rundir/permissions.py), as everything else the
    run wrote. Never raises: the run's exit code is already decided. Nothing when the run dir
    has no event log: no run started there (e.g. it was refused before the first event)."""
    from resilient_train.commands.run_report import write_report_page
    from resilient_train.rundir.layout import RunDir
    from resilient_train.rundir.permissions import run_dir_umask
    from resilient_train.rundir.redact import redact_text

    if not RunDir(job.run_dir).events.exists():
        return
    try:
        with run_dir_umask(job.run_dir_mode):
            path = write_report_page(job.run_dir)
    except (Exception, KeyboardInterrupt) as exc:  # a second Ctrl-C too: the run's exit code stands
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(redact_text(f"resilient-train: the run's page was not written ({reason}); "
                          f"`resilient-train report {job.run_dir}` draws it"), file=sys.stderr)
        return
    print(f"Page: {path}")
