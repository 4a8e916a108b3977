"""One worker of the TF tutorial's multi-epoch MultiWorkerMirroredStrategy loop.

The baseline of benchmarks/epochs.py: https://www.tensorflow.org/tutorials/distribute/multi_worker_with_ctl
trains epoch by epoch, each from a new distributed dataset and iterator, and drops the
iterator at the epoch end (``del it``). Same recipe (model, optimizer, loss, input) as
resilient-train, nothing of ours in the step: one ``strategy.run`` + ``strategy.reduce``
per ``tf.function`` call.

    TF_CONFIG=... python benchmarks/_plain_epochs.py RECIPE --epochs E --steps S --batch B --out result.json

The chief writes, with times in seconds from the first step's end: ``epoch_s`` (each
epoch's wall time, its ``del it`` included), ``teardown_s`` (each ``del it``), ``marks``
(a progress mark every ``--progress-every`` seconds and at every epoch end, as
resilient-train's ``train_progress``/``epoch_finished`` events) and ``longest_pause_s``
(the longest gap between two marks).
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
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="steps per epoch")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--progress-every", type=float, default=0.5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from benchmarks._plain_mwms import tutorial_step
    from resilient_train.runner.input.data import RecipeInputContext

    strategy, recipe, params, _, _, train_step = tutorial_step(args.recipe, args.batch)

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    epoch_s, teardown_s, marks = [], [], []
    origin = last_mark = None
    for epoch in range(args.epochs):
        def dataset_fn(context, epoch=epoch):
            return recipe.dataset(RecipeInputContext(context, args.batch, params), epoch, 0).take(args.steps).prefetch(2)

        epoch_started = time.perf_counter()
        it = iter(strategy.distribute_datasets_from_function(dataset_fn))
        for _ in range(args.steps):
            float(train_step(it))
            now = time.perf_counter()
            if origin is None:
                origin = last_mark = now
                epoch_started = now  # the first epoch counts from its first step, as ours does
            elif now - last_mark >= args.progress_every:
                marks.append(now - origin)
                last_mark = now
        before = time.perf_counter()
        del it  # the tutorial's epoch end
        now = time.perf_counter()
        teardown_s.append(round(now - before, 3))
        epoch_s.append(round(now - epoch_started, 3))
        marks.append(now - origin)
        last_mark = now
    gaps = [b - a for a, b in zip([0.0, *marks], marks)]
    if task["index"] == 0:
        Path(args.out).write_text(json.dumps({
            "wall_s": round(marks[-1], 3), "epoch_s": epoch_s, "teardown_s": teardown_s,
            "longest_pause_s": round(max(gaps), 3), "marks": [round(m, 3) for m in marks],
        }))
    sys.stdout.flush()
    os._exit(0)  # skip TF's multi-worker shutdown barrier, as resilient-train's workers do


if __name__ == "__main__":
    raise SystemExit(main())
