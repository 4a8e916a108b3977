"""Recovery time after ``kill -9`` of the chief: detection, restart to the first step, restore.

What it answers, all measured in one invocation on the same machine:

* ``detection_s_p50/p95``: ``kill -9`` of the chief -> the supervisor's ``worker_exited``
  event for it (the OS tells the supervisor; no TensorFlow timeout involved). Pooled over
  the warm and the cold runs.
* ``kill_to_first_step_s``: ``kill -9`` -> the chief's ``first_step`` event of the next
  attempt (a step of MWMS is a collective, so every worker took part in it), median per
  run: ``warm`` (default, standbys ready before each kill), ``warm_rank1`` (the same, but the
  non-chief is killed: the chief survives, commits the memory tier's rescue and is stopped)
  and ``cold`` (--no-warm-standby). ``--goodput-job`` runs the goodput benchmark's job
  (digits_cnn, a save every 200 steps) instead of the linear regression.
* ``baseline_tree`` (with ``--baseline-tree DIR``, a checkout of an older commit): every
  kill-cycle run repeated right after ours with that checkout's runner, so a change to the
  restart path is measured side by side with the old path in one invocation.
* ``breakdown_s``: where kill -> first step goes, median per phase per mode: the
  supervisor's share from its events (``detection``: kill -> the chief's ``worker_exited``;
  ``stop_old_group``: -> the old attempt's last ``worker_exited``; ``launch``: -> the new
  chief's start: a standby read its assignment, or a cold process was created), then the new
  chief's phases from its ``startup_phases`` event (docs/events.md). The phases of one
  sample add up to its kill_to_first_step_s (up to the event's millisecond resolution).
* ``baseline_tf_timeout_plus_cold_s``: what recovery costs when TensorFlow's own failure
  detection is what notices: a 2-worker group started without a supervisor, the chief
  killed, and the time until the survivor exits by itself (its collective error), plus the
  cold restart measured above (cold kill-to-first-step minus cold detection).
* ``restore_s``: ``CheckpointStore.fetch`` of a ``--restore-mb`` checkpoint into a fresh
  per-worker cache: ``local_cache`` (the host cache written through at commit: link and
  sha256-verify) vs ``shared`` (download from a local SeaweedFS S3 server with sha256).
  The tiny linear-regression checkpoints of the kill runs are reported too
  (``restore_in_runs_s``, from the workers' ``checkpoint_fetched`` events).

Usage::

    .venv/bin/python benchmarks/recovery.py [--kills 4] [--baseline-kills 2] [--restore-mb 64]
        [--goodput-job] [--baseline-tree DIR]

Writes ``benchmarks/results/recovery.json``. Times are wall clock; event timestamps have
millisecond resolution. The job is ``recipes/linear_regression.py`` on 2 workers with a
very long epoch; before each kill the group has trained for ``--train-s`` seconds and, in
warm mode, the pool holds 2 ready standbys.
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

from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402
from resilient_train.cluster.ports import free_ports  # noqa: E402
from resilient_train.cluster.tf_config import build_tf_config  # noqa: E402
from resilient_train.rundir.events import EventReader  # noqa: E402

RECIPE = "recipes/linear_regression.py"
JOB_FLAGS = ["--epochs", "1", "--steps-per-epoch", "1000000", "--save-every-steps", "20"]
RESULT_KEYS = ("detection_s_p50", "detection_s_p95", "kill_to_first_step_s", "breakdown_s", "baseline_tree",
               "baseline_tf_timeout_plus_cold_s", "restore_s", "warm_over_baseline", "details", "setup", "smoke")
# The supervisor's share of a restart, from its events (kill -> the new chief's start), then the
# new chief's own phases (its startup_phases event, runner/process/startup_phases.py), in order.
SUPERVISOR_PHASES = ("detection", "stop_old_group", "launch")


class Events:
    """Incremental reader of a run's events.jsonl that keeps every record seen."""

    def __init__(self, path: Path) -> None:
        self.path, self.reader, self.records = path, EventReader(path), []

    def poll(self) -> list[dict[str, Any]]:
        self.records.extend(self.reader.read_new())
        return self.records

    def wait(self, predicate, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.poll():
                if predicate(record):
                    return record
            time.sleep(0.02)
        raise TimeoutError(f"no {what} within {timeout} s ({self.path})")


def ts(record: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(record["ts"]).timestamp()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("RT_FAULTS", None)
    e["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return e


def tree_env(tree: Path) -> dict[str, str]:
    """env() whose ``resilient_train`` is the one in ``tree``."""
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [e.get("PYTHONPATH")])])
    return e


