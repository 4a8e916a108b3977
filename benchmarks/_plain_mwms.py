"""One worker of the TF tutorial's plain MultiWorkerMirroredStrategy custom loop.

The baseline of benchmarks/throughput.py: what a careful user writes from
https://www.tensorflow.org/tutorials/distribute/multi_worker_with_ctl, on the same recipe
(model, optimizer, loss, input) as resilient-train, with nothing of ours in the step: one
``strategy.run`` + ``strategy.reduce`` of the loss per ``tf.function`` call, optionally a
``tf.train.Checkpoint.write`` every K steps (every worker writes; the chief's copy is kept).

    TF_CONFIG=... python benchmarks/_plain_mwms.py RECIPE --steps S --batch B
        [--save-every K] [--warmup W] --out result.json

The chief writes {"steps_per_s": ...} measured from the end of step W to the end of the
last step (tracing and start-up excluded, as for resilient-train's train_progress window).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tutorial_step(recipe_path: str, batch: int):
    """The tutorial's pieces for ``recipe_path``: (strategy, recipe, params, model, optimizer,
    train_step), ``train_step(iterator)`` being one ``strategy.run`` + ``strategy.reduce``
    of the loss per ``tf.function`` call. Shared with benchmarks/_plain_epochs.py."""
    import tensorflow as tf

    from resilient_train.job.recipe import load_recipe, resolve_params

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    recipe = load_recipe(recipe_path)
    params = resolve_params(recipe.params, {})
    with strategy.scope():
        model = recipe.build_model(params)
        optimizer = recipe.build_optimizer(params)

    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = tf.nn.compute_average_loss(recipe.loss(labels, predictions), global_batch_size=batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    return strategy, recipe, params, model, optimizer, train_step


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import tensorflow as tf

    from resilient_train.runner.input.data import RecipeInputContext

    strategy, recipe, params, model, optimizer, train_step = tutorial_step(args.recipe, args.batch)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

    def dataset_fn(context):
        return recipe.dataset(RecipeInputContext(context, args.batch, params), 0, 0).prefetch(2)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    is_chief = task["index"] == 0
    save_dir = Path(tempfile.mkdtemp(prefix=f"plain-mwms-{task['index']}-"))
    total_loss, start = 0.0, None
    try:
        for step in range(1, args.steps + 1):
            total_loss += train_step(iterator)
            if args.save_every and step % args.save_every == 0:
                checkpoint.write(str(save_dir / f"ckpt-{step}"))
            if step == args.warmup:
                float(total_loss)  # the steps so far are done
                start = time.perf_counter()
        float(total_loss)
        elapsed = time.perf_counter() - start
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
    if is_chief:
        Path(args.out).write_text(json.dumps({"steps_per_s": (args.steps - args.warmup) / elapsed}))
    sys.stdout.flush()
    os._exit(0)  # skip TF's multi-worker shutdown barrier, as resilient-train's workers do


if __name__ == "__main__":
    raise SystemExit(main())
