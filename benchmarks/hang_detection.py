"""How long a hang costs: last progress -> detected -> group killed -> training again.

For each hang scenario of the chaos catalogue (``hang-input``: a worker's input blocks
forever; ``hang-collective``: a worker stops calling the training step while its process
and TensorFlow's heartbeats stay alive), one real run through the chaos harness (real
supervisor, 2 MWMS workers, ``recipes/linear_regression.py``, the reference digest checked),
then from its ``events.jsonl``:

* ``detected_s``: the last progress -> ``hang_detected``. The last progress is the newest
  modification time of the hung attempt's step markers (``attempt-<n>/step-<rank>.txt``,
  rewritten by each worker after every call), read from the files, not from the
  supervisor; ``stall_s`` is what the watchdog itself measured (``hang_detected``'s
  ``seconds``, rounded to 0.1 s). Expected: the hang timeout, plus up to one marker read
  (0.25 s), plus the stack collection.
* ``stacks_s``: ``run_state`` -> ``hung`` to ``hang_detected`` (SIGUSR1, the dumps read back).
* ``killed_s``: the last progress -> the last ``worker_exited`` of the hung attempt.
* ``first_step_s``: the last progress -> the ``first_step`` of the next attempt (a step of
  MWMS is a collective: every worker took part). The restart part of it
  (``killed -> first step``) is TensorFlow start-up and restore, as after any crash.

Usage::

    .venv/bin/python benchmarks/hang_detection.py [--hang-timeout 5] [--seed 0]
    .venv/bin/python benchmarks/hang_detection.py --runs RUN_DIR...   # re-time finished runs

Writes ``benchmarks/results/hang_detection.json`` with the hang timeout, the date and the
machine's load (``uptime``) before and after. Event timestamps have millisecond resolution.
Before the watchdog, each of these runs hung until someone killed it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402
from resilient_train.chaos.catalogue import by_name  # noqa: E402
from resilient_train.chaos.harness import JobSpec, ensure_reference, run_scenario  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402
from resilient_train.rundir.layout import RunDir  # noqa: E402

SCENARIOS = ("hang-input", "hang-collective")
RESULT_KEYS = ("benchmark", "created_at", "hang_timeout_s", "job", "host", "load_before", "load_after", "scenarios",
               "smoke")
RECIPE = str(ROOT / "recipes" / "linear_regression.py")


def _ts(record: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(record["ts"]).timestamp()


def timings(run_dir: Path) -> dict[str, Any]:
    """The figures of the module docstring from one healed run (its first hang)."""
    records = read_events(RunDir(run_dir).events)
    hang = next(r for r in records if r["event"] == "hang_detected")
    attempt = hang["attempt"]
    markers = list(RunDir(run_dir).attempt(attempt).path.glob("step-*.txt"))
    last_progress = max(marker.stat().st_mtime for marker in markers)
    hung = next(r for r in records if r["event"] == "run_state" and r.get("to") == "hung" and r.get("attempt") == attempt)
    exits = [r for r in records if r["event"] == "worker_exited" and r.get("attempt") == attempt]
    first = next(r for r in records if r["event"] == "first_step" and r.get("attempt") == attempt + 1)
    killed = max(_ts(r) for r in exits)
    return {
        "rank": hang["rank"], "global_step": hang["global_step"], "chosen_by": hang.get("chosen_by"),
        "where": hang.get("where"), "timeout_s": hang.get("timeout_s"),
        "detected_s": round(_ts(hang) - last_progress, 2),
        "stall_s": hang["seconds"],
        "stacks_s": round(_ts(hang) - _ts(hung), 2),
        "killed_s": round(killed - last_progress, 2),
        "first_step_s": round(_ts(first) - last_progress, 2),
        "restart_s": round(_ts(first) - killed, 2),
    }


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hang-timeout", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the fault plan: which rank hangs")
    parser.add_argument("--root", type=Path, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hang_detection.json")
    parser.add_argument("--runs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="time these finished scenario runs instead of running new ones (updates --out's rows)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    # --smoke: already the smallest run that gives every figure (one reference, each scenario once)
    if not args.hang_timeout > 0:
        parser.error(f"--hang-timeout {args.hang_timeout}: expected seconds > 0")
    if args.runs:
        report = json.loads(args.out.read_text())
        rows = {row["run_dir"]: row for row in report["scenarios"]}
        for run_dir in args.runs:
            rows[str(run_dir)].update(timings(run_dir))
        report["retimed_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report["scenarios"], indent=2))
        return 0

    root = args.root or Path(tempfile.mkdtemp(prefix="rt-hang-bench-"))
    load_before = _uptime()
    spec = JobSpec(RECIPE, workers=2, seed=0)
    reference = ensure_reference(spec, root)
    results = []
    for name in SCENARIOS:
        scenario = dataclasses.replace(by_name(name), job=(("hang_timeout", args.hang_timeout),))
        started = time.monotonic()
        result = run_scenario(scenario, spec, seed=args.seed, root=root, reference=reference)
        row: dict[str, Any] = {"scenario": name, "passed": result.passed, "run_dir": result.run_dir,
                               "wall_s": round(time.monotonic() - started, 1),
                               "problems": list(result.problems) + list(result.check.violations)}
        try:
            row.update(timings(Path(result.run_dir)))
        except StopIteration:
            row["error"] = "the run has no hang_detected / next first_step to time"
        results.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "benchmark": "hang_detection",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hang_timeout_s": args.hang_timeout,
        "job": {"recipe": "recipes/linear_regression.py", "workers": 2, "seed": args.seed},
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "load_before": load_before,
        "load_after": _uptime(),
        "scenarios": results,
        "smoke": args.smoke,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
