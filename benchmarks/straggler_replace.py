"""``--straggler-policy replace`` against a worker throttled for real: the group's steps/s before
the throttle, under it, and after the replacement, beside the same job never throttled.

    .venv/bin/python benchmarks/straggler_replace.py             # 3 runs of 6000 steps (~6 min on 2 cores)
    .venv/bin/python benchmarks/straggler_replace.py --runs 1

Writes benchmarks/results/straggler_replace.json.

Each run is the catalogue's ``throttle-worker-replace`` (chaos/scenarios/throttle-worker-replace.toml:
``digits_cnn``, 2 workers, ``--straggler-window 6``, ``--straggler-policy replace``) run by the chaos
harness (so it is also checked: zero lost steps, the reference digest), with two changes so that
there is a pace before the throttle and a minute after the replacement: ``--steps`` steps (default
6000) and the throttle (SIGSTOP 50 ms / SIGCONT 50 ms on rank 1's process) starting after the first
commit (step 1000) instead of the first step. From ``events.jsonl``:

* ``before``, ``during``: the slope of ``train_progress``'s global step over time in attempt 1
  before ``chaos_fault_injected`` and from it to ``straggler_detected``;
* ``after``: attempt 2's slope over its ``train_progress`` within ``--after-s`` (60) seconds of the
  detection (the first attempt-2 event is its start: start-up and tracing are not in the slope);
* ``clean``: the reference run's (the same job never throttled, run once by the harness) over all of
  its ``train_progress``; ``after_over_clean`` is the issue's "at least 90 %" figure;
* ``detected_after_s`` (throttle -> named), ``training_again_after_s`` (named -> attempt 2's
  ``first_step``), the decision's numbers, the saved and restored steps.

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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import RESULTS, add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULT_KEYS = ("benchmark", "date", "host", "load_1min", "wall_s", "runs", "summary", "smoke")
RECIPE = "recipes/digits_cnn.py"
SCENARIO = "throttle-worker-replace"


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _slope(points: list[tuple[float, int]]) -> float | None:
    """Steps per second from the first to the last (time, global step); None under two points."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return round((points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]), 1)


def _progress(events: list[dict[str, Any]], attempt: int | None, lo: float, hi: float) -> list[tuple[float, int]]:
    return [(_ts(e), e["global_step"]) for e in events if e["event"] == "train_progress"
            and (attempt is None or e.get("attempt") == attempt) and lo <= _ts(e) <= hi]


def replaced_run(seed: int, root: Path, *, steps: int, after_s: float, window: float | None = None) -> dict[str, Any]:
    """One throttle-worker-replace run (throttle from the first commit on), checked by the harness."""
    from resilient_train.chaos.catalogue import by_name
    from resilient_train.chaos.harness import JobSpec, ensure_reference, run_scenario
    from resilient_train.chaos.scenarios import Trigger

    scenario = by_name(SCENARIO, ROOT / "chaos" / "scenarios")
    save_every = max(1, steps // 6)
    job = dict(scenario.job, steps_per_epoch=steps, save_every_steps=save_every,
               **({"straggler_window": window} if window is not None else {}))
    throttle = dataclasses.replace(scenario.faults[0], trigger=Trigger(event="checkpoint_committed", nth=1, attempt=1,
                                                                       mid_epoch=True))
    scenario = dataclasses.replace(scenario, job=tuple(job.items()), faults=(throttle,))
    spec = JobSpec(str(ROOT / RECIPE), workers=2, seed=0)
    load_before = _load()
    reference_spec = spec.with_overrides(scenario.overrides)
    reference = ensure_reference(reference_spec, root)
    result = run_scenario(scenario, spec, seed=seed, root=root, reference=reference)
    events = read_events(Path(result.run_dir) / "events.jsonl")
    clean_events = read_events(reference_spec.resolved().reference_dir(root) / "events.jsonl")
    record: dict[str, Any] = {
        "seed": seed, "steps": steps, "passed": result.passed, "problems": list(result.problems),
        "digest_match": result.check.digest_match, "lost_steps": result.check.lost_steps,
        "clean": _slope(_progress(clean_events, None, 0, float("inf"))),
        "load_before": load_before, "load_after": _load(),
    }
    injected = next((e for e in events if e["event"] == "chaos_fault_injected"), None)
    named = next((e for e in events if e["event"] == "straggler_detected"), None)
    first_again = next((e for e in events if e["event"] == "first_step" and e.get("attempt") == 2), None)
    if injected is None or named is None:
        return record
    t_in, t_named = _ts(injected), _ts(named)
    record.update(
        before=_slope(_progress(events, 1, 0, t_in)), during=_slope(_progress(events, 1, t_in, t_named)),
        after=_slope(_progress(events, 2, t_named, t_named + after_s)),
        detected_after_s=round(t_named - t_in, 1), rank=named["rank"], evidence=named.get("evidence"),
        slower=named["slower"], action=named.get("action"), reason=named.get("reason"), gain_s=named.get("gain_s"),
        restart_cost_s=named.get("restart_cost_s"), restart_cost_from=named.get("restart_cost_from"),
        named_at_step=named["global_step"],
        saved_step=next((e["global_step"] for e in events if e["event"] == "preempted" and e.get("role") == "chief"), None),
        restored_step=next((e["global_step"] for e in events if e["event"] == "restored" and e.get("attempt") == 2), None),
        training_again_after_s=round(_ts(first_again) - t_named, 1) if first_again else None,
        named_in_attempt_2=[e["rank"] for e in events if e["event"] == "straggler_detected" and e.get("attempt") == 2])
    if record["after"] and record["clean"]:
        record["after_over_clean"] = round(record["after"] / record["clean"], 3)
    return record


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["after_over_clean"] for r in runs if "after_over_clean" in r]
    return {
        "runs": len(runs), "replaced": sum(1 for r in runs if r.get("action") == "replace"),
        "all_passed": all(r["passed"] for r in runs), "lost_steps": [r["lost_steps"] for r in runs],
        "before": [r.get("before") for r in runs], "during": [r.get("during") for r in runs],
        "after": [r.get("after") for r in runs], "clean": [r.get("clean") for r in runs],
        "after_over_clean": ratios, "after_over_clean_median": statistics.median(ratios) if ratios else None,
        "detected_after_s": [r.get("detected_after_s") for r in runs],
        "training_again_after_s": [r.get("training_again_after_s") for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="throttled runs (default 3)")
    parser.add_argument("--steps", type=int, default=6000, help="steps of a run (default 6000)")
    parser.add_argument("--after-s", type=float, default=60.0, help="the 'after' window past the detection (60 s)")
    parser.add_argument("--out", default=str(RESULTS / "straggler_replace.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.runs, args.steps = 1, 4000  # a replacement needs a gain over the 10 s estimate: steps left
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="rt-straggler-replace-"))
    runs = []
    try:
        for seed in range(args.runs):
            runs.append(replaced_run(seed, root, steps=args.steps, after_s=args.after_s,
                                     window=3.0 if args.smoke else None))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"benchmark": "straggler_replace", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "load_1min": os.getloadavg()[0], "wall_s": round(time.monotonic() - started, 1),
              "runs": runs, "summary": summarize(runs), "smoke": args.smoke}
    print(json.dumps(report["summary"], indent=2))
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
