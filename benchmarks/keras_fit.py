"""Throughput of a compiled Keras model: resilient-train against legacy ``tf_keras`` ``fit``.

    .venv/bin/python benchmarks/keras_fit.py                         # ~10 min on 2 cores
    .venv/bin/python benchmarks/keras_fit.py --repeats 1 --steps 300  # a smoke run

Needs the ``bench`` extra (``pip install -e .[bench]``: legacy ``tf_keras``). Writes
benchmarks/results/keras_fit.json and .md.

What a Keras user runs instead on TF 2.21 (Keras 3's ``fit`` fails under
MultiWorkerMirroredStrategy, issue 19) against resilient-train, on the same compiled model,
input and global batch (benchmarks/_keras_digits.py: recipes/digits_keras.py without its
callbacks and evaluation), 2 worker processes on loopback, one epoch of ``--steps`` steps:

* ``fit``: benchmarks/_tf_keras_fit.py, ``tf_keras`` ``model.fit`` under MWMS (TF_CONFIG),
  no fault tolerance; ``fit_backup20``: the same with
  ``tf_keras.callbacks.BackupAndRestore(save_freq=20)`` (restores the epoch and weights;
  a mid-epoch kill replays or skips batches, and no callback state is kept).
* ``ours_*``: ``resilient-train run`` with ``--no-warm-standby``, an async save every 20
  steps (exact resume: input position and callback state included), with
  ``--steps-per-execution 1`` (``_n1``, as ``fit``'s default) and ``auto`` (the default).

steps/s is steady state on both sides, as in benchmarks/throughput.py (whose helpers this
reuses): ``fit`` from the end of step 20 to the end of the last step; ours the slope
between the first and last ``train_progress`` events. Configurations alternate inside
each repeat; figures are medians over repeats; ratios are against ``fit`` and
``fit_backup20``. The load (``os.getloadavg()`` around each run, ``uptime`` at start and
end) is recorded because the machine is shared: compare ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import RESULTS, measured, run_ours, run_tf_config_workers  # noqa: E402

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402

RECIPE = "benchmarks/_keras_digits.py"
SAVE_EVERY = 20
RESULT_KEYS = ("benchmark", "date", "host", "versions", "repeats", "recipe", "workers", "uptime", "load_1min",
               "wall_s", "summary", "runs", "smoke")
CONFIGS: dict[str, dict[str, Any]] = {
    "fit": {"kind": "fit", "backup_every": 0},
    "fit_backup20": {"kind": "fit", "backup_every": SAVE_EVERY},
    "ours_async20_n1": {"kind": "ours", "flags": ["--save-every-steps", str(SAVE_EVERY)], "n": "1"},
    "ours_async20_auto": {"kind": "ours", "flags": ["--save-every-steps", str(SAVE_EVERY)], "n": "auto"},
}


def run_fit(recipe: dict[str, Any], backup_every: int, work: Path) -> float:
    args = [recipe["recipe"], "--steps", str(recipe["steps"]), "--batch", str(recipe["batch"])]
    if backup_every:
        args += ["--backup-every", str(backup_every), "--backup-dir", str(work / "backup")]
    return run_tf_config_workers("_tf_keras_fit.py", args, work)


def measure(config: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    if config["kind"] == "fit":
        return measured(lambda work: run_fit(recipe, config["backup_every"], work))
    return measured(lambda work: run_ours(recipe, config, work))


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600, help="steps per run (the first 20 are warm-up)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--out", default=str(RESULTS / "keras_fit.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # every configuration once, the shortest run that has a measured window
        args.repeats, args.steps = 1, 150  # auto runs ~12 steps a call: fewer give one train_progress
    if args.steps <= 40:
        parser.error(f"--steps {args.steps}: expected > 40 (20 warm-up steps, then a window of at least 20)")
    try:
        import tf_keras  # noqa: F401
    except ImportError:
        parser.error("the fit baseline needs legacy tf_keras: pip install -e '.[bench]'")

    recipe = {"recipe": RECIPE, "batch": args.batch, "steps": args.steps}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    started, uptime_start = time.time(), uptime()
    for repeat in range(args.repeats):
        for name, config in CONFIGS.items():  # alternate configurations inside each repeat
            result = measure(config, recipe)
            runs[name].append(result)
            print(f"repeat {repeat + 1}/{args.repeats} {name:20} {result['steps_per_s']:8.2f} steps/s "
                  f"load {result['load_before'][0]:.2f}", flush=True)
    medians = {name: statistics.median(r["steps_per_s"] for r in results) for name, results in runs.items()}
    summary = {
        name: {"median_steps_per_s": round(rate, 2), "ratio_to_fit": round(rate / medians["fit"], 3),
               "ratio_to_fit_backup20": round(rate / medians["fit_backup20"], 3)}
        for name, rate in medians.items()
    }
    loads = [r["load_before"][0] for results in runs.values() for r in results]
    report = {
        "benchmark": "keras_fit",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": _versions(),
        "repeats": args.repeats,
        "recipe": recipe,
        "workers": 2,
        "uptime": {"start": uptime_start, "end": uptime()},
        "load_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "wall_s": round(time.time() - started, 1),
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    out = write_result(args.out, report)
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("tensorflow", "keras", "tf-keras")}


def markdown(report: dict[str, Any]) -> str:
    recipe = report["recipe"]
    lines = [f"Compiled Keras model, 2 workers on loopback, {recipe['steps']} steps at global batch {recipe['batch']}, "
             f"medians of {report['repeats']} ({report['date']}; load 1-min {report['load_1min']['min']:.1f}-"
             f"{report['load_1min']['max']:.1f} on {report['host']['cpus']} CPUs)", "",
             "| configuration | steps/s | vs fit | vs fit_backup20 |", "|---|---|---|---|"]
    for name, s in report["summary"].items():
        lines.append(f"| {name} | {s['median_steps_per_s']:.1f} | {s['ratio_to_fit']:.2f}x | {s['ratio_to_fit_backup20']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
