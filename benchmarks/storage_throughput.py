"""Upload/download throughput of CheckpointStore against a real S3 server (SeaweedFS).

What it answers: how much does the commit protocol (streaming upload with sha256 while
reading, the manifest PUT, the re-commit check) cost compared with a plain ``fs.put``
of the same bytes, and what does verified ``fetch`` cost against a plain ``fs.get``?

Writes ``benchmarks/results/storage_throughput.json``. Usage::

    .venv/bin/python benchmarks/storage_throughput.py [--mb 64] [--repeats 3]

Both sides talk to the same local SeaweedFS over loopback, so the figures measure client
overhead plus one local server, not a network; on a busy shared machine, compare the
two columns with each other rather than with other runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fsspec  # noqa: E402

from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402
from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from tests.support.s3server import SeaweedS3  # noqa: E402

RESULT_KEYS = ("benchmark", "backend", "bytes", "files", "repeats", "upload", "download", "fetch_cache_hit_s",
               "commit_vs_put", "fetch_vs_get", "machine", "note", "smoke")


def make_checkpoint(path: Path, total_mb: int) -> int:
    """A TF-like layout: one big data shard, a second shard, a small index, a subdir file."""
    sizes = {
        "ckpt.data-00000-of-00002": total_mb * 2**20 * 3 // 4,
        "ckpt.data-00001-of-00002": total_mb * 2**20 // 4 - 2**16,
        "ckpt.index": 2**15,
        "assets/meta.bin": 2**15,
    }
    for rel, size in sizes.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(os.urandom(size))  # incompressible
    return sum(sizes.values())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="checkpoint size in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "storage_throughput.json")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.mb, args.repeats = 1, 1

    work = Path(tempfile.mkdtemp(prefix="rt-bench-"))
    try:
        local = work / "stage"
        nbytes = make_checkpoint(local, args.mb)
        with SeaweedS3(work / "seaweed") as server:
            target = server.target("bench")
            fs, root = fsspec.core.url_to_fs(target.url_prefix, **target.storage_options)
            store = CheckpointStore(target.url_prefix, target.storage_options, emit=lambda *a, **k: None)
            store.check()
            commit_s, put_s, fetch_s, get_s = [], [], [], []
            for i in range(args.repeats):
                step = i + 1  # a fresh step each time: no re-commit shortcut
                commit_s.append(timed(lambda: store.commit(
                    local, run_id="bench", epoch=0, step_in_epoch=step, global_step=step, world_size=1,
                    weights_sha256="0" * 64, tf_version="n/a")))
                put_s.append(timed(lambda: fs.put(str(local) + "/", f"{root}/plain-{i}/", recursive=True)))
                cache = work / f"cache-{i}"
                fetch_s.append(timed(lambda: store.fetch(step, cache)))
                get_s.append(timed(lambda: fs.get(f"{root}/plain-{i}/", str(work / f"get-{i}") + "/", recursive=True)))
                shutil.rmtree(cache)
                shutil.rmtree(work / f"get-{i}")
            cache = work / "cache-hit"
            store.fetch(1, cache)
            cache_hit_s = timed(lambda: store.fetch(1, cache))

        mib = nbytes / 2**20

        def summary(samples: list[float]) -> dict:
            median = statistics.median(samples)
            return {"seconds": [round(s, 3) for s in samples], "median_s": round(median, 3),
                    "mib_per_s": round(mib / median, 1)}

        result = {
            "benchmark": "storage_throughput",
            "backend": "SeaweedFS S3 on 127.0.0.1 (weed server -s3), s3fs client",
            "bytes": nbytes,
            "files": 4,
            "repeats": args.repeats,
            "upload": {"CheckpointStore.commit": summary(commit_s), "fs.put": summary(put_s)},
            "download": {"CheckpointStore.fetch": summary(fetch_s), "fs.get": summary(get_s)},
            "fetch_cache_hit_s": round(cache_hit_s, 3),
            "commit_vs_put": round(statistics.median(put_s) / statistics.median(commit_s), 2),
            "fetch_vs_get": round(statistics.median(get_s) / statistics.median(fetch_s), 2),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "fsspec": fsspec.__version__, "platform": platform.platform()},
            "note": "shared 2-core machine with other jobs running; loopback only",
            "smoke": args.smoke,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
