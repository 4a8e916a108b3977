"""``resilient-train check RECIPE``: is the recipe's input deterministic? (runner/input/check_input.py)"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check", help="build a few batches of epochs 0 and 1 twice in fresh processes; exit 1 if they differ")
    parser.add_argument("recipe", help="recipe file or module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    parser.add_argument("--global-batch-size", type=int)
    parser.add_argument("--batches", type=int, default=3, help="batches per epoch to compare (default 3)")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.job.config import parse_set_pairs
    from resilient_train.job.recipe import check_recipe_source
    from resilient_train.runner.input.check_input import check_command

    check_recipe_source(args.recipe)
    return check_command(args.recipe, seed=args.seed, params=parse_set_pairs(args.set),
                         global_batch_size=args.global_batch_size, batches=args.batches)
