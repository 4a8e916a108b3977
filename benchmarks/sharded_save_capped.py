"""Sharded save and read-once restore under a real per-host bandwidth cap (issue 50, item 4).

    sudo .venv/bin/python benchmarks/sharded_save_capped.py                      # every phase, ~25-40 min
    sudo .venv/bin/python benchmarks/sharded_save_capped.py --phases save2 --cap-mbit 200

Writes benchmarks/results/sharded_save_capped.json. Needs root (``ip netns``, ``tc``).

The set-up (benchmarks/_netns.py): a SeaweedFS S3 server (tests/support/s3server.py) on a
bridge in the root namespace, each worker in a network namespace of its own joined to the
bridge by a veth pair, and an HTB class on both ends of each veth that limits the worker's
traffic to and from the store to ``--cap-mbit`` each way: what an object store's per-client
rate or a host's link does to a checkpoint, enforced by the kernel. Traffic between the
workers (the gradients' all-reduce, the read-once exchange) is not limited unless
``--peer-mbit`` says so. The local launcher starts each rank inside its namespace
(``RT_LOCAL_WORKER_NETNS``, resilient_train/cluster/worker_netns.py); the supervisor and the
store stay in the root namespace. Everything is removed at the end, however it ends.

Every phase runs ``--sharded-save off`` (the chief uploads everything) and ``on`` (each
worker uploads its share, the chief commits) side by side, one TensorFlow job at a time, on
``recipes/wide_mlp.py`` with a wider net (``--set width=... features=...``):

* ``save2``: 2 workers, a >= 1 GB state (width 6144, features 4352: 1.09 GB of weights and
  Adam slots); ``save4``: 4 workers, >= 400 MB (width 4096, features 2304: 428 MB). The
  save at step 2 is measured (save2 stops there; save4 trains on to a save at step 4, the
  reference digest of restore4). From
  the chief's ``checkpoint_committed``: ``commit_s`` (uploads, the wait for every share, the
  manifest) and ``persist_s`` (from the persist's start: the local write, then the commit);
  each worker's share (its data file's bytes against 1/N of the data) from the manifest; and
  the bytes each worker's store class passed (``tc -s class show``), the cap's own account.
* ``restore4``: the 4-worker state, sharded saves; the chief is killed -9 right after the
  step-2 commit (an ``after_commit`` fault) and attempt 2's ranks open the store without
  the host cache (``other_host``: hosts that never held the run), once with ``--read-once
  on`` and once ``off``: each rank's ``restore_read.store_bytes`` (their sum against the
  checkpoint's size), ``checkpoint_fetched.seconds`` and the final digest (equal to
  ``save4``'s uninterrupted runs': the same 4 steps).
* ``notice4``: the 4-worker state, no periodic save; a GCE preemption notice (a metadata
  server on the bridge, tests/support/metadata_server.py) is posted once the chief trained
  a step; the workers agree on a save and exit 143. ``post_to_commit_s``: from posting the
  notice to the commit, against a GCE notice's 30 s.

``uptime`` before and after every run: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._netns import Namespaces, NetnsPlan  # noqa: E402
from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.checkpoint.manifest import MANIFEST_NAME  # noqa: E402
from resilient_train.cluster.worker_netns import LOCAL_WORKER_NETNS  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RESULT_KEYS = ("benchmark", "date", "host", "recipe", "cap_mbit", "peer_mbit", "subnet", "phases", "states",
               "flags", "uptime_before", "uptime_after", "wall_s", "summary", "runs", "smoke")
RECIPE = "recipes/wide_mlp.py"
PHASES = ("save2", "save4", "restore4", "notice4")
# (workers, width, features) of each phase's state; smoke: a tiny net, same code paths.
STATES = {"save2": (2, 6144, 4352), "save4": (4, 4096, 2304), "restore4": (4, 4096, 2304), "notice4": (4, 4096, 2304)}
SMOKE_STATES = {"save2": (2, 256, 128), "save4": (4, 256, 128), "restore4": (4, 256, 128), "notice4": (4, 256, 128)}
FLAGS = ("--epochs", "1", "--global-batch-size", "32", "--snapshot-every", "off", "--keep", "3",
         "--storage-timeout", "120", "--startup-timeout", "900")
SAVE_STEP = 2
NOTICE_DEADLINE_S = 30.0  # a GCE preemption notice's warning
EXIT_PREEMPTED = 143


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()



def _tc_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {rank: {way: (after[rank][way] - before[rank][way]
                         if after[rank][way] is not None and before[rank][way] is not None else None)
                   for way in after[rank]} for rank in after}


class Bench:
    """The store, the namespaces and one ``resilient-train run`` at a time."""

    def __init__(self, server: Any, namespaces: Namespaces, *, smoke: bool) -> None:
        self.server, self.namespaces, self.smoke = server, namespaces, smoke
        self.states = SMOKE_STATES if smoke else STATES
        self.count = 0

    def run(self, phase: str, mode: str, flags: list[str], *, faults: list[dict[str, Any]] | None = None,
            notice: Any = None, timeout_s: float = 2400.0) -> dict[str, Any]:
        """One job; its events, exit code, wall time, tc deltas and the store target."""
        workers, width, features = self.states[phase]
        self.count += 1
        target = self.server.target(f"{phase}-{mode}-{self.count}")
        with tempfile.TemporaryDirectory(prefix=f"rt-capped-{phase}-") as tmp:
            run_dir = Path(tmp) / "run"
            env = {**os.environ, LOCAL_WORKER_NETNS: self.namespaces.plan.launcher_env(), "TF_CPP_MIN_LOG_LEVEL": "3",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            if faults:
                env["RT_FAULTS"] = json.dumps(faults)
            if notice is not None:
                env.update(notice.environ())
            argv = [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir),
                    "--workers", str(workers), "--set", f"width={width}", "--set", f"features={features}",
                    *FLAGS, *flags, *target.cli_flags()]
            uptime_before, tc_before, started = _uptime(), self.namespaces.stats(), time.monotonic()
            print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {phase} {mode}: {workers} workers, "
                  f"width {width}, features {features} ({uptime_before})", flush=True)
            posted: float | None = None
            with open(Path(tmp) / "run.log", "wb") as log:
                proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                try:
                    while proc.poll() is None:
                        if time.monotonic() - started > timeout_s:
                            raise TimeoutError(f"{phase} {mode}: the run did not end in {timeout_s} s")
                        if notice is not None and posted is None and any(
                                e["event"] == "train_progress" for e in read_events(run_dir / "events.jsonl")):
                            posted = time.time()
                            notice.announce()
                        time.sleep(0.1)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
            wall_s = round(time.monotonic() - started, 2)
            tc = _tc_delta(tc_before, self.namespaces.stats())
            events = read_events(run_dir / "events.jsonl")
            summary_path = run_dir / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
            if proc.returncode not in (0, EXIT_PREEMPTED):
                tail = (Path(tmp) / "run.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{phase} {mode}: exit {proc.returncode}\n{tail}")
        return {"events": events, "returncode": proc.returncode, "wall_s": wall_s, "tc_store_bytes": tc,
                "uptime_before": uptime_before, "uptime_after": _uptime(), "target": target,
                "weights_sha256": summary.get("weights_sha256"), "posted": posted}

    def manifest(self, target: Any, step: int) -> dict[str, Any]:
        import fsspec

        fs, root = fsspec.core.url_to_fs(target.url_prefix, **target.storage_options)
        return json.loads(fs.cat_file(f"{root}/{CheckpointStore.dir_name(step)}/{MANIFEST_NAME}"))


def _of(events: list[dict[str, Any]], name: str, **match: Any) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())),
                  key=lambda e: e.get("rank") or 0)


def save_phase(bench: Bench, phase: str, mode: str) -> dict[str, Any]:
    # save4 trains 4 steps (saves at 2 and 4), restore4's uninterrupted reference; save2 stops at
    # the measured save (a second 1 GB upload would add minutes and no figure).
    steps = 4 if phase == "save4" else SAVE_STEP
    flags = ["--steps-per-epoch", str(steps), "--save-every-steps", str(SAVE_STEP), "--sharded-save", mode,
             "--preemption-notice", "off"]
    done = bench.run(phase, mode, flags)
    events = done["events"]
    [committed] = _of(events, "checkpoint_committed", global_step=SAVE_STEP)
    manifest = bench.manifest(done["target"], SAVE_STEP)
    data = {name: entry["size"] for name, entry in manifest["files"].items() if ".data-" in name}
    workers = bench.states[phase][0]
    writers = manifest.get("extra", {}).get("sharded_save", {}).get("writers", {})
    uploaded = [sum(entry["size"] for name, entry in manifest["files"].items() if writers.get(name, 0) == rank)
                for rank in range(workers)]
    shares = [data[name] for name in sorted(data)] if len(data) > 1 else [sum(data.values())]
    return {
        "phase": phase, "sharded_save": mode, "workers": workers, "global_step": SAVE_STEP,
        "checkpoint_bytes": committed["size"],
        "commit_s": committed["commit_s"], "persist_s": committed.get("persist_s"),
        "share_uploads": [{k: e.get(k) for k in ("rank", "size", "upload_s", "persist_s")}
                          for e in _of(events, "checkpoint_share_uploaded", global_step=SAVE_STEP)],
        "data_file_bytes": shares,
        "share_vs_1_over_n": [round(b / (sum(shares) / workers), 4) for b in shares] if len(shares) > 1 else None,
        "uploaded_by_rank": uploaded,
        "sharded_event": [{k: e.get(k) for k in ("sharded", "shards", "state_bytes", "reason")}
                          for e in _of(events, "sharded_save")],
        "tc_store_bytes": done["tc_store_bytes"], "weights_sha256": done["weights_sha256"],
        "wall_s": done["wall_s"], "uptime_before": done["uptime_before"], "uptime_after": done["uptime_after"],
    }


def restore_phase(bench: Bench, read_once: str) -> dict[str, Any]:
    workers = bench.states["restore4"][0]
    faults = [{"point": "after_commit", "global_step": SAVE_STEP, "rank": 0},
              *({"point": "other_host", "global_step": 0, "rank": r, "attempt": 2} for r in range(workers))]
    flags = ["--steps-per-epoch", "4", "--save-every-steps", str(SAVE_STEP), "--sharded-save", "on",
             "--read-once", read_once, "--preemption-notice", "off"]
    done = bench.run("restore4", f"read-once-{read_once}", flags, faults=faults)
    events = done["events"]
    reads = _of(events, "restore_read", attempt=2)
    fetched = _of(events, "checkpoint_fetched", attempt=2)
    phases = _of(events, "startup_phases", attempt=2)
    [restored] = _of(events, "restored", attempt=2)
    size = _of(events, "checkpoint_committed", global_step=restored["global_step"])[0]["size"]
    store_bytes = [e["store_bytes"] for e in reads]
    return {
        "phase": "restore4", "read_once": read_once, "workers": workers, "restored_step": restored["global_step"],
        "checkpoint_bytes": size, "store_bytes": store_bytes, "store_bytes_total": sum(store_bytes),
        "read_ratio": round(sum(store_bytes) / size, 4),
        "peer_bytes": [e["peer_bytes"] for e in reads], "exchange_s": [e["exchange_s"] for e in reads],
        "reason": sorted({e["reason"] for e in reads}),
        "fetch_s": [e["seconds"] for e in fetched], "fetch_s_max": max(e["seconds"] for e in fetched),
        "phases": [{k: e["phases"].get(k) for k in ("fetch", "agree", "restore")} for e in phases],
        "tc_store_bytes": done["tc_store_bytes"], "weights_sha256": done["weights_sha256"],
        "wall_s": done["wall_s"], "uptime_before": done["uptime_before"], "uptime_after": done["uptime_after"],
    }


def notice_phase(bench: Bench, mode: str) -> dict[str, Any]:
    from tests.support.metadata_server import MetadataServer

    flags = ["--steps-per-epoch", "2000", "--save-every-steps", "100000", "--sharded-save", mode,
             "--preemption-notice", "gce"]
    with MetadataServer("gce", host=bench.namespaces.plan.host) as server:
        done = bench.run("notice4", mode, flags, notice=server)
    events = done["events"]
    preempted = _of(events, "preempted")
    step = preempted[0]["global_step"] if preempted else None
    committed = _of(events, "checkpoint_committed", global_step=step)
    chief_saved = _of(events, "preemption_notice_saved", rank=0)
    post_to_commit = round(_ts(committed[-1]) - done["posted"], 3) if committed and done["posted"] else None
    return {
        "phase": "notice4", "sharded_save": mode, "returncode": done["returncode"], "global_step": step,
        "checkpoint_bytes": committed[-1]["size"] if committed else None,
        "commit_s": committed[-1]["commit_s"] if committed else None,
        "persist_s": committed[-1].get("persist_s") if committed else None,
        "notice_to_commit_s": chief_saved[0]["seconds"] if chief_saved else None,
        "post_to_commit_s": post_to_commit,
        "inside_deadline": post_to_commit is not None and post_to_commit <= NOTICE_DEADLINE_S,
        "tc_store_bytes": done["tc_store_bytes"],
        "wall_s": done["wall_s"], "uptime_before": done["uptime_before"], "uptime_after": done["uptime_after"],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for phase in ("save2", "save4"):
        pair = {r["sharded_save"]: r for r in runs if r["phase"] == phase}
        if {"on", "off"} <= set(pair):
            on, off = pair["on"], pair["off"]
            summary[phase] = {
                "checkpoint_bytes": on["checkpoint_bytes"],
                "commit_s": {"off": off["commit_s"], "on": on["commit_s"],
                             "ratio": round(on["commit_s"] / off["commit_s"], 3)},
                "persist_s": {"off": off["persist_s"], "on": on["persist_s"],
                              "ratio": round(on["persist_s"] / off["persist_s"], 3)
                              if on["persist_s"] and off["persist_s"] else None},
                "share_vs_1_over_n": on["share_vs_1_over_n"],
                "same_digest": on["weights_sha256"] == off["weights_sha256"],
            }
    restores = {r["read_once"]: r for r in runs if r["phase"] == "restore4"}
    if restores:
        reference = {r["weights_sha256"] for r in runs if r["phase"] == "save4"}
        summary["restore4"] = {
            mode: {k: r[k] for k in ("checkpoint_bytes", "store_bytes_total", "read_ratio", "fetch_s_max")}
            for mode, r in restores.items()}
        summary["restore4"]["digests_equal"] = len({r["weights_sha256"] for r in restores.values()} | reference) == 1
        summary["restore4"]["digest"] = next(iter(restores.values()))["weights_sha256"]
    notices = {r["sharded_save"]: r for r in runs if r["phase"] == "notice4"}
    if notices:
        summary["notice4"] = {mode: {k: r[k] for k in ("post_to_commit_s", "notice_to_commit_s", "commit_s",
                                                       "inside_deadline", "returncode")}
                              for mode, r in notices.items()}
        summary["notice4"]["deadline_s"] = NOTICE_DEADLINE_S
    return summary


@contextlib.contextmanager
def _terminated_is_exit() -> Iterator[None]:
    """SIGTERM/SIGHUP raise SystemExit, so every ``finally`` (the namespaces' removal) runs."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated, in order (default all: {','.join(PHASES)})")
    parser.add_argument("--cap-mbit", type=float, default=100.0,
                        help="each worker's store traffic, Mbit/s each way (default 100)")
    parser.add_argument("--peer-mbit", type=float, default=None,
                        help="each worker's other traffic, Mbit/s (default: not limited)")
    parser.add_argument("--subnet", default="10.213.0.0/24", help="for the bridge and the namespaces (default 10.213.0.0/24)")
    parser.add_argument("--tag", default=f"rtc{os.getpid() % 100000}", help="prefix of every name made (default rtc<pid>)")
    parser.add_argument("--out", default=str(RESULTS / "sharded_save_capped.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        parser.error(f"Received --phases {args.phases!r}; expected a comma-separated subset of {','.join(PHASES)}")
    if os.geteuid() != 0:
        parser.error("network namespaces and tc need root (run with sudo, or as root)")
    from tests.support.s3server import SeaweedS3

    states = SMOKE_STATES if args.smoke else STATES
    try:  # checked before anything is made; the store's port comes from the server below
        draft = NetnsPlan(args.tag, args.subnet, max(states[p][0] for p in phases), args.cap_mbit, store_port=1,
                          peer_mbit=args.peer_mbit)
    except ValueError as exc:
        parser.error(str(exc))
    uptime_before, started = _uptime(), time.monotonic()
    runs: list[dict[str, Any]] = []
    with _terminated_is_exit(), tempfile.TemporaryDirectory(prefix="rt-capped-weed-") as weed_dir:
        # The server's ports first (the plan's filter names the S3 port), then the bridge it binds to.
        # Every phase leaves its checkpoints: ~8 GB in all, past the test server's 32 volumes of
        # 256 MB (the first invocation's notice phase failed on that: "internal error" uploads).
        server = SeaweedS3(Path(weed_dir) / "weed", ip=draft.host, volume_max=128)
        plan = dataclasses.replace(draft, store_port=server.s3)
        with Namespaces(plan) as namespaces, server:
            bench = Bench(server, namespaces, smoke=args.smoke)
            for done, phase in enumerate(phases, 1):
                if phase in ("save2", "save4"):
                    runs += [save_phase(bench, phase, mode) for mode in ("off", "on")]
                elif phase == "restore4":
                    runs += [restore_phase(bench, mode) for mode in ("off", "on")]
                else:
                    runs += [notice_phase(bench, mode) for mode in ("off", "on")]
                print(json.dumps(summarize(runs), indent=2), flush=True)
                write_result(args.out, {  # after every phase: a long invocation cut short keeps what it measured
                    "benchmark": "sharded_save_capped",
                    "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "host": {"node": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
                    "recipe": RECIPE, "cap_mbit": args.cap_mbit, "peer_mbit": args.peer_mbit, "subnet": args.subnet,
                    "phases": phases[:done],
                    "states": {p: dict(zip(("workers", "width", "features"), states[p])) for p in phases[:done]},
                    "flags": list(FLAGS), "uptime_before": uptime_before, "uptime_after": _uptime(),
                    "wall_s": round(time.monotonic() - started, 1), "summary": summarize(runs), "runs": runs,
                    "smoke": args.smoke,
                })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
