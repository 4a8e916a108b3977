"""Bytes read from storage and time of a restart's restore, read once or whole (issue 50, item 2).

    .venv/bin/python benchmarks/read_once_restore.py              # ~4 min on 2 cores: 2 runs of the 100 MB wide_mlp
    .venv/bin/python benchmarks/read_once_restore.py --repeats 2
    .venv/bin/python benchmarks/read_once_restore.py --store s3   # SeaweedFS S3 on loopback

Writes benchmarks/results/read_once_restore.json (``--store s3``: read_once_restore_s3.json).

Each run: ``resilient-train run recipes/wide_mlp.py`` (1024-2048-2048-1024-10, ~101 MB of
weights and Adam slots), 2 workers on loopback, ``--sharded-save on``; rank 1 is killed
(kill -9 from inside, an ``after_step`` fault) after a commit, and attempt 2's ranks open
the store without the host cache (``other_host`` faults: as ranks on hosts that never held
the run, a replaced node), so the restore reads from storage. Once with ``--read-once on``
(each rank downloads the index, the small files and its own share; the other share comes
over the collective), once with ``--read-once off`` (each rank downloads the whole
checkpoint, the restore before read-once). Per run, from attempt 2's events:

* ``store_bytes``: each rank's ``restore_read.store_bytes`` and their sum, against the
  checkpoint's size (``checkpoint_committed.size``): ``read_ratio`` = sum / size;
* ``fetch_s`` / ``exchange_s``: each rank's ``checkpoint_fetched.seconds`` (its reads from
  the store and, read once, the exchange and the check of what its peer sent) and
  ``restore_read.exchange_s``; ``phases``: each rank's ``startup_phases`` ``fetch``,
  ``agree`` and ``restore`` (TensorFlow reading the local copy);
* ``weights_sha256``: the final digest, equal across the runs (the restore is exact either way).

``--store local`` (default): the run dir's own directory, on the same disk: reading it is a
copy at disk speed, so the times say what the exchange costs against a fast store, not what
it saves on a slow one; the bytes are what a store with a per-host cap would see. ``--store
s3``: a SeaweedFS S3 server on loopback (tests/support/s3server.py), an object store's
request path without a network cap. ``uptime`` before and after: the
machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
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

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "recipe", "workers", "store", "flags", "uptime_before", "uptime_after",
               "wall_s", "summary", "runs", "smoke")
RECIPE = "recipes/wide_mlp.py"
FLAGS = ("--epochs", "1", "--steps-per-epoch", "30", "--global-batch-size", "32", "--save-every-steps", "10",
         "--steps-per-execution", "1", "--sharded-save", "on", "--snapshot-every", "off")
SMOKE_FLAGS = ("--set", "width=128", "--set", "features=64", "--steps-per-epoch", "12", "--save-every-steps", "4")
KILL_AFTER = {False: 25, True: 9}  # rank 1 dies after this global step (smoke: a smaller run)
FAULTS = [{"point": "other_host", "global_step": 0, "rank": rank, "attempt": 2} for rank in (0, 1)]


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()



def run_once(read_once: str, *, smoke: bool, storage: list[str], timeout_s: float = 900.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rt-read-once-") as tmp:
        run_dir = Path(tmp) / "run"
        faults = [{"point": "after_step", "global_step": KILL_AFTER[smoke], "rank": 1}, *FAULTS]
        env = {**os.environ, "RT_FAULTS": json.dumps(faults), "TF_CPP_MIN_LOG_LEVEL": "3",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        flags = (*FLAGS, *(SMOKE_FLAGS if smoke else ()), *storage, "--read-once", read_once)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
                               *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout_s)
        wall_s = round(time.monotonic() - started, 2)
        if done.returncode != 0:
            raise RuntimeError(f"--read-once {read_once}: exit {done.returncode}\n{done.stdout[-3000:]}")
        events = read_events(run_dir / "events.jsonl")
        summary = json.loads((run_dir / "summary.json").read_text())

    def of(name: str) -> list[dict[str, Any]]:
        return sorted((e for e in events if e["event"] == name and e.get("attempt") == 2), key=lambda e: e["rank"])

    reads, fetched, phases = of("restore_read"), of("checkpoint_fetched"), of("startup_phases")
    (restored,) = of("restored")
    [size] = [e["size"] for e in events if e["event"] == "checkpoint_committed"
              and e["global_step"] == restored["global_step"]]
    store_bytes = [e["store_bytes"] for e in reads]
    return {
        "read_once": read_once,
        "restored_step": restored["global_step"],
        "checkpoint_bytes": size,
        "store_bytes": store_bytes,
        "store_bytes_total": sum(store_bytes),
        "read_ratio": round(sum(store_bytes) / size, 4),
        "peer_bytes": [e["peer_bytes"] for e in reads],
        "reason": [e["reason"] for e in reads],
        "source": [e["source"] for e in fetched],
        "fetch_s": [e["seconds"] for e in fetched],
        "exchange_s": [e["exchange_s"] for e in reads],
        "phases": [{k: e["phases"].get(k) for k in ("fetch", "agree", "restore")} for e in phases],
        "weights_sha256": summary.get("weights_sha256"),
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode (default 1)")
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="local (default): the run dir's checkpoints/; s3: SeaweedFS on loopback")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/read_once_restore[_s3].json")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    out = args.out or str(RESULTS / f"read_once_restore{'_s3' if args.store == 's3' else ''}.json")
    if args.repeats < 1:
        parser.error(f"Received --repeats {args.repeats}; expected >= 1")
    repeats = 1 if args.smoke else args.repeats
    uptime_before, started = _uptime(), time.monotonic()
    with contextlib.ExitStack() as stack:
        storage: list[str] = []
        if args.store == "s3":
            from tests.support.s3server import SeaweedS3

            server = stack.enter_context(SeaweedS3(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "weed"))
            storage = server.target("read-once-bench").cli_flags()

        def run(mode: str, repeat: int) -> dict[str, Any]:
            where = [*storage[:1], f"{storage[1]}-{mode}-{repeat}", *storage[2:]] if storage else []
            return run_once(mode, smoke=args.smoke, storage=where)

        runs = [run(mode, repeat) for repeat in range(repeats) for mode in ("on", "off")]
    summary: dict[str, Any] = {}
    for mode in ("on", "off"):
        mine = [r for r in runs if r["read_once"] == mode]
        summary[mode] = {
            "read_ratio": statistics.median(r["read_ratio"] for r in mine),
            "store_bytes_total": statistics.median(r["store_bytes_total"] for r in mine),
            "fetch_s_max": statistics.median(max(r["fetch_s"]) for r in mine),
            "restore_phases_s_max": statistics.median(
                max((p["fetch"] or 0) + (p["agree"] or 0) + (p["restore"] or 0) for p in r["phases"]) for r in mine),
        }
    summary["same_digest"] = len({r["weights_sha256"] for r in runs}) == 1
    report = {
        "benchmark": "read_once_restore",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "recipe": RECIPE,
        "workers": 2,
        "store": args.store,
        "flags": [*FLAGS, *(SMOKE_FLAGS if args.smoke else ())],
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "wall_s": round(time.monotonic() - started, 1),
        "summary": summary,
        "runs": runs,
        "smoke": args.smoke,
    }
    print(json.dumps(summary, indent=2))
    write_result(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
