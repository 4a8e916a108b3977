"""False positives: clean multi-epoch runs with every detector at its default, counted.

    .venv/bin/python benchmarks/clean_runs.py                  # 20 runs, digits_cnn, 2 workers, 3 x 1500 steps
    .venv/bin/python benchmarks/clean_runs.py --runs 5 --recipe recipes/digits_keras.py

Writes benchmarks/results/clean_runs.json. Issues 48 and 49 set the same bar: clean runs name
nothing. Each run here is an ordinary ``resilient-train run`` of ``--recipe`` (2 workers,
``--epochs`` x ``--steps-per-epoch``, a save every ``--save-every-steps``, the runner's defaults
otherwise: the straggler detector and its stall probe, the non-finite check, the replicas'
comparison every 100 steps, the hang watchdog, the memory tier), nothing injected. From each
run's events.jsonl: the steps trained, the digest, and the count of every event a false
positive would leave (``FALSE_POSITIVE_EVENTS``); ``summary`` adds them up. The runs are
identical jobs, so every digest must be the same (``digests`` holds the distinct ones).
The machine is shared: the 1-minute load before and after each run is recorded, and a busy
machine is the harder test (both workers slowed alike must not read as one straggler).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import RESULTS, add_smoke_flag, check_smoke_out, write_result  # noqa: E402

RESULT_KEYS = ("benchmark", "date", "host", "job", "summary", "runs", "smoke")
# What a detector leaves when it fires (docs/events.md): stragglers, numerical health, hangs.
FALSE_POSITIVE_EVENTS = ("straggler_detected", "straggler_replaced", "anomaly_detected", "rolled_back",
                         "batch_skipped", "host_suspected", "hang_detected")
WORKERS, BATCH = 2, 64
TIMEOUT_S = 1800.0


def run_once(run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "resilient_train", "run", args.recipe, "--run-dir", str(run_dir),
               "--workers", str(WORKERS), "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch),
               "--global-batch-size", str(BATCH), "--save-every-steps", str(args.save_every_steps)]
    load_before, started = os.getloadavg()[0], time.monotonic()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT_S)
    wall = time.monotonic() - started
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    counts = {name: sum(e["event"] == name for e in events) for name in FALSE_POSITIVE_EVENTS}
    return {"exit_code": done.returncode, "wall_s": round(wall, 1), "steps": summary.get("global_step"),
            "restarts": summary.get("restarts"), "weights_sha256": summary.get("weights_sha256"),
            "false_positives": counts, "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="clean runs (default 20)")
    parser.add_argument("--recipe", default="recipes/digits_cnn.py")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=1500)
    parser.add_argument("--save-every-steps", type=int, default=200)
    parser.add_argument("--out", default=str(RESULTS / "clean_runs.json"))
    add_smoke_flag(parser)  # one run of 2 x 50 steps
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.runs, args.epochs, args.steps_per_epoch, args.save_every_steps = 1, 2, 50, 20
    work = Path(tempfile.mkdtemp(prefix="rt-clean-"))
    runs = []
    try:
        for n in range(1, args.runs + 1):
            record = run_once(work / f"run-{n}", args)
            runs.append(record)
            print(f"run {n}/{args.runs}: exit {record['exit_code']}, {record['steps']} steps, "
                  f"{sum(record['false_positives'].values())} false positives, load {record['load']}", flush=True)
            shutil.rmtree(work / f"run-{n}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "clean_runs",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "job": {"recipe": args.recipe, "workers": WORKERS, "epochs": args.epochs,
                "steps_per_epoch": args.steps_per_epoch, "global_batch_size": BATCH,
                "save_every_steps": args.save_every_steps},
        "summary": {"runs": len(runs), "completed": sum(r["exit_code"] == 0 for r in runs),
                    "steps": sum(r["steps"] or 0 for r in runs),
                    "false_positives": {name: sum(r["false_positives"][name] for r in runs)
                                        for name in FALSE_POSITIVE_EVENTS},
                    "digests": sorted({r["weights_sha256"] for r in runs if r["weights_sha256"]})},
        "runs": runs,
        "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps(report["summary"], indent=2))
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
