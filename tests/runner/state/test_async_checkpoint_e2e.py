"""Async checkpointing end to end: real `resilient-train run` jobs (2 workers, real MWMS).

Each test states an exact outcome read from the user-facing contracts (exit code,
events.jsonl, summary.json, error-<rank>.json, the checkpoint store):

* async and sync commit the same steps with the same weights_sha256 at every step, and
  end with the same weights (time-based saving: every step is due with T = 1 ms);
* kill -9 inside the background persist (before and after the manifest) never leaves a
  restorable torn checkpoint, and the re-run ends with the reference weights;
* a permanent upload error in the background stops training with that error;
* SIGTERM to a worker while saves are slow: the preemption save is committed before the
  workers exit, so the next attempt restores exactly the preempted step.

The recipe is the tiny linear regression (3 epochs x 10 steps, 2 workers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from resilient_train.checkpoint import CheckpointStore, Status
from resilient_train.errors import EXIT_FATAL

REPO = Path(__file__).resolve().parents[3]
RECIPE = "recipes/linear_regression.py"
FLAGS = ("--epochs", "3", "--steps-per-epoch", "10", "--global-batch-size", "4", "--save-every-steps", "5")
TOTAL_STEPS = 30
# A time-based save is due after every call; one step per call makes that every step.
EVERY_STEP_DUE = ("--save-every-seconds", "0.001", "--steps-per-execution", "1")


class Job:
    def __init__(self, returncode: int, run_dir: Path) -> None:
        self.returncode = returncode
        self.run_dir = run_dir

    @property
    def output(self) -> str:
        return (self.run_dir.parent / f"{self.run_dir.name}.out").read_text(errors="replace")

    @property
    def events(self) -> list[dict[str, Any]]:
        return _events(self.run_dir)

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    def named(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _start(run_dir: Path, *flags: str, faults: list[dict] | None = None,
           env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RT_FAULTS", "RT_FAULTFS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if faults:
        env["RT_FAULTS"] = json.dumps(faults)
    env.update(env_extra or {})
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    out = open(run_dir.parent / f"{run_dir.name}.out", "w")
    argv = [sys.executable, "-m", "resilient_train", "run", RECIPE, "--run-dir", str(run_dir), *FLAGS, *flags]
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def run_job(run_dir: Path, *flags: str, faults: list[dict] | None = None, timeout: float = 300,
            when: Callable[[list[dict]], bool] | None = None,
            action: Callable[[list[dict]], None] | None = None,
            env_extra: dict[str, str] | None = None) -> Job:
    proc = _start(run_dir, *flags, faults=faults, env_extra=env_extra)
    deadline, fired = time.monotonic() + timeout, False
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job in {run_dir} did not finish in {timeout} s")
            if when is not None and not fired and when(_events(run_dir)):
                action(_events(run_dir))
                fired = True
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    job = Job(proc.returncode, run_dir)
    if when is not None and not fired:
        raise AssertionError(f"the trigger never fired; output:\n{job.output}")
    return job


def committed(job: Job, attempt: int | None = None) -> list[int]:
    return [e["global_step"] for e in job.named("checkpoint_committed")
            if attempt is None or e["attempt"] == attempt]


def manifests(storage: Path) -> dict[int, str]:
    """global_step -> weights_sha256 of every committed checkpoint (hash-verified)."""
    infos = CheckpointStore(str(storage), emit=lambda *a, **k: None).verify()
    assert [i.status for i in infos] == [Status.OK] * len(infos), [(i.global_step, i.status, i.detail) for i in infos]
    return {i.global_step: i.manifest.weights_sha256 for i in infos}


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory):
    """Sync mode, a checkpoint at every step (time-based saving with T = 1 ms), all kept."""
    run_dir = tmp_path_factory.mktemp("sync") / "run"
    job = run_job(run_dir, "--checkpoint-mode", "sync", *EVERY_STEP_DUE, "--keep", "100")
    assert job.returncode == 0, job.output
    assert (job.summary["status"], job.summary["global_step"]) == ("completed", TOTAL_STEPS)
    return job


def test_async_commits_the_same_checkpoints_as_sync(tmp_path, sync_reference):
    job = run_job(tmp_path / "run", *EVERY_STEP_DUE, "--keep", "100")  # async is the default
    assert job.returncode == 0, job.output
    every_step = list(range(1, TOTAL_STEPS + 1))
    assert committed(job) == committed(sync_reference) == every_step
    async_digests = manifests(tmp_path / "run" / "checkpoints")
    sync_digests = manifests(sync_reference.run_dir / "checkpoints")
    assert sorted(async_digests) == every_step
    assert async_digests == sync_digests  # every snapshot equals the sync state at its step
    assert job.summary["weights_sha256"] == sync_reference.summary["weights_sha256"]
    (done,) = job.named("training_completed")
    assert done["weights_sha256"] == sync_reference.summary["weights_sha256"]


def test_kill_9_inside_the_background_persist_never_restores_a_torn_checkpoint(tmp_path, sync_reference):
    faults = [
        # attempt 1: killed with step 10's files staged, nothing uploaded
        {"point": "before_commit", "global_step": 10, "rank": 0, "attempt": 1, "signal": "SIGKILL"},
        # attempt 2: killed right after step 20's manifest, before retention
        {"point": "after_commit", "global_step": 20, "rank": 0, "attempt": 2, "signal": "SIGKILL"},
    ]
    # Without the memory tier: rank 1 would rescue its snapshot of step 10 (restored 10, not 5);
    # this test is about the chief's own persist (a torn rescue: tests/integration/test_rescue*.py).
    job = run_job(tmp_path / "run", "--snapshot-every", "off", faults=faults)
    assert job.returncode == 0, job.output
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", TOTAL_STEPS, 2)
    assert [e["global_step"] for e in job.named("restored")] == [5, 20]
    assert 10 not in committed(job, attempt=1) and committed(job, attempt=1) == [5]
    assert committed(job, attempt=2)[-1] == 20
    assert not job.named("checkpoint_rejected")  # nothing torn was ever offered to a reader
    manifests(tmp_path / "run" / "checkpoints")  # every remaining checkpoint verifies by hash
    assert summary["weights_sha256"] == sync_reference.summary["weights_sha256"]


def test_a_permanent_upload_error_in_the_background_stops_training_with_it(tmp_path):
    storage = tmp_path / "ckpts"
    # Write #1 of each faulty fs instance is the supervisor's probe (its own instance);
    # in the chief, write #2 is the second file upload of the first checkpoint (step 5).
    job = run_job(tmp_path / "run", "--storage", f"faulty://{storage}",
                  "--storage-option", "fail_write_k=2", "--storage-option", "fail_kind=permanent")
    assert job.returncode != 0, job.output
    assert job.summary["status"] == "failed"
    assert job.summary["restarts"] == 0  # a permanent storage error is fatal: no restart
    assert committed(job) == []
    error = json.loads((tmp_path / "run" / "attempt-1" / "error-0.json").read_text())
    assert error["type"].endswith("StorageError")
    assert "injected permanent fault" in error["message"]
    assert "background persist of checkpoint step 5" in error["traceback"]
    assert error["global_step"] >= 5
    (failed,) = job.named("worker_exited", rank=0)
    assert failed["exit_code"] == EXIT_FATAL


def test_preemption_flushes_the_in_flight_save(tmp_path, sync_reference):
    storage = tmp_path / "ckpts"

    def first_commit(events: list[dict]) -> bool:
        return any(e["event"] == "checkpoint_committed" for e in events)

    def sigterm_worker_1(events: list[dict]) -> None:
        (pid,) = [e["pid"] for e in events if e["event"] == "worker_started" and e["rank"] == 1]
        os.kill(pid, signal.SIGTERM)

    # Every storage operation takes 0.2 s, so each commit takes seconds: the preemption
    # save is still persisting when the workers agree to stop. (RT_FAULTFS, not
    # --storage-option: the option parser keeps "0.2" a string.)
    job = run_job(tmp_path / "run", "--storage", f"faulty://{storage}",
                  env_extra={"RT_FAULTFS": json.dumps({"latency_s": 0.2})},
                  when=first_commit, action=sigterm_worker_1)
    assert job.returncode == 0, job.output
    (preempted,) = job.named("preempted")
    assert preempted["attempt"] == 1
    restored = job.named("restored", attempt=2)
    assert [e["global_step"] for e in restored] == [preempted["global_step"]]
    assert committed(job, attempt=1)[-1] == preempted["global_step"]
    assert job.summary["status"] == "completed"
    assert job.summary["weights_sha256"] == sync_reference.summary["weights_sha256"]
