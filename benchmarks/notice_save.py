"""How long from a cloud preemption notice to the committed save (issue 34).

    .venv/bin/python benchmarks/notice_save.py                 # ~5 min on 2 cores: 3 providers x 3 runs
    .venv/bin/python benchmarks/notice_save.py --providers gce --repeats 5

Writes benchmarks/results/notice_save.json.

Each run: ``resilient-train run`` of the digits recipe (tests/recipes/slow_digits.py, a
delay per step so the notice lands mid-epoch), 2 workers on loopback, with a loopback
metadata server that speaks the provider's protocol (tests/support/metadata_server.py) as
the only one the workers can find (``--preemption-notice auto``). After the first commit
the benchmark posts the provider's notice and notes the time; the run must then exit 143.

* ``detect_s``: from posting the notice to the first worker's ``preemption_notice`` event
  (the watcher's reaction: a GCE long poll answers at once, AWS is polled every 5 s as AWS
  advises, Azure every second);
* ``notice_to_commit_s``: the chief's ``preemption_notice_saved`` ``seconds``: from its
  notice to its committed save (the agreement in the next call, the snapshot, the upload);
  absent when the chief was not the first to see it;
* ``post_to_commit_s``: from posting the notice to the ``checkpoint_committed`` event of
  the preempted step: what a provider's deadline has to cover.

``auto_startup``: what ``--preemption-notice auto`` costs a worker's start-up where no
metadata server exists (every endpoint a refused loopback port): the time
runner/process/preemption_notices.py's ``NoticeStop(...).start()`` takes on the calling thread, and
until its probes are done (off that thread), over ``--startup-repeats`` starts, next to
``off``.

Times between processes come from the events' ``ts`` (milliseconds, one host's clock).
``uptime`` is recorded before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402
from tests.support.metadata_server import MetadataServer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "recipe", "workers", "flags", "uptime_before", "uptime_after", "wall_s",
               "auto_startup", "summary", "runs", "smoke")
RECIPE = "tests/recipes/slow_digits.py"
FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "4",
         "--set", "step_delay_s=0.6")
PROVIDERS = ("gce", "aws", "azure")
EXIT_PREEMPTED = 143


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def _nowhere() -> dict[str, str]:
    """Every provider's endpoint on a loopback port nothing listens on: the other providers'
    probes are refused at once, and nothing leaves this host."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    return {"GCE_METADATA_HOST": closed, "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{closed}",
            "RT_AZURE_METADATA_HOST": closed}


def run_once(provider: str, timeout_s: float = 300.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="notice-save-") as tmp, MetadataServer(provider) as server:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **_nowhere(), **server.environ()}
        proc = subprocess.Popen([sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
                                 *FLAGS], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        posted, deadline = None, time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{provider}: the run did not end in {timeout_s} s")
                if posted is None and any(e["event"] == "checkpoint_committed" for e in read_events(run_dir / "events.jsonl")):
                    posted = time.time()
                    server.announce()
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
        events = read_events(run_dir / "events.jsonl")
    notices = [e for e in events if e["event"] == "preemption_notice"]
    preempted = [e for e in events if e["event"] == "preempted"]
    step = preempted[0]["global_step"] if preempted else None
    committed = [e for e in events if e["event"] == "checkpoint_committed" and e["global_step"] == step]
    chief_saved = [e for e in events if e["event"] == "preemption_notice_saved" and e.get("rank") == 0]
    return {
        "provider": provider,
        "returncode": proc.returncode,
        "global_step": step,
        "detect_s": round(min(_ts(e) for e in notices) - posted, 3) if notices and posted else None,
        "notice_to_commit_s": chief_saved[0]["seconds"] if chief_saved else None,
        "post_to_commit_s": round(_ts(committed[-1]) - posted, 3) if committed and posted else None,
        "noticed_by": sorted(e["rank"] for e in notices),
    }


def startup_cost(repeats: int) -> dict[str, Any]:
    """``NoticeStop.start()`` on this thread, and until its probes resolved, for off and auto (ms)."""
    from resilient_train.rundir.layout import RunDir
    from resilient_train.runner.process.preemption_notices import NoticeStop

    environ = _nowhere()
    result: dict[str, Any] = {"repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="notice-start-") as tmp:
        attempt_dir = RunDir(Path(tmp)).attempt(1)
        for setting in ("off", "auto"):
            on_thread, resolved, events = [], [], []
            for _ in range(repeats):
                started = time.perf_counter()
                watch = NoticeStop(setting, environ, attempt_dir=attempt_dir, rank=0, stop=lambda: None,
                                   emit=lambda name, **fields: events.append(name)).start()
                on_thread.append((time.perf_counter() - started) * 1e3)
                watch.watch.resolved.wait(10)
                resolved.append((time.perf_counter() - started) * 1e3)
            on_thread.sort()
            resolved.sort()
            result[setting] = {"start_ms_median": round(statistics.median(on_thread), 3),
                               "start_ms_p95": round(on_thread[int(0.95 * (repeats - 1))], 3),
                               "resolved_ms_median": round(statistics.median(resolved), 3),
                               "events": sorted(set(events))}
    return result


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--startup-repeats", type=int, default=300)
    parser.add_argument("--out", default=str(RESULTS / "notice_save.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:  # one run of the fastest watcher: every code path, no figure worth keeping
        args.providers, args.repeats, args.startup_repeats = ["gce"], 1, 5

    uptime_before = _uptime()
    started = time.time()
    auto_startup = startup_cost(args.startup_repeats)
    print(f"auto start-up, no metadata server: {auto_startup}", flush=True)
    runs = []
    for repeat in range(args.repeats):
        for provider in args.providers:
            result = run_once(provider)
            runs.append(result)
            print(f"repeat {repeat + 1}/{args.repeats} {provider:>5}: exit {result['returncode']}, step "
                  f"{result['global_step']}, detect {result['detect_s']} s, notice->commit "
                  f"{result['notice_to_commit_s']} s, post->commit {result['post_to_commit_s']} s", flush=True)
    summary = {
        provider: {
            "runs": len(mine := [r for r in runs if r["provider"] == provider]),
            "all_exited_143": all(r["returncode"] == EXIT_PREEMPTED for r in mine),
            "detect_s_median": _median([r["detect_s"] for r in mine]),
            "notice_to_commit_s_median": _median([r["notice_to_commit_s"] for r in mine]),
            "post_to_commit_s_median": _median([r["post_to_commit_s"] for r in mine]),
            "post_to_commit_s_max": max((r["post_to_commit_s"] for r in mine if r["post_to_commit_s"] is not None),
                                        default=None),
        }
        for provider in args.providers
    }
    report = {
        "benchmark": "notice_save",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "recipe": RECIPE, "workers": 2, "flags": list(FLAGS),
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "wall_s": round(time.time() - started, 1),
        "auto_startup": auto_startup,
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
