"""What a restart costs the supervisor as the group grows: 2, 16, 64, 256 stand-in workers.

The workers are stand-ins (tests/support/standin_worker.py): real processes started by the
real local launcher in a real worker's place (its ``spawner`` seam), that speak the worker
side of the run-dir contract through the real worker's code (start-up, events, error
file, step and phase markers, the chief's commits) without TensorFlow, and train in
lock-step (no rank passes a dead peer). The supervisor is the real one, in a process of
its own (forked from this script), so its CPU time is its own.

For each size N: the group trains; the supervisor's CPU per second is read from
/proc/<pid>/stat over ``--steady-s`` seconds of training (its poll loop: children,
events.jsonl tail, the watchdog's marker reads every 0.25 s); then the last rank is
SIGKILLed and, from the events:

* ``detect_s``: the kill -> ``run_state`` running -> stopping (the supervisor noticed);
* ``stop_s``: -> stopping -> restarting (every worker of the attempt gone, root cause
  chosen; stand-ins leave on SIGTERM at once, so this is the supervisor's own share);
* ``start_s``: -> starting -> running of the next attempt (backoff, then every worker
  spawned and announced: ``backoff_s`` is reported apart);
* ``train_s``: -> the chief's ``first_step`` of the next attempt (every stand-in started
  Python, restored and joined the group: on this machine mostly the processes' own start).

The wall times of the last two include waiting for the CPU the starting stand-ins use (on
2 cores, 256 Python start-ups); ``supervisor_cpu_s`` gives, per phase, the CPU seconds
the supervisor itself spent (its /proc/<pid>/stat read every 20 ms): its own share.

Usage::

    .venv/bin/python benchmarks/supervisor_scaling.py [--sizes 2,16,64,256] [--steady-s 5]
        [--profile 256]

``--profile N`` runs the supervisor of size N under cProfile (timed by its CPU time) and
writes the top functions by cumulative CPU time to benchmarks/results/supervisor_scaling_profile_<N>.txt. Writes
benchmarks/results/supervisor_scaling.json with the load average before and after.
The Ray launcher is not measured: its slot actors start the worker module themselves
(launchers/_slot.py) and have no spawner seam for a stand-in.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import multiprocessing
import os
import platform
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import RESULTS, add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from benchmarks.recovery import Events, ts  # noqa: E402
from tests.support.standin_worker import StandinOptions, StandinSpawner  # noqa: E402

RECIPE = "recipes/linear_regression.py"  # read for its fingerprint only: stand-ins never run it
STEP_S = 0.1
SAMPLE_S = 0.02  # how often the supervisor's CPU time is read during a restart
RESULT_KEYS = ("benchmark", "created_at", "host", "load_before", "load_after", "setup", "sizes", "ray", "smoke")


def _supervise(workers: int, run_dir: str, options: StandinOptions, profile_to: str | None) -> None:
    """The child: the real supervisor and local launcher, stand-ins as workers."""
    from resilient_train.job.config import JobConfig
    from resilient_train.supervisor.launchers.local import LocalLauncher
    from resilient_train.supervisor.supervisor import Supervisor

    job = JobConfig(recipe=RECIPE, run_dir=run_dir, workers=workers, warm_standby=False, max_restarts=1)
    supervisor = Supervisor(job, out=io.StringIO(), launcher=LocalLauncher(job, spawner=StandinSpawner(options)),
                            backoff_initial_s=0.01)
    if profile_to is None:
        os._exit(supervisor.run())
    profiler = cProfile.Profile(time.process_time)  # CPU time: the supervisor's own, not waits for CPU
    code = profiler.runcall(supervisor.run)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    Path(profile_to).write_text(text.getvalue())
    os._exit(code)


def _cpu_s(pid: int) -> float:
    """The process's own user + system CPU seconds (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first(records: list[dict[str, Any]], predicate) -> dict[str, Any]:
    return next(r for r in records if predicate(r))


def _cpu_at(samples: list[tuple[float, float]], when: float) -> float:
    """The supervisor's CPU seconds at wall time ``when``: the first sample at or after it."""
    return next((cpu for wall, cpu in samples if wall >= when), samples[-1][1])


