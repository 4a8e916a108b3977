"""Multi-epoch runs: wall time per epoch and the longest pause, against the TF tutorial's loop.

    .venv/bin/python benchmarks/epochs.py                  # 5 x 4000 steps, 3 repeats (~25 min on 2 cores)
    .venv/bin/python benchmarks/epochs.py --smoke --out /tmp/epochs.json   # 2 x 30 steps, one repeat

Writes benchmarks/results/epochs.json and .md (``--out`` elsewhere).

Why this benchmark exists: TensorFlow tears a tf.data iterator down synchronously, and at an
epoch end of a long epoch that took tens of seconds (runner/input/teardown.py). A throughput
figure taken inside one epoch never sees it; a user's multi-epoch run does. Both sides are
2 worker processes on loopback, the same recipe and global batch:

* ``plain``: benchmarks/_plain_epochs.py, the tutorial's loop (a new distributed dataset
  and iterator per epoch, ``del it`` at its end; no determinism, no checkpoints);
* ``ours``: ``resilient-train run`` with its defaults (async checkpoints every
  ``--save-every-steps``, warm standbys, evaluation at epoch ends), progress every 0.5 s.

For each run: the wall time from the end of the first step to the end of the last epoch,
each epoch's wall time (the first from its first step), and the longest pause between
two progress marks (``plain``: a mark every 0.5 s and at each epoch end; ``ours``: the
chief's ``first_step``, ``train_progress`` and ``epoch_finished`` events). Configurations
alternate inside each repeat; the 1-minute load average is recorded around every run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from benchmarks.throughput import _env, _ts, run_tf_config_workers_json  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "job", "repeats", "elapsed_s", "summary", "runs", "smoke")
RECIPE = "recipes/digits_cnn.py"
BATCH = 64
_MARKS = ("first_step", "train_progress", "epoch_finished")


def run_plain(epochs: int, steps: int, work: Path) -> dict[str, Any]:
    return run_tf_config_workers_json(
        "_plain_epochs.py", [RECIPE, "--epochs", str(epochs), "--steps", str(steps), "--batch", str(BATCH)], work)


def run_ours(epochs: int, steps: int, save_every: int, work: Path) -> dict[str, Any]:
    run_dir = work / "run"
    toml = work / "job.toml"
    toml.write_text("progress_every_s = 0.5\n")
    command = [
        sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir), "--config", str(toml),
        "--workers", "2", "--epochs", str(epochs), "--steps-per-epoch", str(steps),
        "--global-batch-size", str(BATCH), "--save-every-steps", str(save_every),
    ]
    proc = subprocess.run(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"resilient-train failed ({proc.returncode}): {proc.stdout[-2000:]}")
    return ours_figures(read_events(run_dir / "events.jsonl"))


def ours_figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    """wall_s, epoch_s, longest_pause_s and the marks of one run, from its (chief's) events."""
    marks = [(e["event"], _ts(e)) for e in events if e["event"] in _MARKS and e.get("rank", 0) == 0]
    if not marks or marks[0][0] != "first_step":
        raise RuntimeError("no first_step event: the run did not train")
    origin = marks[0][1]
    times = [t - origin for _, t in marks]
    ends = [t - origin for name, t in marks if name == "epoch_finished"]
    epoch_s = [round(b - a, 3) for a, b in zip([0.0, *ends], ends)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"wall_s": round(ends[-1], 3), "epoch_s": epoch_s, "longest_pause_s": round(max(gaps), 3),
            "marks": [round(t, 3) for t in times[1:]]}


def measured(run) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rt-epochs-"))
    load_before = os.getloadavg()
    try:
        result = run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.pop("marks", None)
    return {**result, "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=4000)
    parser.add_argument("--save-every-steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-repeats", type=int, help="repeats of the tutorial's loop (default: --repeats)")
    parser.add_argument("--only", choices=["plain", "ours"], help="measure one side only")
    parser.add_argument("--out", default=str(RESULTS / "epochs.json"))
    add_smoke_flag(parser)  # 2 epochs x 30 steps, one repeat of each side
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.epochs, args.steps_per_epoch, args.save_every_steps, args.repeats, args.plain_repeats = 2, 30, 10, 1, 1
    plain_repeats = args.repeats if args.plain_repeats is None else args.plain_repeats

    sides = {
        "plain": lambda work: run_plain(args.epochs, args.steps_per_epoch, work),
        "ours": lambda work: run_ours(args.epochs, args.steps_per_epoch, args.save_every_steps, work),
    }
    if args.only:
        sides = {args.only: sides[args.only]}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    started = time.time()
    counts = {"plain": plain_repeats, "ours": args.repeats}
    for repeat in range(max(counts[name] for name in sides)):
        for name, run in sides.items():  # alternate inside each repeat
            if repeat >= counts[name]:
                continue
            result = measured(run)
            runs[name].append(result)
            print(f"repeat {repeat + 1}/{counts[name]} {name:5} wall {result['wall_s']:8.1f} s  longest pause "
                  f"{result['longest_pause_s']:6.2f} s  epochs {result['epoch_s']}  load {result['load_before']:.2f}",
                  flush=True)
    summary = {
        name: {
            "median_wall_s": round(statistics.median(r["wall_s"] for r in results), 2),
            "median_longest_pause_s": round(statistics.median(r["longest_pause_s"] for r in results), 2),
            "max_longest_pause_s": round(max(r["longest_pause_s"] for r in results), 2),
        }
        for name, results in runs.items()
    }
    report = {
        "benchmark": "epochs",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "job": {"recipe": RECIPE, "workers": 2, "epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch,
                "global_batch_size": BATCH, "save_every_steps": args.save_every_steps},
        "repeats": {name: len(results) for name, results in runs.items()},
        "elapsed_s": round(time.time() - started, 1),
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    out = write_result(args.out, report)
    lines = ["| run | wall (median) | longest pause (median / max) |", "|---|---|---|"]
    lines += [f"| {name} | {s['median_wall_s']} s | {s['median_longest_pause_s']} s / {s['max_longest_pause_s']} s |"
              for name, s in summary.items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
