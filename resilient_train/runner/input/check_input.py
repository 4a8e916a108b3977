"""``resilient-train check RECIPE``: is the recipe's input deterministic, before a long job?

Exact resume needs ``dataset(input_context, epoch, seed)`` to be a pure function of its
arguments. This command builds the first few batches of epochs 0 and 1 in two fresh
processes, as the runner builds them (same seeding, runner/input/determinism.py), one in the
order 0, 1 (a fresh run) and one in the order 1, 0 (a run resumed in epoch 1), and
compares their digests. Any difference is non-determinism a resumed run would hit: exit 1
naming the epoch and batch; identical input exits 0.

The parent process does not import TensorFlow; each probe is ``python -m
resilient_train.runner.input.check_input --probe ...`` and prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Mapping, TextIO

from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from resilient_train.cluster import entry_points

__all__ = ["check_command"]

EPOCHS = (0, 1)


def check_command(recipe: str, *, seed: int, params: Mapping[str, str], global_batch_size: int | None,
                  batches: int, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the two probes and report; returns the exit code."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    runs = []
    for order in (EPOCHS, tuple(reversed(EPOCHS))):
        result = _probe_process(recipe, order, seed=seed, params=params, global_batch_size=global_batch_size,
                                batches=batches)
        if "error" in result:
            err.write(f"resilient-train: error: {result['error']}\n")
            return EXIT_USAGE
        runs.append(result["digests"])
    differences = [
        (epoch, index, first, second)
        for epoch in EPOCHS
        for index, (first, second) in enumerate(zip(runs[0][str(epoch)], runs[1][str(epoch)]))
        if first != second
    ]
    if differences:
        epoch, index, first, second = differences[0]
        out.write(
            f"NOT deterministic: epoch {epoch} batch {index} differs between two fresh processes "
            f"(sha256 {first[:12]} vs {second[:12]}; {len(differences)} of {batches * len(EPOCHS)} batches differ).\n"
            "dataset() must be a pure function of (input_context, epoch, seed): seed numpy/Python random from "
            "seed and epoch, do not read the clock, and keep input files fixed. A resumed run would train on "
            "other batches than an uninterrupted one.\n"
        )
        return EXIT_FAILURE
    out.write(f"deterministic: the first {batches} batches of epochs {EPOCHS[0]} and {EPOCHS[1]} are identical "
              "in two fresh processes (built in the order 0,1 and 1,0)\n")
    if runs[0]["0"] == runs[0]["1"]:
        out.write("note: epochs 0 and 1 start with the same batches; shuffle with a seed that includes the epoch\n")
    return EXIT_OK


def _probe_process(recipe: str, order: tuple[int, ...], *, seed: int, params: Mapping[str, str],
                   global_batch_size: int | None, batches: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", entry_points.INPUT_PROBE, recipe, "--seed", str(seed),
            "--order", ",".join(map(str, order)), "--batches", str(batches)]
    if global_batch_size is not None:
        argv += ["--global-batch-size", str(global_batch_size)]
    for key, value in params.items():
        argv += ["--set", f"{key}={value}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the input probe failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


def _probe(recipe_spec: str, order: list[int], *, seed: int, overrides: Mapping[str, str],
           global_batch_size: int | None, batches: int) -> dict[str, Any]:
    """In the probe process: digests of the first ``batches`` batches of each epoch."""
    import keras
    import tensorflow as tf

    from resilient_train.job.config import FALLBACK_DEFAULTS
    from resilient_train.job.recipe import load_recipe, resolve_params
    from resilient_train.runner.input.data import RecipeInputContext
    from resilient_train.runner.input.determinism import batch_digest, seed_input_rng
    from resilient_train.runner.input.indexed import example_count, indexed_dataset

    recipe = load_recipe(recipe_spec)
    params = resolve_params(recipe.params, overrides)
    batch = global_batch_size or recipe.defaults.get("global_batch_size", FALLBACK_DEFAULTS["global_batch_size"])
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    context = RecipeInputContext(tf.distribute.InputContext(1, 0, 1), batch, params)
    steps = recipe.defaults.get("steps_per_epoch", FALLBACK_DEFAULTS["steps_per_epoch"])
    count = example_count(recipe, params) if recipe.indexed else 0
    digests = {}
    for epoch in order:
        seed_input_rng(seed, epoch)
        if recipe.indexed:  # the runner's pipeline: example() and augment() are what can differ
            dataset = indexed_dataset(recipe, params=params, num_examples=count, seed=seed, epoch=epoch, start_step=0,
                                      steps_per_epoch=max(steps, batches), global_batch_size=batch,
                                      input_pipeline_id=0, num_input_pipelines=1, per_replica_batch_size=batch)
        else:
            dataset = recipe.dataset(context, epoch, seed)
        digests[str(epoch)] = [batch_digest(element) for element in dataset.take(batches)]
    return {"digests": digests}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.runner.input.check_input", allow_abbrev=False)
    parser.add_argument("recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", default="0,1")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)
    from resilient_train.job.config import parse_set_pairs

    try:
        result = _probe(args.recipe, [int(e) for e in args.order.split(",")], seed=args.seed,
                        overrides=parse_set_pairs(args.set), global_batch_size=args.global_batch_size,
                        batches=args.batches)
    except Exception as exc:  # the recipe's error: the parent prints it in one line
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