def measure(workers: int, work: Path, steady_s: float, timeout: float, profile_to: str | None) -> dict[str, Any]:
    run_dir = work / f"run-{workers}"
    options = StandinOptions(steps=10**6, step_s=STEP_S, save_every=20)
    child = multiprocessing.get_context("fork").Process(
        target=_supervise, args=(workers, str(run_dir), options, profile_to))
    child.start()
    events = Events(run_dir / "events.jsonl")
    try:
        events.wait(lambda r: r["event"] == "first_step" and r.get("attempt") == 1, timeout, "attempt 1 trains")
        time.sleep(min(1.0, steady_s))  # let the start-up's events drain
        cpu0, wall0 = _cpu_s(child.pid), time.monotonic()
        time.sleep(steady_s)
        cpu1, wall1 = _cpu_s(child.pid), time.monotonic()
        pids = {r["rank"]: r["pid"] for r in events.poll() if r["event"] == "worker_started" and r["attempt"] == 1}
        victim = workers - 1
        killed_at = time.time()
        samples = [(killed_at, _cpu_s(child.pid))]  # (wall, the supervisor's CPU seconds) every SAMPLE_S
        os.kill(pids[victim], signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while not any(r["event"] == "first_step" and r.get("attempt") == 2 for r in events.poll()):
            if time.monotonic() > deadline or not child.is_alive():
                raise TimeoutError(f"{workers} workers: attempt 2 did not train within {timeout:g} s")
            time.sleep(SAMPLE_S)
            samples.append((time.time(), _cpu_s(child.pid)))
        records = events.poll()
        stopping = _first(records, lambda r: r["event"] == "run_state" and r["to"] == "stopping")
        restarting = _first(records, lambda r: r["event"] == "run_state" and r["to"] == "restarting")
        restart = _first(records, lambda r: r["event"] == "gang_restart")
        running = _first(records, lambda r: r["event"] == "run_state" and r["to"] == "running" and r["attempt"] == 2)
        first = _first(records, lambda r: r["event"] == "first_step" and r.get("attempt") == 2)
        exited = [r for r in records if r["event"] == "worker_exited" and r["attempt"] == 1]
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGTERM)  # the run stops as preempted; its workers get SIGTERM
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
    marks = [killed_at, ts(stopping), ts(restarting), ts(running), ts(first)]
    cpu = [_cpu_at(samples, t) for t in marks]
    return {
        "workers": workers,
        "detect_s": round(ts(stopping) - killed_at, 3),
        "stop_s": round(ts(restarting) - ts(stopping), 3),
        "backoff_s": restart["backoff_s"],
        "start_s": round(ts(running) - ts(restarting), 3),
        "train_s": round(ts(first) - ts(running), 3),
        "kill_to_training_s": round(ts(first) - killed_at, 3),
        "supervisor_cpu_s": {phase: round(cpu[i + 1] - cpu[i], 3)
                             for i, phase in enumerate(("detect", "stop", "start", "train"))},
        "supervisor_cpu_per_s": round((cpu1 - cpu0) / (wall1 - wall0), 4),
        "workers_exited_in_attempt_1": len(exited),
        "supervisor_exit": child.exitcode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,16,64,256", help="comma-separated group sizes")
    parser.add_argument("--steady-s", type=float, default=5.0, help="seconds of training the CPU share is read over")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each phase")
    parser.add_argument("--profile", type=int, default=None, metavar="N", help="profile the supervisor of size N")
    parser.add_argument("--out", default=str(RESULTS / "supervisor_scaling.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"Received --sizes {args.sizes!r}; expected comma-separated integers >= 2, e.g. 2,16,64")
    if any(n < 2 for n in sizes):
        parser.error(f"Received --sizes {args.sizes!r}; expected every size >= 2 (one rank is killed)")
    if args.smoke:
        sizes, args.steady_s = [2], 0.5
        args.profile = 2
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="rt-supscale-") as tmp:
        for n in sizes:
            profile_to = None
            if args.profile == n:
                profile_dir = Path(args.out).parent if args.smoke else RESULTS
                profile_to = str(profile_dir / f"supervisor_scaling_profile_{n}.txt")
            result = measure(n, Path(tmp), args.steady_s, args.timeout, profile_to)
            if profile_to is not None:
                result["profile"] = profile_to
            print(result, flush=True)
            results.append(result)
    report = {
        "benchmark": "supervisor_scaling",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "setup": {"launcher": "local", "worker": "tests/support/standin_worker.py", "step_s": STEP_S,
                  "steady_s": args.steady_s, "killed_rank": "the last", "recipe_for_fingerprint": RECIPE},
        "sizes": results,
        "ray": "not measured: the Ray launcher's slot actors start the worker module themselves "
               "(supervisor/launchers/_slot.py), with no spawner seam for a stand-in",
        "smoke": bool(args.smoke),
    }
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
