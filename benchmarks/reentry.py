"""Mid-epoch re-entry cost: restore-to-first-step at the start vs the end of a long epoch.

    .venv/bin/python benchmarks/reentry.py                 # ~5 min on 2 cores
    .venv/bin/python benchmarks/reentry.py --repeats 1     # a smoke run

Writes benchmarks/results/reentry.json. Recipe: tests/recipes/input_bound.py (synthetic
256x256 images, blurred and resized per batch: input-bound), 400 steps per epoch, 2
workers. For each re-entry position (step_in_epoch ``early`` and ``late``) a job is killed
right after committing that step (fault ``after_commit``); then, per repeat, a copy of its
checkpoint store is resumed and timed from the ``restored`` event to the ``first_step``
event (the resumed job is killed there). Four re-entry paths: ``start_step`` (input_bound.py,
positions its index range before the expensive map), ``skip`` (input_bound_skip.py with
``--max-iterator-state-bytes 0``: the runner's ``skip()``, which runs the map of every
skipped batch), ``iterator_state`` (input_bound_skip.py as it is: each worker's saved
tf.data iterator state is restored, runner/input/iterator_state.py) and ``indexed``
(input_bound_indexed.py, the indexed contract: the runner starts its range of positions at
the step, runner/input/indexed.py). Two more for an ordinary pipeline (issue 33):
tests/recipes/input_decoded.py, ``range -> map -> batch`` of 32x32 images decoded from
256x256 without ``start_step``: ``symbolic`` (as it is: the tf.data iterator state saved
with symbolic checkpointing, positions only) and ``decoded_skip`` (``--max-iterator-state-bytes
0``: the ``skip()`` it fell back to when its state held the prefetched batches). Each resumed
job's ``restored`` event must name the path (``input_reentry``). Target: late <= 1.2x early.
``--recipes indexed,skip`` runs a subset.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
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
from resilient_train.rundir.events import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "steps_per_epoch", "positions", "repeats", "load_1min", "wall_s", "summary",
               "runs", "smoke")
# name -> (recipe, extra flags, the restored event's input_reentry)
RECIPES = {"start_step": ("tests/recipes/input_bound.py", [], "start_step"),
           "skip": ("tests/recipes/input_bound_skip.py", ["--max-iterator-state-bytes", "0"], "skip"),
           "iterator_state": ("tests/recipes/input_bound_skip.py", [], "iterator_state"),
           "indexed": ("tests/recipes/input_bound_indexed.py", [], "indexed"),
           "symbolic": ("tests/recipes/input_decoded.py", [], "iterator_state"),
           "decoded_skip": ("tests/recipes/input_decoded.py", ["--max-iterator-state-bytes", "0"], "skip")}
STEPS_PER_EPOCH = 400
POSITIONS = {"early": 20, "late": 380}  # issue 20's positions (before 2026-11-24: 8 and 392)


def _flags(run_dir: Path, storage: Path, save_every: int) -> list[str]:
    return ["--run-dir", str(run_dir), "--storage", str(storage), "--epochs", "1", "--steps-per-epoch",
            str(STEPS_PER_EPOCH), "--global-batch-size", "8", "--save-every-steps", str(save_every),
            "--no-warm-standby", "--max-restarts", "0",
            "--snapshot-every", "off"]  # the kill's checkpoint is the step measured: no newer rescue


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("RT_FAULTS", None)
    env.update(extra)
    return env


def make_checkpoint(path: str, step: int, work: Path) -> Path:
    """A checkpoint store whose newest commit is mid-epoch step ``step`` (re-entry ``path``)."""
    recipe, extra, _ = RECIPES[path]
    storage = work / "storage"
    faults = json.dumps([{"point": "after_commit", "global_step": step, "rank": 0}])
    subprocess.run([sys.executable, "-m", "resilient_train", "run", recipe, *_flags(work / "make", storage, step), *extra],
                   cwd=ROOT, env=_env(RT_FAULTS=faults), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)
    return storage


def time_reentry(path: str, storage: Path, step: int, work: Path) -> float:
    """Seconds from ``restored`` to ``first_step`` of a job resuming from ``storage`` by ``path``."""
    recipe, extra, reentry = RECIPES[path]
    copy = work / "storage-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(storage, copy)
    run_dir = work / "resume"
    shutil.rmtree(run_dir, ignore_errors=True)
    # A new run dir resumes the copied store: it takes over the store's ownership (docs/storage.md).
    proc = subprocess.Popen([sys.executable, "-m", "resilient_train", "run", recipe, *_flags(run_dir, copy, step),
                             *extra, "--force-storage"],
                            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            events = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
            restored = [e for e in events if e["event"] == "restored"]
            first = [e for e in events if e["event"] == "first_step"]
            if restored and first:
                if (restored[0]["step_in_epoch"], restored[0].get("input_reentry")) != (step, reentry):
                    raise RuntimeError(f"restored {restored[0]} instead of step {step} by {reentry}")
                return _ts(first[0]) - _ts(restored[0])
            time.sleep(0.05)
        raise RuntimeError(f"no restored/first_step events in {run_dir}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "reentry.json"))
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated subset of {list(RECIPES)}")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # one repeat of the O(1) indexed path (skip() at step 380 alone takes over a minute)
        args.repeats, args.recipes = 1, "indexed"
    chosen = args.recipes.split(",")
    unknown = sorted(set(chosen) - set(RECIPES))
    if unknown:
        parser.error(f"Received --recipes {args.recipes}; unknown {unknown}, expected names from {list(RECIPES)}")
    recipes = [name for name in RECIPES if name in chosen]
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="rt-reentry-"))
    try:
        stores = {(r, p): make_checkpoint(r, step, work / f"{r}-{p}")
                  for r in recipes for p, step in POSITIONS.items()}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {r: {p: [] for p in POSITIONS} for r in recipes}
        for _ in range(args.repeats):
            for recipe in recipes:
                for position, step in POSITIONS.items():  # alternate inside each repeat
                    load = os.getloadavg()[0]
                    seconds = time_reentry(recipe, stores[(recipe, position)], step, work / "t")
                    runs[recipe][position].append({"seconds": round(seconds, 3), "load_1min": round(load, 2)})
                    print(f"{recipe:14} {position:5} step_in_epoch {step:3}: {seconds:6.2f} s (load {load:.2f})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for recipe, by_position in runs.items():
        medians = {p: statistics.median(r["seconds"] for r in rs) for p, rs in by_position.items()}
        summary[recipe] = {**{f"{p}_median_s": round(m, 3) for p, m in medians.items()},
                           "late_over_early": round(medians["late"] / medians["early"], 3)}
    loads = [r["load_1min"] for by in runs.values() for rs in by.values() for r in rs]
    report = {
        "benchmark": "reentry",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "steps_per_epoch": STEPS_PER_EPOCH,
        "positions": POSITIONS,
        "repeats": args.repeats,
        "load_1min": {"min": min(loads), "max": max(loads)},
        "wall_s": round(time.time() - started, 1),
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
