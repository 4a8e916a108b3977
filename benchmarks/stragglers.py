"""Stragglers slowed from outside: how soon the detector names a throttled worker, and what the
stall probe costs a clean run.

    .venv/bin/python benchmarks/stragglers.py                 # 5 throttled runs, 4 A/B pairs (~12 min on 2 cores)
    .venv/bin/python benchmarks/stragglers.py --throttled 0 --pairs 2   # only the cost

Writes benchmarks/results/stragglers.json.

* ``throttled``: the catalogue's ``throttle-worker`` (chaos/scenarios/throttle-worker.toml: the
  nemesis stops rank 1 for 50 ms in every 100 ms from the first step on, SIGSTOP/SIGCONT) with
  the job's DEFAULT window (``--straggler-window`` 20 s, ``--straggler-threshold`` 0.5) on
  ``digits_cnn``, run by the chaos harness (so each run is also checked: digest, lost steps).
  The delay is ``straggler_detected``'s time minus ``chaos_fault_injected``'s; with it the
  named rank, its evidence, slowness and stalled fraction, and the clean rank's stalls.
* ``pairs``: ``digits_cnn``, 2 workers, no warm standby, one epoch: ``--straggler-threshold off``
  (no stall probe, no detector) against the default (probe and detector on), alternating in
  each pair; steps/s is the slope between the first and the last ``train_progress`` (as
  benchmarks/throughput.py). Every run with the detector on is a clean run: its names (none
  expected) and its ranks' stalled fractions are recorded.

``os.getloadavg()`` is recorded around every run: the machine is shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
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

from benchmarks._smoke import RESULTS, add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULT_KEYS = ("benchmark", "date", "host", "load_1min", "wall_s", "throttled", "pairs", "summary", "smoke")
RECIPE = "recipes/digits_cnn.py"
SCENARIO = "throttle-worker"


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def throttled_run(seed: int, root: Path, *, steps: int, window: float | None) -> dict[str, Any]:
    """One throttle-worker run under the job's default window (``window`` None), checked by the harness."""
    from resilient_train.chaos.catalogue import by_name
    from resilient_train.chaos.harness import JobSpec, ensure_reference, run_scenario

    scenario = by_name(SCENARIO, ROOT / "chaos" / "scenarios")
    job = tuple((k, v) for k, v in scenario.job if k != "straggler_window") + (
        ("steps_per_epoch", steps), ("save_every_steps", steps))
    if window is not None:
        job += (("straggler_window", window),)
    scenario = dataclasses.replace(scenario, job=tuple(dict(job).items()))
    spec = JobSpec(str(ROOT / RECIPE), workers=2, seed=0)
    load_before = _load()
    reference = ensure_reference(spec.with_overrides(scenario.overrides), root)
    result = run_scenario(scenario, spec, seed=seed, root=root, reference=reference)
    events = read_events(Path(result.run_dir) / "events.jsonl")
    injected = next((e for e in events if e["event"] == "chaos_fault_injected"), None)
    named = [e for e in events if e["event"] == "straggler_detected"]
    progress = [e for e in events if e["event"] == "train_progress" and e.get("stalled")]
    record: dict[str, Any] = {
        "seed": seed, "passed": result.passed, "problems": list(result.problems),
        "digest_match": result.check.digest_match, "names": [(e["rank"], e.get("evidence")) for e in named],
        "clean_rank_stalled": [e["stalled"][0] for e in progress],
        "load_before": load_before, "load_after": _load(),
    }
    if injected is not None and named:
        first = named[0]
        record.update(delay_s=round(_ts(first) - _ts(injected), 1), rank=first["rank"], evidence=first.get("evidence"),
                      slower=first["slower"], stalled=first.get("stalled"), others_stalled=first.get("others_stalled"),
                      global_step=first["global_step"])
    return record


