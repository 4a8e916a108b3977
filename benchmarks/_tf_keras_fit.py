"""One worker of what a Keras user runs today on TF 2.21 under MultiWorkerMirroredStrategy.

The baseline of benchmarks/keras_fit.py: Keras 3's ``fit`` fails under MWMS (issue 19), so
the working alternative is legacy ``tf_keras`` ``model.fit``, optionally with
``tf_keras.callbacks.BackupAndRestore(save_freq=K)`` for fault tolerance (it restores the
epoch and the weights, not the input position or any callback's state). The model, its
compile() and the input come from a resilient-train recipe (``build_model(params,
api=tf_keras)``, ``dataset``), fed to ``fit`` through a ``DatasetCreator``, which is how
resilient-train feeds it too (``distribute_datasets_from_function``).

    TF_CONFIG=... python benchmarks/_tf_keras_fit.py RECIPE --steps S --batch B
        [--backup-every K --backup-dir DIR] [--warmup W] --out result.json

The chief writes {"steps_per_s": ...} measured from the end of step W to the end of the
last step (both read back with the loss, so the steps are done; start-up, tracing and the
epoch end are excluded, as for resilient-train's train_progress window).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--backup-every", type=int, default=0)
    parser.add_argument("--backup-dir")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import tensorflow as tf
    import tf_keras

    from resilient_train.job.recipe import load_recipe, resolve_params
    from resilient_train.runner.input.data import RecipeInputContext

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    recipe = load_recipe(args.recipe)
    params = resolve_params(recipe.params, {})
    with strategy.scope():
        model = recipe.build_model(params, api=tf_keras)  # compiled, as the user's script does

    def dataset_fn(context):
        return recipe.dataset(RecipeInputContext(context, args.batch, params), 0, 0).prefetch(2)

    class Timer(tf_keras.callbacks.Callback):
        """Reads the loss (waits for the step) only at the window's two ends."""

        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self.start = self.end = 0.0

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in (args.warmup, args.steps):
                float(logs["loss"])
                if batch + 1 == args.warmup:
                    self.start = time.perf_counter()
                else:
                    self.end = time.perf_counter()

    timer = Timer()
    callbacks = [timer]
    if args.backup_every:
        callbacks.append(tf_keras.callbacks.BackupAndRestore(args.backup_dir, save_freq=args.backup_every))
    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=args.steps,
              callbacks=callbacks, verbose=0)

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["index"] == 0:
        Path(args.out).write_text(json.dumps({"steps_per_s": (args.steps - args.warmup) / (timer.end - timer.start)}))
    sys.stdout.flush()
    os._exit(0)  # skip TF's multi-worker shutdown barrier, as resilient-train's workers do


if __name__ == "__main__":
    raise SystemExit(main())
