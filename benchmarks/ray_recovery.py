"""Recovery on a Ray cluster: a worker killed on another node, and a whole node lost.

Measured on the loopback Ray cluster the tests use (tests/support/raycluster.py: a head
without CPUs and 3 worker nodes of 2 CPUs, Ray's health check every 500 ms, node declared
dead after 3 misses of 500 ms), with the real CLI (``--launcher ray``) in a subprocess:

* ``worker_kill_to_first_step_s``: ``kill -9`` of a worker -> the chief's ``first_step``
  event of the next attempt, median per mode: ``warm`` (the slot actors hold ready
  standbys: TensorFlow and the recipe imported) and ``cold`` (``--no-warm-standby``), for
  the chief (rank 0, as benchmarks/recovery.py does locally: the supervisor tears the group
  down at once) and for rank 1 on the other node (``warm_rank1``: the surviving chief
  commits the memory tier's rescue, then the supervisor kills it at once; without a rescue
  it would get its teardown grace, up to 3 s).
  ``worker_kill_detection_s``: the kill -> its ``worker_exited``.
* ``node_loss_to_first_step_s``: ``Cluster.remove_node`` of rank 1's node (raylet, object
  store, every process on it) -> ``first_step`` of the next attempt, which a new placement
  group put on the spare node. ``node_loss_detection_s``: removal -> ``node_lost``.

Usage::

    .venv/bin/python benchmarks/ray_recovery.py [--kills 3] [--node-losses 2]

Writes ``benchmarks/results/ray_recovery.json`` with the machine's load average before
and after (this machine is shared; figures under load are slower than on a quiet one).
The job is ``recipes/linear_regression.py`` on 2 workers with a very long epoch and
``--storage-shared`` (the nodes share this machine's disk).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
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

from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402
from benchmarks.recovery import Events, env, ts  # noqa: E402
from tests.support.raycluster import HEALTH_CHECK, RayTestCluster, start_cluster  # noqa: E402

RECIPE = "recipes/linear_regression.py"
JOB_FLAGS = ["--epochs", "1", "--steps-per-epoch", "1000000", "--save-every-steps", "20",
             "--launcher", "ray", "--storage-shared"]
RESULT_KEYS = ("worker_kill_to_first_step_s", "worker_kill_detection_s", "node_loss_to_first_step_s",
               "node_loss_detection_s", "targets", "details", "setup", "smoke")


def start_job(cluster: RayTestCluster, run_dir: Path, *flags: str) -> tuple[subprocess.Popen, Events]:
    cmd = [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir), *JOB_FLAGS, *flags]
    job_env = {**env(), **cluster.env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, Events(run_dir / "events.jsonl")


def started(events: Events, attempt: int, timeout: float) -> dict[int, dict[str, Any]]:
    """The attempt's worker_started events by rank, once its chief finished a step."""
    events.wait(lambda r: r["event"] == "first_step" and r.get("attempt") == attempt, timeout, "first_step")
    return {r["rank"]: r for r in events.poll() if r["event"] == "worker_started" and r["attempt"] == attempt}


