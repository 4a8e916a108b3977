"""Training throughput: resilient-train against the TF tutorial's plain MWMS loop.

    .venv/bin/python benchmarks/throughput.py               # the table (~15 min on 2 cores)
    .venv/bin/python benchmarks/throughput.py --repeats 1 --recipes digits_cnn   # a smoke run

Writes benchmarks/results/throughput.json and .md.

Every configuration is 2 worker processes on loopback, the same recipe (model, optimizer,
loss, input) and the same global batch:

* ``plain``: benchmarks/_plain_mwms.py, the tutorial's loop (one strategy.run + reduce per
  tf.function call, no determinism, no fault tolerance); ``plain_write20``: the same plus a
  ``tf.train.Checkpoint.write`` every 20 steps on every worker.
* ``ours_*``: ``resilient-train run`` with ``--no-warm-standby`` (``ours_standbys_*``: warm
  standbys on, as by default, importing TensorFlow beside training), no mid-epoch save /
  async or sync save every 20 steps, ``--steps-per-execution N`` (``_nN``; ``_auto``: the
  default, the chief sizes calls to ~0.1 s). Every ``ours_*`` runs with the memory tier's
  default (``--snapshot-every auto``); ``ours_{nosave,async20}_*_tieroff`` are the same
  with ``--snapshot-every off``, so each pair measures what the default tier costs per step.

steps/s excludes start-up and tracing on both sides: the plain loop times from the end of
step 20 to its last step; ours is the slope between the first and the last
``train_progress`` event (reported every 0.5 s; the final epoch-end save is outside the
window, mid-epoch saves inside). Configurations alternate inside each repeat; figures are
medians over repeats, ratios are against the plain loop's median; ``os.getloadavg()`` is
recorded around every run because the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
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

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "repeats", "recipes", "load_1min", "wall_s", "summary", "runs", "smoke")
RECIPES = {
    "digits_cnn": {"recipe": "recipes/digits_cnn.py", "batch": 64, "steps": 1000},
    "wide_mlp": {"recipe": "recipes/wide_mlp.py", "batch": 32, "steps": 140},
}


def configurations(steps_per_execution: list[str]) -> dict[str, dict[str, Any]]:
    configs: dict[str, dict[str, Any]] = {
        "plain": {"kind": "plain", "save_every": 0},
        "plain_write20": {"kind": "plain", "save_every": 20},
    }

    def suffix(n: str) -> str:
        return "auto" if n == "auto" else f"n{n}"

    for n in steps_per_execution:
        configs[f"ours_nosave_{suffix(n)}"] = {"kind": "ours", "flags": ["--save-every-steps", "0"], "n": n}
        configs[f"ours_async20_{suffix(n)}"] = {"kind": "ours", "flags": ["--save-every-steps", "20"], "n": n}
    n = steps_per_execution[-1]  # the slower variants only for the last N (keeps the run short)
    configs[f"ours_sync20_{suffix(n)}"] = {"kind": "ours", "flags": ["--save-every-steps", "20", "--checkpoint-mode", "sync"], "n": n}
    configs[f"ours_standbys_async20_{suffix(n)}"] = {"kind": "ours", "flags": ["--save-every-steps", "20"], "n": n, "standby": True}
    # The memory tier is on by default (--snapshot-every auto): its cost is the default's steps/s
    # against these (without mid-epoch saves the tier snapshots at its own interval; with a
    # save every 20 steps the saves are its snapshots and what remains is the probes).
    for save_every, name in ((0, "nosave"), (20, "async20")):
        configs[f"ours_{name}_{suffix(n)}_tieroff"] = {
            "kind": "ours", "n": n, "flags": ["--save-every-steps", str(save_every), "--snapshot-every", "off"]}
    return configs


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("RT_FAULTS", None)
    return env


def run_tf_config_workers(script: str, args: list[str], work: Path, workers: int = 2) -> float:
    """``workers`` processes of a baseline ``script`` with TF_CONFIG on loopback ports.

    The script gets ``args`` and ``--out FILE``; its chief writes {"steps_per_s": ...} there.
    """
    return run_tf_config_workers_json(script, args, work, workers)["steps_per_s"]


def run_tf_config_workers_json(script: str, args: list[str], work: Path, workers: int = 2) -> dict[str, Any]:
    """:func:`run_tf_config_workers`, returning everything the chief wrote to ``--out``."""
    ports = _free_ports(workers)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    out = work / "baseline.json"
    procs = []
    for index in range(workers):
        env = _env()
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        # The baseline leaves by os._exit, so autograph's files in its temp dir are never
        # removed: give it ``work`` (deleted after the run) rather than the system's.
        env["TMPDIR"] = str(work)
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))
    errors = [p.communicate(timeout=600)[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{script} failed: {[e[-2000:] for e in errors]}")
    return json.loads(out.read_text())


def run_plain(recipe: dict[str, Any], save_every: int, work: Path) -> float:
    return run_tf_config_workers(
        "_plain_mwms.py",
        [recipe["recipe"], "--steps", str(recipe["steps"]), "--batch", str(recipe["batch"]), "--save-every", str(save_every)],
        work,
    )


def run_ours(recipe: dict[str, Any], config: dict[str, Any], work: Path) -> float:
    run_dir = work / "run"
    toml = work / "job.toml"
    # A smoke run's few steps may take under a second: a progress event after every call
    # there, so the slope always has two points.
    toml.write_text(f"progress_every_s = {recipe.get('progress_every_s', 0.5)}\n")
    command = [
        sys.executable, "-m", "resilient_train", "run", recipe["recipe"], "--run-dir", str(run_dir), "--config", str(toml),
        "--workers", "2", "--epochs", "1", "--steps-per-epoch", str(recipe["steps"]),
        "--global-batch-size", str(recipe["batch"]), "--steps-per-execution", str(config["n"]), *config["flags"],
    ]
    if not config.get("standby"):
        command.append("--no-warm-standby")
    proc = subprocess.run(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    if proc.returncode:
        raise RuntimeError(f"resilient-train failed ({proc.returncode}): {proc.stdout[-2000:]}")
    progress = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "train_progress"]
    if len(progress) < 2:
        raise RuntimeError(f"only {len(progress)} train_progress events; use a longer run")
    seconds = (_ts(progress[-1]) - _ts(progress[0]))
    return (progress[-1]["global_step"] - progress[0]["global_step"]) / seconds


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def measured(run: Callable[[Path], float]) -> dict[str, Any]:
    """``run(work_dir)``'s steps/s, with the load averages before and after it."""
    work = Path(tempfile.mkdtemp(prefix="rt-throughput-"))
    load_before = os.getloadavg()
    try:
        rate = run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"steps_per_s": round(rate, 2), "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def measure(name: str, config: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    if config["kind"] == "plain":
        return measured(lambda work: run_plain(recipe, config["save_every"], work))
    return measured(lambda work: run_ours(recipe, config, work))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--steps-per-execution", nargs="+", default=["1", "auto"], metavar="N",
                        help="N values or auto (the default); the sync and standby variants use the last")
    parser.add_argument("--only", nargs="+", metavar="CONFIG", help="measure only these configurations (plain is always measured)")
    parser.add_argument("--out", default=str(RESULTS / "throughput.json"))
    parser.add_argument("--steps", type=int, help="steps per run (default: the recipe's, 1000 digits, 140 wide_mlp)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # the plain loop against ours with async saves, on digits, one short run each
        args.repeats, args.recipes, args.steps = 1, ["digits_cnn"], 120
        args.steps_per_execution, args.only = ["auto"], ["ours_async20_auto"]
    recipes = {name: {**RECIPES[name], **({"steps": args.steps} if args.steps else {}),
                      **({"progress_every_s": 0.0} if args.smoke else {})} for name in args.recipes}

    configs = configurations(args.steps_per_execution)
    if args.only:
        unknown = sorted(set(args.only) - set(configs))
        if unknown:
            parser.error(f"unknown configuration(s) {unknown}; accepted: {sorted(configs)}")
        configs = {k: v for k, v in configs.items() if k == "plain" or k in args.only}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {r: {c: [] for c in configs} for r in args.recipes}
    started = time.time()
    for repeat in range(args.repeats):
        for recipe_name in args.recipes:
            for name, config in configs.items():  # alternate configurations inside each repeat
                result = measure(name, config, recipes[recipe_name])
                runs[recipe_name][name].append(result)
                print(f"repeat {repeat + 1}/{args.repeats} {recipe_name:10} {name:28} {result['steps_per_s']:8.2f} steps/s "
                      f"load {result['load_before'][0]:.2f}", flush=True)
    summary: dict[str, Any] = {}
    for recipe_name, by_config in runs.items():
        plain = statistics.median(r["steps_per_s"] for r in by_config["plain"])
        summary[recipe_name] = {
            name: {"median_steps_per_s": round(statistics.median(r["steps_per_s"] for r in results), 2),
                   "ratio_to_plain": round(statistics.median(r["steps_per_s"] for r in results) / plain, 3)}
            for name, results in by_config.items()
        }
    loads = [r["load_before"][0] for by in runs.values() for rs in by.values() for r in rs]
    report = {
        "benchmark": "throughput",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "repeats": args.repeats,
        "recipes": recipes,
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


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Throughput, 2 workers on loopback, medians of {report['repeats']} (load 1-min "
             f"{report['load_1min']['min']:.1f}-{report['load_1min']['max']:.1f}, {report['host']['cpus']} CPUs)", "",
             "| configuration | " + " | ".join(report["summary"]) + " |",
             "|---|" + "---|" * len(report["summary"])]
    names = list(next(iter(report["summary"].values())))
    for name in names:
        cells = [f"{s[name]['median_steps_per_s']:.1f} steps/s ({s[name]['ratio_to_plain']:.2f}x)"
                 for s in report["summary"].values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
