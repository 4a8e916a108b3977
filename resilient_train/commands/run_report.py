"""``resilient-train report RUN_DIR [--out FILE]``: the run as one self-contained HTML page.

The page (commands/report_page.py) is built from the run dir's ``events.jsonl`` (and
``summary.json`` when present) alone, so it works for any run dir, a finished, a failed, a
running or an old one. It is written atomically (rundir/atomic.py) to ``RUN_DIR/report.html``
unless ``--out`` names another file; ``run`` writes the same file at its end (commands/run.py). Exit codes: 0 written; 2 usage: RUN_DIR is not a run dir
(no events.jsonl), one line on stderr (cli.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from resilient_train.commands.report_page import load_run, render_page
from resilient_train.errors import EXIT_OK
from resilient_train.rundir.atomic import write_atomic

__all__ = ["add_parser", "main", "write_report_page", "REPORT_PAGE"]

REPORT_PAGE = "report.html"  # the default file name, in the run dir


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("report", help="the run as one HTML page (timeline, curves, summary)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run dir (with events.jsonl)")
    parser.add_argument("--out", metavar="FILE", default=None,
                        help=f"where to write the page (default RUN_DIR/{REPORT_PAGE})")
    parser.set_defaults(handler=main)


def write_report_page(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render ``run_dir``'s page and write it; returns the path written. ConfigError when not a run dir."""
    view = load_run(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / REPORT_PAGE
    write_atomic(path, render_page(view).encode("utf-8"))
    return path


def main(args: argparse.Namespace) -> int:
    path = write_report_page(args.run_dir, args.out)
    print(f"Report: {path}")
    return EXIT_OK