def kill_cycles(mode: str, kills: int, work: Path, train_s: float, timeout: float, *,
                rank: int = 0, recipe: str = RECIPE, job_flags: list[str] = JOB_FLAGS,
                tree: Path = ROOT) -> list[dict[str, Any]]:
    """``kills`` cycles of: train ``train_s``, ``kill -9`` rank ``rank``, wait for the next
    attempt's first step. ``tree``: the checkout whose runner runs (``--baseline-tree``)."""
    run_dir = work / f"run-{mode}-rank{rank}-{tree.name}"
    flags = [*job_flags, "--max-restarts", str(kills + 1)]
    if mode == "cold":
        flags.append("--no-warm-standby")
    cmd = [sys.executable, "-m", "resilient_train", "run", str(ROOT / recipe), "--run-dir", str(run_dir), *flags]
    proc = subprocess.Popen(cmd, cwd=tree, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = Events(run_dir / "events.jsonl")
    samples = []
    try:
        for attempt in range(1, kills + 1):
            started = events.wait(lambda r: r["event"] == "first_step" and r.get("attempt") == attempt, timeout,
                                  "first_step")
            # Some training first: an attempt's first calls are short (call sizing, the memory
            # tier's probes and its second trace), and a kill every second of an attempt that
            # has trained one step looks like a crash loop (two attempts failing at one step).
            events.wait(lambda r: r["event"] == "train_progress" and r.get("attempt") == attempt
                        and r["global_step"] >= started["global_step"] + MIN_STEPS_BEFORE_KILL, timeout, "progress")
            victim = events.wait(
                lambda r: r["event"] == "worker_started" and r["attempt"] == attempt and r["rank"] == rank, 5, "victim"
            )
            if mode == "warm":  # the pool is full of ready standbys before we kill
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    records = events.poll()
                    taken = {r["pid"] for r in records if r["event"] == "worker_started"}
                    ready = {r["pid"] for r in records if r["event"] == "standby_ready"} - taken
                    if len(ready) >= 2:
                        break
                    time.sleep(0.05)
                else:
                    raise TimeoutError("standbys not ready")
            time.sleep(train_s)
            killed_at = time.time()
            os.kill(victim["pid"], signal.SIGKILL)
            exited = events.wait(lambda r: r["event"] == "worker_exited" and r["pid"] == victim["pid"], timeout, "exit")
            first = events.wait(
                lambda r: r["event"] == "first_step" and r.get("attempt") == attempt + 1, timeout, "first step"
            )
            phases = events.wait(lambda r: r["event"] == "startup_phases" and r.get("attempt") == attempt + 1
                                 and r.get("rank") == 0, timeout, "startup_phases")
            try:  # (a baseline tree from before every rank reported its phases has none)
                peer = events.wait(lambda r: r["event"] == "startup_phases" and r.get("attempt") == attempt + 1
                                   and r.get("rank") == 1, 2.0, "rank 1's startup_phases")
            except TimeoutError:
                peer = None
            records = events.poll()
            started = [r for r in records if r["event"] == "worker_started" and r["attempt"] == attempt + 1]
            old_exits = [ts(r) for r in records if r["event"] == "worker_exited" and r["attempt"] == attempt]
            chief_start = ts(first) - phases["total_s"]  # the new chief's start mark (startup_phases.py)
            fetched = [r for r in records if r["event"] == "checkpoint_fetched" and r.get("attempt") == attempt + 1]
            samples.append({
                "attempt": attempt + 1,
                "killed_rank": rank,
                "detection_s": round(ts(exited) - killed_at, 3),
                "kill_to_first_step_s": round(ts(first) - killed_at, 3),
                "phases": {
                    "detection": round(ts(exited) - killed_at, 3),
                    "stop_old_group": round(max(old_exits) - ts(exited), 3),
                    "launch": round(chief_start - max(old_exits), 3),
                    **phases["phases"],
                },
                "chief_start": phases["start"],
                "traces": phases["traces"],
                "peer_phases": None if peer is None else {"start": peer["start"], **peer["phases"]},
                "standby": [r["standby"] for r in started],
                "restore": [(r["source"], r["seconds"]) for r in fetched],
                "restored_step": next((r["global_step"] for r in records if r["event"] == "restored"
                                       and r.get("attempt") == attempt + 1), None),
            })
            print(mode, samples[-1], flush=True)
    finally:
        proc.send_signal(signal.SIGKILL)  # the supervisor; workers and standbys follow (parent-death signal)
        proc.wait()
    return samples


def tf_timeout(work: Path, index: int, train_s: float, timeout: float) -> float:
    """A group with no supervisor: kill -9 the chief, time until the survivor exits by itself."""
    run_dir = work / f"baseline-{index}"
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for rank in range(2):
        e = env()
        e.update(TF_CONFIG=json.dumps(build_tf_config(addresses, rank)), RT_ATTEMPT="1", RT_RUN_ID="baseline")
        log = open(run_dir.parent / f"baseline-{index}-worker-{rank}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "resilient_train.runner", RECIPE, "--run-dir", str(run_dir), *JOB_FLAGS],
            cwd=ROOT, env=e, stdout=log, stderr=subprocess.STDOUT,
        ))
    try:
        Events(run_dir / "events.jsonl").wait(lambda r: r["event"] == "first_step", timeout, "first_step")
        time.sleep(train_s)
        killed_at = time.monotonic()
        procs[0].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=timeout)
        survivor_s = time.monotonic() - killed_at
        print("baseline survivor exit", procs[1].returncode, round(survivor_s, 3), flush=True)
        return survivor_s
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def restore_times(work: Path, mb: int, repeats: int) -> dict[str, Any]:
    from benchmarks.storage_throughput import make_checkpoint
    from tests.support.s3server import SeaweedS3

    staging = work / "restore-staging" / "ckpt-000000000001"
    staging.mkdir(parents=True)
    size = make_checkpoint(staging, mb)
    quiet = lambda *a, **k: None  # noqa: E731
    times: dict[str, list[float]] = {"local_cache": [], "shared": []}
    with SeaweedS3(work / "seaweed") as server:
        target = server.target("recovery-bench")
        chief = CheckpointStore(target.url_prefix, target.storage_options, host_cache=work / "host-cache", emit=quiet)
        chief.commit(staging, run_id="bench", epoch=0, step_in_epoch=1, global_step=1, world_size=2,
                     weights_sha256="0" * 64, tf_version="bench")
        with_cache = CheckpointStore(target.url_prefix, target.storage_options, host_cache=work / "host-cache", emit=quiet)
        without = CheckpointStore(target.url_prefix, target.storage_options, emit=quiet)
        for i in range(repeats):
            for name, store in (("local_cache", with_cache), ("shared", without)):
                start = time.perf_counter()
                store.restore_latest(work / f"cache-{name}-{i}")  # listing + manifest + files
                times[name].append(time.perf_counter() - start)
    return {"bytes": size, "repeats": repeats, "all_s": {k: [round(v, 4) for v in vs] for k, vs in times.items()},
            "median_s": {k: round(statistics.median(vs), 4) for k, vs in times.items()}}