def clean_run(detector: bool, steps: int) -> dict[str, Any]:
    """One digits_cnn run without faults: steps/s, and with the detector its names and stalled fractions."""
    work = Path(tempfile.mkdtemp(prefix="rt-stragglers-"))
    run_dir = work / "run"
    (work / "job.toml").write_text("progress_every_s = 0.5\n")
    command = [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
               "--config", str(work / "job.toml"), "--workers", "2", "--epochs", "1", "--steps-per-epoch", str(steps),
               "--no-warm-standby", *([] if detector else ["--straggler-threshold", "off"])]
    load_before = _load()
    try:
        proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=900)
        if proc.returncode:
            raise RuntimeError(f"resilient-train failed ({proc.returncode}): {proc.stdout[-2000:]}")
        events = read_events(run_dir / "events.jsonl")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress = [e for e in events if e["event"] == "train_progress"]
    if len(progress) < 2:
        raise RuntimeError(f"only {len(progress)} train_progress events; use a longer run")
    rate = (progress[-1]["global_step"] - progress[0]["global_step"]) / (_ts(progress[-1]) - _ts(progress[0]))
    stalled = [e["stalled"] for e in progress if e.get("stalled")]
    return {"detector": detector, "steps_per_s": round(rate, 2), "steps": steps,
            "names": [e["rank"] for e in events if e["event"] == "straggler_detected"],
            "stalled_max_by_rank": [max(s[r] for s in stalled) for r in range(2)] if stalled else None,
            "stalled_max_gap": max((abs(s[0] - s[1]) for s in stalled), default=None),
            "load_before": load_before, "load_after": _load()}


def summarize(throttled: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> dict[str, Any]:
    delays = [t["delay_s"] for t in throttled if "delay_s" in t]
    ratios = [p["on"]["steps_per_s"] / p["off"]["steps_per_s"] for p in pairs]
    clean = [p["on"] for p in pairs]
    return {
        "throttled_runs": len(throttled), "named_throttled_rank": sum(1 for t in throttled if t.get("rank") == 1),
        "named_other_rank": sum(1 for t in throttled if any(r != 1 for r, _ in t["names"])),
        "delay_s": sorted(delays), "delay_median_s": statistics.median(delays) if delays else None,
        "all_passed": all(t["passed"] for t in throttled),
        "pairs": len(pairs), "on_over_off": [round(r, 3) for r in ratios],
        "on_over_off_median": round(statistics.median(ratios), 3) if ratios else None,
        "clean_runs_naming_someone": sum(1 for c in clean if c["names"]),
        "clean_steps": sum(c["steps"] for c in clean),
        "clean_stalled_max": max((max(c["stalled_max_by_rank"]) for c in clean if c["stalled_max_by_rank"]),
                                 default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--throttled", type=int, default=5, help="throttle-worker runs (default 5)")
    parser.add_argument("--pairs", type=int, default=4, help="A/B pairs, detector off/on (default 4)")
    parser.add_argument("--steps", type=int, default=4000, help="steps of a throttled run (default 4000)")
    parser.add_argument("--clean-steps", type=int, default=2000, help="steps of an A/B run (default 2000)")
    parser.add_argument("--out", default=str(RESULTS / "stragglers.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.throttled, args.pairs, args.steps, args.clean_steps = 1, 1, 400, 150
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="rt-stragglers-chaos-"))
    throttled = []
    try:
        for seed in range(args.throttled):
            throttled.append(throttled_run(seed, root, steps=args.steps, window=3.0 if args.smoke else None))
            print(json.dumps(throttled[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    pairs = []
    for _ in range(args.pairs):
        pair = {"off": clean_run(False, args.clean_steps), "on": clean_run(True, args.clean_steps)}
        pairs.append(pair)
        print(json.dumps(pair), flush=True)
    report = {"benchmark": "stragglers", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "load_1min": os.getloadavg()[0], "wall_s": round(time.monotonic() - started, 1),
              "throttled": throttled, "pairs": pairs, "summary": summarize(throttled, pairs), "smoke": args.smoke}
    print(json.dumps(report["summary"], indent=2))
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