def wait_standbys(events: Events, attempt: int, timeout: float) -> None:
    """Both slots report a ready standby after the attempt's workers started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = events.poll()
        since = max(i for i, r in enumerate(records) if r["event"] == "worker_started" and r["attempt"] == attempt)
        if sum(1 for r in records[since:] if r["event"] == "standby_ready") >= 2:
            return
        time.sleep(0.05)
    raise TimeoutError("standbys not ready")


def worker_kills(cluster: RayTestCluster, mode: str, rank: int, kills: int, work: Path, train_s: float, timeout: float):
    flags = ["--max-restarts", str(kills + 1)] + (["--no-warm-standby"] if mode == "cold" else [])
    proc, events = start_job(cluster, work / f"run-{mode}-{rank}", *flags)
    samples = []
    try:
        for attempt in range(1, kills + 1):
            victim = started(events, attempt, timeout)[rank]
            if mode == "warm":
                wait_standbys(events, attempt, timeout)
            time.sleep(train_s)
            killed_at = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            exited = events.wait(lambda r: r["event"] == "worker_exited" and r["pid"] == victim["pid"], timeout, "exit")
            first = events.wait(lambda r: r["event"] == "first_step" and r.get("attempt") == attempt + 1, timeout, "step")
            again = [r for r in events.poll() if r["event"] == "worker_started" and r["attempt"] == attempt + 1]
            samples.append({
                "attempt": attempt + 1,
                "detection_s": round(ts(exited) - killed_at, 3),
                "kill_to_first_step_s": round(ts(first) - killed_at, 3),
                "standby": [r["standby"] for r in again],
            })
            print(mode, f"rank {rank}", samples[-1], flush=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return samples


def node_losses(cluster: RayTestCluster, losses: int, work: Path, train_s: float, timeout: float):
    proc, events = start_job(cluster, work / "run-node-loss", "--max-restarts", str(losses + 1))
    samples = []
    try:
        for attempt in range(1, losses + 1):
            victim = started(events, attempt, timeout)[1]
            time.sleep(train_s)
            removed_at = time.time()
            cluster.remove(victim["node"])
            lost = events.wait(lambda r: r["event"] == "node_lost" and r["node"] == victim["node"], timeout, "node_lost")
            first = events.wait(lambda r: r["event"] == "first_step" and r.get("attempt", 0) > attempt, timeout, "step")
            nodes = {r["node"] for r in events.poll() if r["event"] == "worker_started" and r["attempt"] == first["attempt"]}
            samples.append({
                "attempt": first["attempt"],
                "detection_s": round(ts(lost) - removed_at, 3),
                "loss_to_first_step_s": round(ts(first) - removed_at, 3),
                "moved_off_lost_node": victim["node"] not in nodes,
            })
            print("node-loss", samples[-1], flush=True)
            cluster.add_worker()  # a new spare for the next loss
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="worker kills per mode (default 3)")
    parser.add_argument("--node-losses", type=int, default=2)
    parser.add_argument("--train-s", type=float, default=1.0, help="training time before each fault")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray_recovery.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # one kill per case, one node loss
        args.kills, args.node_losses, args.train_s = 1, 1, 0.2
    load_before = os.getloadavg()
    started_at = time.time()
    cluster = start_cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="rt-ray-recovery-") as tmp:
            work = Path(tmp)
            warm = worker_kills(cluster, "warm", 0, args.kills, work, args.train_s, args.timeout)
            cold = worker_kills(cluster, "cold", 0, args.kills, work, args.train_s, args.timeout)
            warm1 = worker_kills(cluster, "warm", 1, args.kills, work, args.train_s, args.timeout)
            nodes = node_losses(cluster, args.node_losses, work, args.train_s, args.timeout)
    finally:
        cluster.cluster.shutdown()
    median = lambda samples, key: round(statistics.median(s[key] for s in samples), 3)  # noqa: E731
    result = {
        "worker_kill_to_first_step_s": {"warm": median(warm, "kill_to_first_step_s"),
                                        "cold": median(cold, "kill_to_first_step_s"),
                                        "warm_rank1": median(warm1, "kill_to_first_step_s")},
        "worker_kill_detection_s": median(warm + cold + warm1, "detection_s"),
        "node_loss_to_first_step_s": median(nodes, "loss_to_first_step_s"),
        "node_loss_detection_s": median(nodes, "detection_s"),
        "targets": {"worker_kill_warm_s": 2.0, "node_loss_s": 15.0},
        "details": {"samples": {"warm": warm, "cold": cold, "warm_rank1": warm1, "node_loss": nodes}},
        "setup": {
            "recipe": RECIPE, "workers": 2, "flags": JOB_FLAGS, "kills_per_mode": args.kills,
            "node_losses": args.node_losses, "train_s_before_fault": args.train_s,
            "cluster": "ray.cluster_utils.Cluster on 127.0.0.1: head (0 CPUs) + 3 nodes x 2 CPUs",
            "ray_health_check": HEALTH_CHECK,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, SHARED with other engineers' TF jobs and tests",
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.time() - started_at, 1),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
        "smoke": args.smoke,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
