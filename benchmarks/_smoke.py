"""The smoke protocol every benchmark script in this directory honours.

Benchmarks are code: a refactor that breaks one must fail the test suite, not the next
person who runs ``make bench``. So every public script here (a name without a leading
underscore; ``_*.py`` are helpers the scripts run) accepts::

    python benchmarks/NAME.py --smoke --out FILE.json

``--smoke`` runs every code path of the script at the smallest size that still produces
each figure (a few steps, one repeat) and writes its JSON to ``--out``; the figures are
meaningless and the JSON says so (``"smoke": true``). ``--out`` is required with
``--smoke`` and may not point into benchmarks/results/, so a smoke run never replaces a
measurement. Each script names the top-level keys of its JSON in ``RESULT_KEYS``;
tests/test_benchmarks.py runs every script this way and checks the JSON has exactly those
keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="tiny run of every code path (figures meaningless); needs --out outside benchmarks/results/")


def check_smoke_out(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None = None) -> None:
    """Refuse a smoke run without an explicit ``--out`` or with one inside benchmarks/results/."""
    if not args.smoke:
        return
    given = sys.argv[1:] if argv is None else argv
    if not any(a == "--out" or a.startswith("--out=") for a in given):
        parser.error("--smoke needs --out FILE (a smoke run never writes into benchmarks/results/)")
    if RESULTS in Path(args.out).resolve().parents:
        parser.error(f"Received --out {args.out} with --smoke; expected a file outside {RESULTS}")


def write_result(path: str | Path, report: dict) -> Path:
    """Write a benchmark's JSON (indented, one trailing newline), creating its folder; the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out
