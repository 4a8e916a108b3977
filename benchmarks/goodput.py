"""Goodput under a kill -9 of a random worker every N seconds: what a failure costs, in one number.

    .venv/bin/python benchmarks/goodput.py                # 6 kills, one every 20 s, without and with the memory tier
    .venv/bin/python benchmarks/goodput.py --smoke --out /tmp/goodput.json   # one kill, 1000 steps

Writes benchmarks/results/goodput.json. The job: ``recipes/digits_cnn.py`` (``--recipe``), 2 workers,
global batch 64, one epoch of ``--steps`` steps, a save every ``--save-every-steps``
(2000), the runner's defaults otherwise (async saves, warm standbys), ``--max-restarts``
one above the kills. It runs uninterrupted first (the reference, ``--snapshot-every off``),
then once with the killer for each ``--snapshot-every`` value of ``--compare`` (default
``off,auto``: before and after issue 32's memory tier, on the same machine in one
invocation), each with the same seeded ranks; ``compare`` in the JSON holds each run's
figures below, keyed by that value. The killer's clock starts at the first ``train_progress``; ``--every-s`` later it
SIGKILLs one worker of the attempt that trains, the rank drawn from ``random.Random(--seed)``
(recorded per kill), its pid the one the supervisor announced in ``worker_started``. Each
next kill comes ``--every-s`` after the previous one, or, when the group has not trained
again by then, at the next attempt's ``first_step``: a kill never lands in a restart.

From events.jsonl, per kill of attempt ``a``:

* ``standstill_s``: the kill -> attempt ``a+1``'s ``first_step`` (the chief's first finished
  step: a step of MWMS is a collective, so the whole group trains again);
* ``lost_steps``: the step attempt ``a`` reached (``attempt_reached``: the project's one
  definition, rundir/stepmarker.py ``reached_step``, the same that sums to summary.json's
  ``lost_steps``) minus the step attempt ``a+1`` resumed from (``restored``; 0 after a
  ``fresh_start``);
* ``lost_s`` = ``standstill_s`` + ``lost_steps`` / ``steps_per_s``, where ``steps_per_s``
  is the run's own rate: steps over seconds between the first and the last
  ``train_progress`` of each attempt, pooled over the attempts. The killed run's own
  rate, not the reference's, so a slow moment of a shared machine slows both sides of
  the ratio alike.

``goodput`` = 1 - sum(``lost_s``) / ``window_s``. The window is the kills' periods, each from
a kill to when the next one came (for the last: when it would have come, the same rule):
every second in it is under "a failure every N s". The training before the first kill and
after the last period (up to ``--steps``) is not in it: it had no failures, and counting it
would push the figure towards 1 by an amount that depends on ``--steps``. ``digest_exact``:
the killed run's final ``weights_sha256`` (summary.json) equals the reference's.
The 1-minute load average is recorded before and after each run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from benchmarks.recovery import Events  # noqa: E402
from benchmarks.throughput import _env, _ts  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402
from resilient_train.rundir.layout import RunDir  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "job", "schedule", "reference", "compare", "wall_s", "smoke")
RECIPE = "recipes/digits_cnn.py"
WORKERS, BATCH = 2, 64
TIMEOUT_S = 1800.0  # per wait for the job (start-up, a restart) and for its end

Record = dict[str, Any]


def job_command(run_dir: Path, steps: int, save_every: int, max_restarts: int, snapshot_every: str = "off") -> list[str]:
    return [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
            "--workers", str(WORKERS), "--epochs", "1", "--steps-per-epoch", str(steps),
            "--global-batch-size", str(BATCH), "--save-every-steps", str(save_every),
            "--max-restarts", str(max_restarts), "--snapshot-every", snapshot_every]


def _of(records: list[Record], name: str, attempt: int | None = None) -> list[Record]:
    return [r for r in records if r["event"] == name and (attempt is None or r.get("attempt") == attempt)]


def _wait(events: Events, proc: subprocess.Popen, predicate: Callable[[Record], bool], what: str) -> Record:
    """The first event matching ``predicate``; fails at once when the job ended without it."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        found = next((r for r in events.poll() if predicate(r)), None)
        if found is not None:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before {what}: too few --steps, "
                               f"or see {events.path}")
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {TIMEOUT_S} s ({events.path})")


def _sleep_until(moment: float, proc: subprocess.Popen, what: str) -> None:
    while time.time() < moment:
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before {what}: raise --steps")
        time.sleep(min(0.02, max(0.0, moment - time.time())))


