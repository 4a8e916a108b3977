"""The chief's per-save commit, alone: CPU and wall time of one small commit on local disk.

    .venv/bin/python benchmarks/commit_cost.py [--commits 120] [--label NAME] [--out FILE]

Adds one run to benchmarks/results/commit_cost.json (``runs``: one entry per invocation). With a save every 20 steps the chief's
background commit runs beside training on the same cores, so every CPU millisecond it
spends is taken from the steps (issue 45 item 1). This times exactly what the persist
thread does after the twin is written, on digits_cnn's real file sizes: the staged
checkpoint (ckpt.data 304,713 B, ckpt.index 1,215 B) and two carried tf.data iterator
captures (579,270 B and 578,311 B, the same bytes objects for every save in between two
captures, as runner/input/reentry.py carries them), written into a staging directory and
committed through ``runner.state.checkpointing.commit_checkpoint``: a fenced store
(generation claimed), a host cache (write-through links) and retention ``keep=3``, as a
run commits. No TensorFlow op runs (the twin's write is TensorFlow's own cost, not ours).

CPU is the process's (every thread: the storage call threads too); figures are medians
per commit over ``--commits`` commits after 10 warm-up ones. Run it from two checkouts to
compare (``PYTHONPATH=<checkout>``): it only uses functions both have.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.runner.state.checkpointing import (  # noqa: E402
    SaveRequest,
    commit_checkpoint,
    write_request_files,
)

RESULT_KEYS = ("benchmark", "runs", "smoke")

SIZES = {"ckpt.data-00000-of-00001": 304_713, "ckpt.index": 1_215}
CAPTURES = {"iterator-0.bin": 579_270, "iterator-1.bin": 578_311}
WARMUP = 10


class _NoFaults:
    def hit(self, point: str, step: int) -> None:
        return None


def measure(commits: int, root: Path) -> dict[str, float]:
    store = CheckpointStore(str(root / "store"), emit=lambda *a, **k: None, host_cache=root / "host-cache")
    store.claim_generation(None, run_id="bench", attempt=1)
    captures = {name: os.urandom(size) for name, size in CAPTURES.items()}
    cpu_ms, wall_ms = [], []
    for n in range(WARMUP + commits):
        step = 20 * (n + 1)
        if n % 12 == 0:  # a new capture every 12 saves (digits_cnn: every 252 steps)
            captures = {name: os.urandom(size) for name, size in CAPTURES.items()}
        local = root / "staging" / CheckpointStore.dir_name(step)
        local.mkdir(parents=True)
        for name, size in SIZES.items():
            (local / name).write_bytes(os.urandom(size))  # the twin's write (a new file each save)
        request = SaveRequest(global_step=step, epoch=0, step_in_epoch=step, files=dict(captures))
        cpu, wall = time.process_time(), time.perf_counter()
        known = write_request_files(local, request)
        commit_checkpoint(store, local, request, run_id="bench", world_size=2, weights_sha256="0" * 64,
                          faults=_NoFaults(), keep=3, emit=lambda *a, **k: None,
                          **({"known": known} if known is not None else {}))
        shutil.rmtree(local)
        if n >= WARMUP:
            cpu_ms.append((time.process_time() - cpu) * 1000)
            wall_ms.append((time.perf_counter() - wall) * 1000)
    return {"cpu_ms_p50": round(statistics.median(cpu_ms), 2), "wall_ms_p50": round(statistics.median(wall_ms), 2),
            "cpu_ms_mean": round(statistics.fmean(cpu_ms), 2), "commits": commits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=120)
    parser.add_argument("--label", default="", help="a name for this checkout in the output")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "commit_cost.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.commits = 3
    with tempfile.TemporaryDirectory(prefix="rt-commit-cost-") as tmp:
        run = measure(args.commits, Path(tmp))
    run.update(label=args.label, load_1min=round(os.getloadavg()[0], 2), cpus=os.cpu_count(),
               date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    print(json.dumps(run))
    out = Path(args.out)
    before = json.loads(out.read_text())["runs"] if out.exists() and not args.smoke else []
    write_result(out, {"benchmark": "commit_cost", "runs": [*before, run], "smoke": args.smoke})
    return 0


if __name__ == "__main__":
    sys.exit(main())
