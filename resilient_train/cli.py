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
    resilient-train report RUN_DIR [--out FILE]       the run as one HTML page (timeline, curves, summary)

User errors end in one line on stderr (``resilient-train: error: ...``) and exit code 2
(errors.py); nothing is started. A command line argparse refuses is the same: one line naming
what was refused (an unknown flag with the closest known one: ``did you mean --workers?``)
and one pointing at ``--help``, instead of argparse's usage block. Flags are never
abbreviated (``allow_abbrev=False`` on every parser): ``--epoch`` for ``--epochs`` would
silently change meaning the day a flag starting the same way is added.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Any, NoReturn

from resilient_train.commands import check, diff, doctor, export, run, run_report, verify, worker
from resilient_train.errors import EXIT_USAGE, ConfigError, RecipeError, RunDirLockedError, StorageError
from resilient_train.rundir.redact import redact_text

__all__ = ["main"]

# In --help order; verify adds both ``verify`` and ``ls``.
_COMMANDS = (run, worker, check, verify, diff, export, doctor, run_report)
_USER_ERRORS = (ConfigError, RecipeError, RunDirLockedError, StorageError)


class _ArgumentParser(argparse.ArgumentParser):
    """The top parser and, through ``add_subparsers``, every subcommand's: no abbreviations,
    and a refusal is two lines (module docstring), exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n{self.prog} --help lists what is accepted\n")

    def refuse_unknown(self, unknown: list[str]) -> NoReturn:
        """``unrecognized arguments: --wokers 2; did you mean --workers?`` (the closest flag of this parser)."""
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]  # argparse keeps no public list
        guesses = []  # (given, closest known)
        for item in unknown:
            given = item.partition("=")[0]
            close = difflib.get_close_matches(given, known, n=1, cutoff=0.6) if given.startswith("--") else []
            guesses += [(given, close[0])] if close else []
        if len(guesses) == 1:
            hint = f"; did you mean {guesses[0][1]}?"
        else:
            hint = f"; did you mean {', '.join(f'{close} (for {given})' for given, close in guesses)}?" if guesses else ""
        self.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def _parser() -> _ArgumentParser:
    parser = _ArgumentParser(
        prog="resilient-train",
        description="Fault-tolerant TensorFlow training: run a recipe on N workers, checkpoint, resume exactly.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)  # parser_class: _ArgumentParser
    for command in _COMMANDS:
        command.add_parser(subparsers)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is refused by its subcommand's parser, which knows its flags."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].refuse_unknown(unknown)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return args.handler(args)
    except _USER_ERRORS as exc:
        print(redact_text(f"resilient-train: error: {exc}"), file=sys.stderr)  # a storage error may quote a URL
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