def steps_per_s(records: list[Record]) -> float:
    """Steps over seconds between the first and the last ``train_progress`` of each attempt, pooled."""
    steps = seconds = 0.0
    for attempt in sorted({r["attempt"] for r in _of(records, "train_progress")}):
        progress = _of(records, "train_progress", attempt)
        steps += progress[-1]["global_step"] - progress[0]["global_step"]
        seconds += _ts(progress[-1]) - _ts(progress[0])
    if not seconds:
        raise RuntimeError("too few train_progress events for a step rate: raise --steps")
    return steps / seconds


def _outcome(run_dir: Path, proc: subprocess.Popen, load_before: float) -> Record:
    summary = json.loads(RunDir(run_dir).summary.read_text())
    if proc.returncode or summary["status"] != "completed":
        raise RuntimeError(f"the job in {run_dir} ended with exit {proc.returncode}, status {summary['status']}")
    return {"status": summary["status"], "global_step": summary["global_step"], "restarts": summary["restarts"],
            "lost_steps": summary["lost_steps"], "weights_sha256": summary["weights_sha256"],
            "steps_per_s": round(steps_per_s(read_events(RunDir(run_dir).events)), 2),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


@contextlib.contextmanager
def _job(run_dir: Path, steps: int, save_every: int, max_restarts: int,
         snapshot_every: str = "off") -> Iterator[subprocess.Popen]:
    """The job running in its own session; waits for it to end, and kills what is left on the way out."""
    proc = subprocess.Popen(job_command(run_dir, steps, save_every, max_restarts, snapshot_every), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_reference(run_dir: Path, steps: int, save_every: int) -> Record:
    load = os.getloadavg()[0]
    with _job(run_dir, steps, save_every, 0) as proc:
        pass
    return _outcome(run_dir, proc, load)


def run_with_kills(run_dir: Path, steps: int, save_every: int, kills: int, every_s: float,
                   rng: random.Random, snapshot_every: str = "off") -> tuple[Record, list[Record], float]:
    """The job with ``kills`` kills; returns its outcome, the kills and the window's end (epoch seconds)."""
    load = os.getloadavg()[0]
    events = Events(RunDir(run_dir).events)
    done: list[Record] = []
    with _job(run_dir, steps, save_every, kills + 1, snapshot_every) as proc:
        _wait(events, proc, lambda r: r["event"] == "train_progress", "the first train_progress")
        clock_start = time.time()
        next_at = clock_start + every_s
        for _ in range(kills):
            _sleep_until(next_at, proc, f"kill {len(done) + 1}")
            last = done[-1]["attempt"] if done else 0
            first = _wait(events, proc, lambda r: r["event"] == "first_step" and r["attempt"] > last,
                          f"a first step after attempt {last}")
            pids = {r["rank"]: r["pid"] for r in _of(events.records, "worker_started", first["attempt"])}
            rank = rng.randrange(WORKERS)
            killed_at = time.time()
            os.kill(pids[rank], signal.SIGKILL)
            done.append({"attempt": first["attempt"], "rank": rank, "pid": pids[rank], "killed_at": killed_at,
                         "delayed_s": round(killed_at - next_at, 3)})
            print(f"kill {len(done)}/{kills}: rank {rank} (pid {pids[rank]}) of attempt {first['attempt']} "
                  f"{killed_at - clock_start:.1f} s after the first train_progress", flush=True)
            next_at = killed_at + every_s
        resumed = _wait(events, proc, lambda r: r["event"] == "first_step" and r["attempt"] > done[-1]["attempt"],
                        "the first step after the last kill")
        window_end = max(next_at, _ts(resumed))  # when a next kill would have come
        _sleep_until(window_end, proc, "the end of the last kill's period")  # it trains through that period
    return _outcome(run_dir, proc, load), done, window_end


def kill_figures(records: list[Record], kills: list[Record], rate: float) -> list[Record]:
    """Per kill: standstill, steps lost and the time they cost (module docstring)."""
    figures = []
    for kill in kills:
        attempt = kill["attempt"]
        [reached] = _of(records, "attempt_reached", attempt)
        [resumed] = _of(records, "restored", attempt + 1) + _of(records, "fresh_start", attempt + 1)
        [first] = _of(records, "first_step", attempt + 1)
        standstill = _ts(first) - kill["killed_at"]
        lost = reached["global_step"] - resumed["global_step"]
        figures.append({**{k: v for k, v in kill.items() if k != "killed_at"},
                        "reached_step": reached["global_step"], "resumed_step": resumed["global_step"],
                        "input_reentry": resumed.get("input_reentry"),  # None after a fresh start
                        "lost_steps": lost, "standstill_s": round(standstill, 3),
                        "lost_s": round(standstill + lost / rate, 3)})
    return figures


def _compare_values(text: str) -> list[str]:
    """``off,auto`` -> ["off", "auto"]: each a --snapshot-every value, none twice."""
    values = [v.strip() for v in text.split(",")]
    for value in values:
        if value not in ("off", "auto") and not (value.isdigit() and int(value) >= 1):
            raise argparse.ArgumentTypeError(f"{value!r} is not a --snapshot-every value; expected off, auto or N >= 1")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} names a value twice; expected e.g. off,auto")
    return values


def measure(work: Path, args: argparse.Namespace, snapshot_every: str, reference: Record) -> Record:
    """One killed run with ``--snapshot-every snapshot_every`` and its figures (module docstring)."""
    run_dir = work / f"killed-{snapshot_every}"
    killed, kills, window_end = run_with_kills(run_dir, args.steps, args.save_every_steps, args.kills,
                                               args.every_s, random.Random(args.seed), snapshot_every=snapshot_every)
    records = read_events(RunDir(run_dir).events)
    rate = steps_per_s(records)
    figures = kill_figures(records, kills, rate)
    window_s = window_end - kills[0]["killed_at"]
    time_lost = sum(f["lost_s"] for f in figures)
    return {
        "snapshot_every": snapshot_every,
        "goodput": round(1 - time_lost / window_s, 4),
        "window_s": round(window_s, 3),
        "time_lost_s": round(time_lost, 3),
        "steps_per_s": round(rate, 2),
        "medians": {key: round(statistics.median(f[key] for f in figures), 3)
                    for key in ("standstill_s", "lost_steps", "lost_s")},
        "kills": figures,
        "digest_exact": killed["weights_sha256"] == reference["weights_sha256"],
        "run": killed,
    }


def main(argv: list[str] | None = None) -> int:
    global RECIPE  # job_command's and the report's (one job per invocation: --recipe)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=6, help="kills in the measured window (default 6)")
    parser.add_argument("--every-s", type=float, default=20.0, help="seconds of wall time between kills (default 20)")
    parser.add_argument("--steps", type=int, default=50000,
                        help="steps of the job: enough to train past the last kill's period (default 50000)")
    parser.add_argument("--save-every-steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random ranks to kill (default 0)")
    parser.add_argument("--compare", type=_compare_values, default=["off", "auto"], metavar="V,V...",
                        help="the killed runs' --snapshot-every values, one run each (default off,auto: "
                        "without and with issue 32's memory tier)")
    parser.add_argument("--recipe", default=RECIPE,
                        help=f"the job's recipe (default {RECIPE}; recipes/digits_keras.py has the largest trace)")
    parser.add_argument("--out", default=str(RESULTS / "goodput.json"))
    parser.add_argument("--keep", metavar="DIR", help="keep the run dirs there (default: deleted), to read a restart's "
                        "events (`resilient-train report`)")
    add_smoke_flag(parser)  # one kill 1 s into a 1000-step job, a save every 100, per compared value
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    RECIPE = args.recipe
    if args.smoke:
        args.kills, args.every_s, args.steps, args.save_every_steps = 1, 1.0, 1000, 100
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="rt-goodput-"))
    try:
        reference = run_reference(work / "reference", args.steps, args.save_every_steps)
        print("reference", json.dumps(reference), flush=True)
        compare = {value: measure(work, args, value, reference) for value in args.compare}
    finally:
        if args.keep:
            shutil.rmtree(args.keep, ignore_errors=True)
            shutil.move(str(work), args.keep)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "goodput",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "job": {"recipe": RECIPE, "workers": WORKERS, "epochs": 1, "steps": args.steps, "global_batch_size": BATCH,
                "save_every_steps": args.save_every_steps},
        "schedule": {"kills": args.kills, "every_s": args.every_s, "seed": args.seed,
                     "ranks": [k["rank"] for k in next(iter(compare.values()))["kills"]]},
        "reference": reference,
        "compare": compare,
        "wall_s": round(time.time() - started, 1),
        "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps({value: {k: figures[k] for k in ("goodput", "window_s", "time_lost_s", "steps_per_s", "medians",
                                                       "digest_exact")} for value, figures in compare.items()},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