def median_phases(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's median over the samples, in the order of the first sample's phases."""
    names = list(samples[0]["phases"])
    for sample in samples[1:]:
        names += [n for n in sample["phases"] if n not in names]
    return {n: round(statistics.median(s["phases"].get(n, 0.0) for s in samples), 3) for n in names}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 3)


# --goodput-job: the goodput benchmark's job (benchmarks/goodput.py), its per-kill standstill broken down.
GOODPUT_RECIPE = "recipes/digits_cnn.py"
GOODPUT_FLAGS = ["--epochs", "1", "--steps-per-epoch", "1000000", "--global-batch-size", "64",
                 "--save-every-steps", "200"]
MIN_STEPS_BEFORE_KILL = 10  # steps an attempt trains past its first before train_s starts
# The kill-cycle runs, in order: (name, mode, killed rank). ``warm_rank1`` kills a non-chief:
# the chief survives, commits the rescue (memory tier) and is stopped.
RUNS = (("warm", "warm", 0), ("warm_rank1", "warm", 1), ("cold", "cold", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=4, help="kills per run (default 4)")
    parser.add_argument("--baseline-kills", type=int, default=2)
    parser.add_argument("--restore-mb", type=int, default=64)
    parser.add_argument("--train-s", type=float, default=1.0, help="training time before each kill")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--goodput-job", action="store_true",
                        help=f"run {GOODPUT_RECIPE} with the goodput benchmark's flags instead of {RECIPE}")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="another checkout (e.g. a git worktree of an older commit): each kill-cycle run is "
                        "repeated with its runner right after ours, and reported under 'baseline_tree'")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recovery.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.baseline_tree is not None and not (args.baseline_tree / "resilient_train").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree}: no resilient_train package there; expected a checkout")
    if args.smoke:  # one kill per run, one baseline kill, a 1 MiB restore
        args.kills, args.baseline_kills, args.restore_mb, args.train_s = 1, 1, 1, 0.2
    recipe, job_flags = (GOODPUT_RECIPE, GOODPUT_FLAGS) if args.goodput_job else (RECIPE, JOB_FLAGS)
    trees = {"ours": ROOT} if args.baseline_tree is None else {"ours": ROOT, "baseline_tree": args.baseline_tree.resolve()}
    load_before = os.getloadavg()
    started = time.time()
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {label: {} for label in trees}
    with tempfile.TemporaryDirectory(prefix="rt-recovery-") as tmp:
        work = Path(tmp)
        for name, mode, rank in RUNS:
            for label, tree in trees.items():
                samples[label][name] = kill_cycles(mode, args.kills, work, args.train_s, args.timeout, rank=rank,
                                                   recipe=recipe, job_flags=job_flags, tree=tree)
        survivor = [tf_timeout(work, i, args.train_s, args.timeout) for i in range(args.baseline_kills)]
        restore = restore_times(work, args.restore_mb, 1 if args.smoke else 3)
    ours = samples["ours"]
    warm, cold = ours["warm"], ours["cold"]
    detections = [s["detection_s"] for s in warm + cold]
    warm_med = statistics.median(s["kill_to_first_step_s"] for s in warm)
    cold_restart = statistics.median(s["kill_to_first_step_s"] - s["detection_s"] for s in cold)
    baseline = statistics.median(survivor) + cold_restart
    in_runs: dict[str, list[float]] = {}
    for sample in warm + cold:
        for source, seconds in sample["restore"]:
            in_runs.setdefault(source, []).append(seconds)

    def medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
        return {name: round(statistics.median(s["kill_to_first_step_s"] for s in runs[name]), 3) for name in runs}

    result = {
        "detection_s_p50": pct(detections, 0.5),
        "detection_s_p95": pct(detections, 0.95),
        "kill_to_first_step_s": medians(ours),
        "breakdown_s": {name: median_phases(runs) for name, runs in ours.items()},
        "baseline_tree": None if len(trees) == 1 else {
            "path": str(trees["baseline_tree"]),
            "kill_to_first_step_s": medians(samples["baseline_tree"]),
            "breakdown_s": {name: median_phases(runs) for name, runs in samples["baseline_tree"].items()},
        },
        "baseline_tf_timeout_plus_cold_s": round(baseline, 3),
        "restore_s": restore["median_s"],
        "warm_over_baseline": round(warm_med / baseline, 3),
        "details": {
            "tf_survivor_exit_s": [round(s, 3) for s in survivor],
            "cold_restart_after_detection_s": round(cold_restart, 3),
            "samples": samples,
            "restore": restore,
            "restore_in_runs_s": {src: round(statistics.median(v), 4) for src, v in in_runs.items()},
        },
        "setup": {
            "recipe": recipe, "workers": 2, "flags": job_flags, "kills_per_run": args.kills,
            "runs": [name for name, _, _ in RUNS],
            "train_s_before_kill": args.train_s, "restore_mb": args.restore_mb,
            "shared_storage_for_restore": "SeaweedFS S3 on loopback (tests/support/s3server.py)",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.time() - started, 1),
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
