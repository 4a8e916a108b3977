"""What the in-worker defences against a broken group cost per step (issue 23, item 3).

    .venv/bin/python benchmarks/defences.py                  # ~3 min on 2 cores (600 steps)
    .venv/bin/python benchmarks/defences.py --steps 400 --timeouts 10 20 --max-threads 5000

Writes benchmarks/results/defences.json.

The defences (runner/training/strategy.py): the coordination service's heartbeat (pinned at
TensorFlow's 10 s default) and the registration timeout (``--startup-timeout``) are
configuration: they cost nothing per step, so "on" and "off" differ only in
``--collective-timeout``. That one is measured here, side by side in one invocation:
``resilient-train run`` of the digits recipe, 2 workers on loopback, ``--no-warm-standby``,
no mid-epoch saves, the default ``--steps-per-execution auto``; configurations alternate
inside each repeat.

* ``steps_per_s``: the slope between the first and last ``train_progress`` event (start-up
  and tracing excluded), as in throughput.py;
* ``max_threads``: the most threads any worker had (``/proc/<pid>/status``, sampled every
  0.2 s). TensorFlow arms each collective's timeout with a sleeping thread that lives for
  the whole timeout, so threads grow with ``timeout x collectives per second``; the script
  stops a run whose worker passes ``--max-threads`` (the machine's PIDs are shared) and
  says so, and ``threads_per_timeout_s`` extrapolates to longer timeouts.

``uptime`` is recorded before and after: the machine is shared, so the figures are
relative (on vs off in the same minutes), not absolute.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "recipe", "workers", "global_batch_size", "steps", "uptime_before",
               "uptime_after", "wall_s", "summary", "runs", "smoke")
RECIPE = "recipes/digits_cnn.py"
BATCH = 64


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _threads(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def run_once(timeout_s: float | None, steps: int, max_threads: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rt-defences-"))
    run_dir = work / "run"
    (work / "job.toml").write_text("progress_every_s = 0.5\n")
    command = [
        sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir), "--config", str(work / "job.toml"),
        "--workers", "2", "--epochs", "1", "--steps-per-epoch", str(steps), "--global-batch-size", str(BATCH),
        "--save-every-steps", "0", "--no-warm-standby", "--max-restarts", "0",
        "--collective-timeout", "off" if timeout_s is None else str(timeout_s),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    env.pop("RT_FAULTS", None)
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    most = 0
    aborted = False
    try:
        while proc.poll() is None:
            events = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
            pids = [e["pid"] for e in events if e["event"] == "worker_started"]
            counts = [n for n in map(_threads, pids) if n is not None]
            most = max([most, *counts])
            if most > max_threads and not aborted:
                aborted = True
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        reader.join(timeout=5)
        events = read_events(run_dir / "events.jsonl")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    progress = [e for e in events if e["event"] == "train_progress"]
    rate = None
    if len(progress) >= 2:
        rate = (progress[-1]["global_step"] - progress[0]["global_step"]) / (_ts(progress[-1]) - _ts(progress[0]))
    result: dict[str, Any] = {
        "collective_timeout_s": timeout_s,
        "returncode": proc.returncode,
        "steps_per_s": None if rate is None else round(rate, 2),
        "max_threads": most,
        "aborted_at_max_threads": aborted,
        "load_1min_after": round(os.getloadavg()[0], 2),
    }
    if proc.returncode and not aborted:
        result["output_tail"] = "".join(output)[-1500:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps per run (default 600)")
    parser.add_argument("--timeouts", type=float, nargs="+", default=[10.0], metavar="S",
                        help="--collective-timeout values measured against off (default 10: longer ones pass --max-threads here)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-threads", type=int, default=3000,
                        help="stop a run whose worker passes this many threads (default 3000)")
    parser.add_argument("--out", default=str(RESULTS / "defences.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # off and one short timeout, a few steps each
        args.steps, args.timeouts, args.repeats = 150, [2.0], 1  # fewer: one train_progress, no rate

    uptime_before = _uptime()
    started = time.time()
    configs: list[float | None] = [None, *args.timeouts]
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for timeout_s in configs:
            result = run_once(timeout_s, args.steps, args.max_threads)
            runs.append(result)
            print(f"repeat {repeat + 1}/{args.repeats} collective timeout {timeout_s or 'off':>5}: "
                  f"{result['steps_per_s']} steps/s, max threads {result['max_threads']}"
                  + (" (stopped: too many threads)" if result["aborted_at_max_threads"] else ""), flush=True)
    off = [r["steps_per_s"] for r in runs if r["collective_timeout_s"] is None and r["steps_per_s"]]
    off_threads = max((r["max_threads"] for r in runs if r["collective_timeout_s"] is None), default=0)
    summary = {}
    for timeout_s in args.timeouts:
        mine = [r for r in runs if r["collective_timeout_s"] == timeout_s]
        rates = [r["steps_per_s"] for r in mine if r["steps_per_s"]]
        extra = max(r["max_threads"] for r in mine) - off_threads
        summary[str(timeout_s)] = {
            "ratio_to_off": round(sum(rates) / len(rates) / (sum(off) / len(off)), 3) if rates and off else None,
            "extra_threads": extra,
            "threads_per_timeout_s": round(extra / timeout_s, 1),
        }
    report = {
        "benchmark": "defences",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "recipe": RECIPE, "workers": 2, "global_batch_size": BATCH, "steps": args.steps,
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "wall_s": round(time.time() - started, 1),
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
