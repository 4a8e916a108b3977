"""Parameter-server throughput: ``--strategy parameter-server`` against the plain PS loop.

    .venv/bin/python benchmarks/ps_throughput.py                       # 3 repeats
    .venv/bin/python benchmarks/ps_throughput.py --repeats 1 --steps 300  # a smoke run

Writes benchmarks/results/ps_throughput.json. Both sides: 1 coordinator, 1 ps and 2 worker
processes on loopback, the linear regression of recipes/linear_regression.py, batch 4, one
closure per step.

* ``plain``: benchmarks/_plain_ps.py, the migration guide's loop: schedule, ``join()``
  every ``--every`` steps, no checkpoints, no supervisor.
* ``ours``: ``resilient-train run --strategy parameter-server --save-every-steps EVERY``:
  the same cadence of joins, each followed by a committed checkpoint (manifest, sha256,
  weights digest).

steps/s excludes start-up on both sides: plain times from its first join to its last;
ours is the slope between the first and the last ``checkpoint_committed`` event. The
machine may be shared: ``os.getloadavg()`` is recorded around every run, and a figure
taken under load is a smoke result, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("steps", "every", "repeats", "runs", "median_steps_per_s", "ours_vs_plain", "cores", "date", "smoke")


def _ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def plain(steps: int, every: int) -> float:
    ports = _ports(4)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
               "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    script = str(ROOT / "benchmarks" / "_plain_ps.py")
    with tempfile.TemporaryDirectory(prefix="rt-ps-plain-") as tmp:
        # Its processes are killed or leave by os._exit: autograph's files go to ``tmp``.
        return _plain(script, cluster, steps, every, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": tmp})


def _plain(script: str, cluster: dict, steps: int, every: int, env: dict[str, str]) -> float:
    servers = [subprocess.Popen([sys.executable, script, role, str(i), json.dumps(cluster), "0", "1"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role, i in (("ps", 0), ("worker", 0), ("worker", 1))]
    try:
        out = subprocess.run([sys.executable, script, "chief", "0", json.dumps(cluster), str(steps), str(every)],
                             env=env, capture_output=True, text=True, check=True, timeout=600).stdout
    finally:
        for server in servers:
            server.kill()
            server.wait()
    return json.loads(out.strip().splitlines()[-1])["steps_per_s"]


def ours(steps: int, every: int) -> float:
    with tempfile.TemporaryDirectory(prefix="rt-ps-bench-") as tmp:
        subprocess.run([sys.executable, "-m", "resilient_train", "run", "recipes/linear_regression.py", "--run-dir", tmp,
                        "--strategy", "parameter-server", "--workers", "2", "--ps", "1", "--epochs", "1",
                        "--steps-per-epoch", str(steps), "--save-every-steps", str(every)],
                       cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, check=True,
                       timeout=600)
        commits = [(e["global_step"], dt.datetime.fromisoformat(e["ts"])) for e in read_events(Path(tmp) / "events.jsonl")
                   if e["event"] == "checkpoint_committed"]
    (first_step, first_ts), (last_step, last_ts) = commits[0], commits[-1]
    return (last_step - first_step) / (last_ts - first_ts).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS / "ps_throughput.json")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # two joins (ours: two commits), the fewest that give a rate
        args.repeats, args.steps, args.every = 1, 40, 20
    runs: dict[str, list[dict]] = {"plain": [], "ours": []}
    for _ in range(args.repeats):
        for name, measure in (("plain", plain), ("ours", ours)):
            before = os.getloadavg()[0]
            value = measure(args.steps, args.every)
            runs[name].append({"steps_per_s": round(value, 2), "load_before": before, "load_after": os.getloadavg()[0]})
            print(name, runs[name][-1], flush=True)
    medians = {name: statistics.median(r["steps_per_s"] for r in rs) for name, rs in runs.items()}
    result = {"steps": args.steps, "every": args.every, "repeats": args.repeats, "runs": runs,
              "median_steps_per_s": medians, "ours_vs_plain": round(medians["ours"] / medians["plain"], 3),
              "cores": os.cpu_count(), "date": dt.date.today().isoformat(), "smoke": args.smoke}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_steps_per_s"]), "ours/plain", result["ours_vs_plain"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
