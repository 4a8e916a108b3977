"""Time lost per resize of an elastic run, beside the restart a fixed-size run needs a spare for.

    .venv/bin/python benchmarks/resize.py                 # ~6 min on 2 cores
    .venv/bin/python benchmarks/resize.py --repeats 1     # a smoke run

Writes benchmarks/results/resize.json. Recipe: recipes/digits_indexed.py, global batch 32,
one epoch of 1200 steps, a save every 50 steps, the local launcher. Per repeat, two jobs:

* ``elastic`` (``--workers 1:2``): the run dir's ``local-slots`` file (the local launcher's
  capacity, docs/elastic.md) says 2; once a ``train_progress`` event reports step 225 or
  later (between two saves) it drops to 1 and rank 1 is SIGKILLed (its node is gone and no
  spare exists). The group restarts at 1 worker from the last commit (the **shrink**). 150
  steps after that attempt restored, the file says 2 again: at the next agreed save the
  group stops and restarts at 2 (the **grow**).
* ``fixed`` (``--workers 2``): the same kill with the capacity left at 2: a gang restart at
  2 workers, what a non-elastic run gets when a spare exists (without one it ends with
  ``launch_failed``).

Figures, from the events' timestamps: the shrink's and the fixed restart's kill -> first
step of the next attempt and the steps trained again (where the killed attempt reached
minus where the next one restored); the grow's capacity back -> first step at 2 workers
(with the agreed stop's part: capacity back -> ``preempted``) and its steps trained again
(0 by design). The time a resize costs in training is the seconds plus the steps trained
again at the attempt's step time. The load is recorded: a figure taken under load is a
smoke result.
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
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402
from resilient_train.rundir.layout import RunDir  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "recipe", "steps", "save_every_steps", "repeats", "load_1min", "wall_s",
               "summary", "runs", "smoke")
RECIPE = "recipes/digits_indexed.py"
STEPS, SAVE_EVERY, KILL_AT, GROW_AFTER_STEPS = 1200, 50, 225, 150

Events = list[dict[str, Any]]


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def _of(events: Events, name: str, attempt: int) -> Events:
    return [e for e in events if e["event"] == name and e.get("attempt") == attempt]


def _progress(events: Events, attempt: int) -> Events:
    return _of(events, "train_progress", attempt)


def run(mode: str, run_dir: Path) -> dict[str, Any]:
    """One job of ``mode``; returns its figures."""
    slots = RunDir(run_dir).local_slots
    run_dir.mkdir(parents=True)
    slots.write_text("2\n")
    workers = "1:2" if mode == "elastic" else "2"
    cmd = [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
           "--storage", str(run_dir / "storage"), "--workers", workers, "--epochs", "1",
           "--steps-per-epoch", str(STEPS), "--global-batch-size", "32", "--save-every-steps", str(SAVE_EVERY),
           "--no-warm-standby", "--set", "dropout=0.0"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("RT_FAULTS", None)
    marks: dict[str, float] = {}

    def kill_rank_1(events: Events) -> None:
        if mode == "elastic":
            slots.write_text("1\n")
        pid = {e["rank"]: e["pid"] for e in _of(events, "worker_started", 1)}[1]
        marks["kill"] = time.time()
        os.kill(pid, signal.SIGKILL)

    def capacity_back(events: Events) -> None:
        marks["capacity_back"] = time.time()
        slots.write_text("2\n")

    triggers: list[tuple[Callable[[Events], bool], Callable[[Events], None]]] = [
        (lambda ev: any(e["global_step"] >= KILL_AT for e in _progress(ev, 1)), kill_rank_1)]
    if mode == "elastic":
        def grown_enough(ev: Events) -> bool:
            progress = _progress(ev, 2)
            restored = _of(ev, "restored", 2)
            return bool(progress and restored
                        and progress[-1]["global_step"] >= restored[0]["global_step"] + GROW_AFTER_STEPS)
        triggers.append((grown_enough, capacity_back))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    events_path = run_dir / "events.jsonl"
    deadline = time.monotonic() + 900
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode} job in {run_dir} did not finish in 900 s")
            if triggers and events_path.exists():
                events = read_events(events_path)
                when, action = triggers[0]
                if when(events):
                    action(events)
                    triggers.pop(0)
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0 or triggers:
        raise RuntimeError(f"{mode} job in {run_dir}: exit {proc.returncode}, {len(triggers)} trigger(s) unfired")
    events = read_events(events_path)

    def reached(attempt: int) -> int:
        return _of(events, "attempt_reached", attempt)[0]["global_step"]

    def restored(attempt: int) -> int:
        return _of(events, "restored", attempt)[0]["global_step"]

    def step_s(attempt: int) -> float:
        progress = _progress(events, attempt)
        first, last = progress[0], progress[-1]
        return (_ts(last) - _ts(first)) / max(1, last["global_step"] - first["global_step"])

    sizes = [(e["attempt"], e["from"], e["to"]) for e in events if e["event"] == "world_size_changed" and "from" in e]
    figures: dict[str, Any] = {"world_size_changes": sizes}
    restart = {"kill_to_first_step_s": round(_ts(_of(events, "first_step", 2)[0]) - marks["kill"], 3),
               "steps_trained_again": reached(1) - restored(2),
               "step_s_after": round(step_s(2), 4)}
    restart["time_lost_s"] = round(restart["kill_to_first_step_s"] + restart["steps_trained_again"] * restart["step_s_after"], 3)
    figures["shrink" if mode == "elastic" else "restart"] = restart
    if mode == "elastic":
        if sizes != [(2, 2, 1), (3, 1, 2)]:
            raise RuntimeError(f"elastic job resized {sizes}, expected 2 -> 1 -> 2")
        preempted = _of(events, "preempted", 2)
        grow = {"capacity_back_to_first_step_s": round(_ts(_of(events, "first_step", 3)[0]) - marks["capacity_back"], 3),
                "capacity_back_to_agreed_save_s": round(_ts(preempted[0]) - marks["capacity_back"], 3),
                "steps_trained_again": reached(2) - restored(3),
                "step_s_1_worker": round(step_s(2), 4), "step_s_2_workers": round(step_s(3), 4)}
        grow["time_lost_s"] = round(grow["capacity_back_to_first_step_s"] + grow["steps_trained_again"] * grow["step_s_2_workers"], 3)
        figures["grow"] = grow
    elif sizes:
        raise RuntimeError(f"fixed job resized: {sizes}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "resize.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # the scenario (kill, shrink, grow; fixed restart) is fixed; one repeat of it
        args.repeats = 1
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="rt-resize-"))
    runs: dict[str, list[dict[str, Any]]] = {"elastic": [], "fixed": []}
    try:
        for repeat in range(args.repeats):
            for mode in runs:  # alternate inside each repeat
                load = os.getloadavg()[0]
                figures = run(mode, work / f"{mode}-{repeat}")
                figures["load_1min"] = round(load, 2)
                runs[mode].append(figures)
                print(mode, json.dumps(figures), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(mode: str, part: str, key: str) -> float:
        return round(statistics.median(r[part][key] for r in runs[mode]), 3)

    summary = {
        "shrink": {k: median("elastic", "shrink", k) for k in runs["elastic"][0]["shrink"]},
        "grow": {k: median("elastic", "grow", k) for k in runs["elastic"][0]["grow"]},
        "fixed_restart_with_spare": {k: median("fixed", "restart", k) for k in runs["fixed"][0]["restart"]},
    }
    loads = [r["load_1min"] for rs in runs.values() for r in rs]
    report = {"benchmark": "resize", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "recipe": RECIPE, "steps": STEPS, "save_every_steps": SAVE_EVERY, "repeats": args.repeats,
              "load_1min": {"min": min(loads), "max": max(loads)}, "wall_s": round(time.time() - started, 1),
              "summary": summary, "runs": runs, "smoke": args.smoke}
    write_result(args.out, report)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
