"""The per-step cost of the non-finite check (issue 48), alone: one process, the same steps with and without it.

    .venv/bin/python benchmarks/health_check.py [--rounds 30] [--steps 200] [--recipe recipes/digits_cnn.py]

Writes benchmarks/results/health_check.json (``--out`` elsewhere). Every step of a run
carries ``runner/health/detector.py``'s ``step_nonfinite``: an ``is_finite`` of the loss and
of the gradients' global norm, summed into a column of the packed all-reduce the step already
makes (runner/training/control_row.py). Its bar is at most 1% of a step of digits_cnn. A
2-worker run cannot show 1% on this shared machine (two trees alternating swung ±30%:
benchmarks/README.md), so this measures the check where nothing else moves: in ONE process,
the recipe's model and optimizer, one replica, two compiled calls of ``--steps`` training
steps in a ``tf.while_loop`` (the runner's call shape), identical but for the check, on the
same fixed batch; the calls alternate for ``--rounds`` rounds (which goes first alternates
too). Per round the ratio with/without; the figure is the median ratio and the median time
per step of each. The all-reduce of one more float32 is not in it (the row is already sent).

The replicas' comparison (runner/health/replicas.py) is paid once per check, not per step: the
hash of every trainable variable in the last step of a checked call. It is timed the same way
(a compiled ``weights_hash`` of the model's trainable variables, 20 x ``--rounds`` calls,
median) and given as a share of the K steps between checks (``--replica-check-every``, default
100): ``replica_share`` = hash time / (K x a step without the checks). Saves, snapshots and
epoch ends carry a check too; the all-reduce's 2 more float32 per replica are not in it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks._smoke import RESULTS, add_smoke_flag, check_smoke_out, write_result  # noqa: E402

REPLICA_CHECK_EVERY = 100  # job/config.py's default --replica-check-every
RESULT_KEYS = ("benchmark", "date", "recipe", "steps", "rounds", "load_1min", "summary", "rounds_us", "smoke")


def _calls(recipe_path: str, steps: int) -> tuple[Any, Any]:
    import numpy as np
    import tensorflow as tf

    from resilient_train.job.recipe import load_recipe
    from resilient_train.runner.health.detector import step_nonfinite

    recipe = load_recipe(str(ROOT / recipe_path))
    params = dict(recipe.params)
    model = recipe.build_model(params)
    optimizer = recipe.build_optimizer(params)
    optimizer.build(model.trainable_variables)
    batch = 64
    shape = [batch, *model.inputs[0].shape[1:]]
    features = tf.constant(np.random.default_rng(0).random(shape, dtype=np.float32))
    labels = tf.constant(np.random.default_rng(1).integers(0, 10, batch))

    def call(checked: bool):
        @tf.function(autograph=False)
        def run(n):
            def body(i, total):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(recipe.loss(labels, model(features, training=True)))
                gradients = tape.gradient(loss, model.trainable_variables)
                flag = step_nonfinite(loss, gradients) if checked else tf.constant(0.0)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))
                return i + 1, total + tf.stack([loss, flag])
            return tf.while_loop(lambda i, total: i < n, body, (tf.constant(0), tf.zeros([2])))[1]
        run(tf.constant(2)).numpy()  # trace and warm up
        return run

    from resilient_train.runner.health.replicas import weights_hash

    hashed = tf.function(autograph=False)(lambda: weights_hash(model.trainable_variables))
    hashed().numpy()  # trace
    return call(False), call(True), hashed


def measure(recipe_path: str, steps: int, rounds: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    import tensorflow as tf

    plain, checked, hashed = _calls(recipe_path, steps)
    n = tf.constant(steps)
    per_round = []
    for r in range(rounds):
        times = {}
        for name, call in (("off", plain), ("on", checked)) if r % 2 == 0 else (("on", checked), ("off", plain)):
            started = time.perf_counter()
            call(n).numpy()
            times[name] = (time.perf_counter() - started) / steps * 1e6
        per_round.append({"off_us": round(times["off"], 1), "on_us": round(times["on"], 1),
                          "ratio": round(times["on"] / times["off"], 4)})
    hash_us = []
    for _ in range(20 * rounds):
        started = time.perf_counter()
        hashed().numpy()
        hash_us.append((time.perf_counter() - started) * 1e6)
    off_step = statistics.median(r["off_us"] for r in per_round)
    summary = {
        "off_us_per_step_p50": round(statistics.median(r["off_us"] for r in per_round), 1),
        "on_us_per_step_p50": round(statistics.median(r["on_us"] for r in per_round), 1),
        "ratio_p50": round(statistics.median(r["ratio"] for r in per_round), 4),
        "ratio_p25": round(statistics.quantiles([r["ratio"] for r in per_round], n=4)[0], 4) if rounds >= 2 else None,
        "ratio_p75": round(statistics.quantiles([r["ratio"] for r in per_round], n=4)[2], 4) if rounds >= 2 else None,
        "replica_hash_us_p50": round(statistics.median(hash_us), 1),
        "replica_check_every": REPLICA_CHECK_EVERY,
        "replica_share": round(statistics.median(hash_us) / (REPLICA_CHECK_EVERY * off_step), 5),
    }
    return summary, per_round


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/digits_cnn.py")
    parser.add_argument("--steps", type=int, default=200, help="steps per call (default 200)")
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds (default 30)")
    parser.add_argument("--out", default=str(RESULTS / "health_check.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.steps, args.rounds = 5, 2
    load_before = os.getloadavg()[0]
    summary, per_round = measure(args.recipe, args.steps, args.rounds)
    report = {
        "benchmark": "health_check", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "recipe": args.recipe, "steps": args.steps, "rounds": args.rounds,
        "load_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "summary": summary, "rounds_us": per_round, "smoke": args.smoke,
    }
    print(summary)
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
