"""A chief frozen mid-upload must not commit, overwrite or delete after a newer attempt ran.

Driven with worker processes directly (one worker per "node", no supervisor), because a
supervisor on one host would SIGKILL the frozen chief when it tears the group down; a
partitioned node is exactly the case where that kill never arrives:

1. node A, attempt 1 (generation 1): commits step 5, then freezes itself (SIGSTOP, an
   RT_FAULTS ``mid_upload`` fault) after uploading the first file of step 10;
2. node B, attempt 2 (generation 2): restores step 5, trains to the end, commits and prunes;
3. node A is thawed (SIGCONT): its next upload is fenced, it exits 3, and the storage is
   byte for byte what node B left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from resilient_train.checkpoint import CheckpointStore
from resilient_train.errors import EXIT_FATAL, EXIT_OK
from tests.integration.harness import REPO, environment, read_events, wait_until_stopped

LINEAR = "recipes/linear_regression.py"  # 3 epochs x 10 steps, a save every 5 steps, --keep 3


def start_worker(run_dir: Path, storage: Path, *, attempt: int, faults: list[dict] | None = None) -> subprocess.Popen:
    env = environment(faults, RT_ATTEMPT=str(attempt), RT_GENERATION=str(attempt), RT_RUN_ID="run-fence")
    env.pop("TF_CONFIG", None)  # a single worker: it is the chief
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / f"worker-attempt-{attempt}.log", "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "resilient_train.runner", LINEAR, "--run-dir", str(run_dir),
             "--storage", str(storage), "--workers", "1"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker in {run_dir} did not finish:\n" + "".join(
            p.read_text(errors="replace")[-3000:] for p in run_dir.glob("worker-*.log"))) from None


def storage_bytes(storage: Path) -> dict[str, bytes]:
    return {p.relative_to(storage).as_posix(): p.read_bytes() for p in sorted(storage.rglob("*")) if p.is_file()}


def named(run_dir: Path, event: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == event]


def test_a_thawed_stale_chief_is_fenced_and_changes_nothing(tmp_path):
    reference_dir = tmp_path / "reference"
    reference = start_worker(reference_dir, reference_dir / "checkpoints", attempt=1)
    assert finish(reference, reference_dir) == EXIT_OK
    reference_digest = CheckpointStore(str(reference_dir / "checkpoints")).latest_manifest().weights_sha256

    storage = tmp_path / "shared-storage"
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    freeze = [{"point": "mid_upload", "global_step": 10, "rank": 0, "attempt": 1, "signal": "SIGSTOP"}]
    old = start_worker(node_a, storage, attempt=1, faults=freeze)
    try:
        wait_until_stopped(old.pid, timeout=300)
        partial = sorted(p.name for p in (storage / "ckpt-000000000010").iterdir())
        assert partial == ["ckpt.data-00000-of-00001"]  # first file uploaded, no manifest

        new = start_worker(node_b, storage, attempt=2)
        assert finish(new, node_b) == EXIT_OK
        before_thaw = storage_bytes(storage)

        os.kill(old.pid, signal.SIGCONT)
        assert finish(old, node_a) == EXIT_FATAL
    finally:
        if old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            old.kill()
            old.wait()

    # The stale chief wrote nothing after it woke up: not a byte, not a deletion.
    assert storage_bytes(storage) == before_thaw
    fenced = named(node_a, "stale_writer_fenced")
    assert [(e["generation"], e["newer_generation"], e["op"], e["path"]) for e in fenced] == [
        (1, 2, "upload", f"{storage}/ckpt-000000000010/ckpt.index")
    ]
    assert [e["global_step"] for e in named(node_a, "checkpoint_committed")] == [5]
    error = json.loads((node_a / "attempt-1" / "error-0.json").read_text())
    assert error["type"] == "resilient_train.errors.StaleWriterError"

    # The newer attempt restored the last commit before the freeze and owns what is left.
    assert [e["generation"] for e in named(node_a, "generation_claimed")] == [1]
    assert [e["generation"] for e in named(node_b, "generation_claimed")] == [2]
    assert [e["global_step"] for e in named(node_b, "restored")] == [5]
    assert [e["global_step"] for e in named(node_b, "checkpoint_committed")] == [10, 15, 20, 25, 30]
    store = CheckpointStore(str(storage))
    infos = store.verify()
    assert [(i.global_step, i.status.value, i.manifest.extra.get("generation")) for i in infos] == [
        (20, "ok", 2), (25, "ok", 2), (30, "ok", 2)
    ]
    assert store.latest_manifest().weights_sha256 == reference_digest
    assert sorted(p.name for p in (storage / "generations").iterdir()) == ["gen-1.json", "gen-2.json"]
