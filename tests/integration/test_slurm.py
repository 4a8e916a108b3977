"""Slurm: real slurmctld + slurmd + munged on localhost (tests/support/slurm_cluster.py).

Every job is submitted with ``sbatch`` from deploy/slurm/ exactly as a user would, on one
node with two tasks; the workers' TF_CONFIG comes from their Slurm environment. The final
weights must equal the ``--launcher local`` reference bit for bit.

Slow (a minute or more each): run with RT_SLOW=1 or RT_REQUIRE_SLURM=1 (``make test-all``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from resilient_train.cluster.ports import free_ports
from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import REPO, read_events
from tests.support.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("RT_SLOW") != "1" and os.environ.get("RT_REQUIRE_SLURM") != "1",
        reason="real Slurm scenarios; set RT_SLOW=1 (or RT_REQUIRE_SLURM=1) to run them",
    ),
]

SLOW_DIGITS = "tests/recipes/slow_digits.py"  # digits_cnn, same weights, 0.15 s per step
RUN_SBATCH = str(REPO / "deploy" / "slurm" / "run.sbatch")
WORKERS_SBATCH = str(REPO / "deploy" / "slurm" / "workers.sbatch")
ONE_NODE = ("--nodes=1", "--ntasks-per-node=2")  # the test cluster has one node with 2 CPUs


def job_env(run_dir: Path, port_base: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RT_FAULTS", None)
    env.update(
        PYTHONPATH=str(REPO),
        TF_CPP_MIN_LOG_LEVEL="3",
        RT_COMMAND=f"{sys.executable} -m resilient_train",
        RT_SLURM_PORT_BASE=str(port_base),
        RT_PORT_BASE=str(port_base),
    )
    return env


def submit(cluster, script: str, run_dir: Path, recipe: str, *flags: str, port_base: int) -> str:
    return cluster.sbatch(
        *ONE_NODE, f"--output={run_dir.parent / 'sbatch-%j.out'}", script, recipe, "--run-dir", str(run_dir), *flags,
        env=job_env(run_dir, port_base), cwd=REPO,
    )


def wait_for(condition, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.1)


def committed(run_dir: Path, attempt: int = 1) -> bool:
    return any(e["event"] == "checkpoint_committed" and e.get("attempt") == attempt for e in read_events(run_dir))


def worker_pid(run_dir: Path, rank: int) -> int:
    """The worker process of ``rank`` (its SLURM_PROCID), found by its job file in /proc."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"resilient_train.runner" in argv and str(run_dir).encode() in b" ".join(argv):
            if f"SLURM_PROCID={rank}".encode() in environ:
                return int(proc.name)
    raise LookupError(f"no worker of rank {rank} for {run_dir}")


def output(run_dir: Path, job_id: str) -> str:
    return (run_dir.parent / f"sbatch-{job_id}.out").read_text()


def port_base() -> int:
    """Free now, with room above it for the attempts' rotated ports (8 x 2 workers)."""
    return min(free_ports(1)[0], 60000)


def test_kill_one_task_restarts_in_the_allocation_with_the_exact_digest(slurm_cluster, tmp_path, digits_reference):  # noqa: F811  (the imported fixture)
    run_dir = tmp_path / "run"
    job_id = submit(slurm_cluster, RUN_SBATCH, run_dir, SLOW_DIGITS, *DIGITS_FLAGS, port_base=port_base())
    wait_for(lambda: committed(run_dir), "the first checkpoint of attempt 1")
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    state = slurm_cluster.wait_job(job_id)
    assert (state.state, state.exit_code, state.restarts) == ("COMPLETED", "0:0", 0), output(run_dir, job_id)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["restarts"], summary["attempts"]) == ("completed", 1, 2)
    assert summary["weights_sha256"] == digits_reference
    events = read_events(run_dir)
    steps = [e for e in events if e["event"] == "slurm_step_started"]
    assert [(e["attempt"], e["slurm_job"]) for e in steps] == [(1, job_id), (2, job_id)]
    killed = [e for e in events if e["event"] == "worker_exited" and e["attempt"] == 1 and e["rank"] == 1]
    assert killed[0]["signal"] == "SIGKILL"


def test_scancel_sigterm_saves_exits_143_and_requeue_loses_no_step(slurm_cluster, tmp_path, digits_reference):  # noqa: F811  (the imported fixture)
    run_dir = tmp_path / "run"
    job_id = submit(slurm_cluster, RUN_SBATCH, run_dir, SLOW_DIGITS, *DIGITS_FLAGS, port_base=port_base())
    wait_for(lambda: committed(run_dir), "the first checkpoint of attempt 1")
    assert slurm_cluster.run("scancel", "--signal=TERM", job_id).returncode == 0  # the job's steps, as preemption does
    state = slurm_cluster.wait_job(job_id)
    assert (state.state, state.exit_code, state.restarts) == ("COMPLETED", "0:0", 1), output(run_dir, job_id)
    events = read_events(run_dir)
    finished = [(e["status"], e["lost_steps"]) for e in events if e["event"] == "run_finished"]
    assert finished == [("preempted", 0), ("completed", 0)]
    requested = [e["source"] for e in events if e["event"] == "preemption_requested" and e.get("role") == "supervisor"]
    assert requested == ["launcher:slurm"]  # Slurm signalled the tasks, not the supervisor
    exits = {e["rank"]: e.get("exit_code") for e in events if e["event"] == "worker_exited" and e["attempt"] == 1}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    preempted = [e["global_step"] for e in events if e["event"] == "preempted"]
    restored = [e["global_step"] for e in events if e["event"] == "restored"]
    assert len(preempted) == 1 and restored == preempted  # resumed at the agreed step: zero lost steps
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["lost_steps"]) == ("completed", 0)
    assert summary["weights_sha256"] == digits_reference


def test_workers_sbatch_with_tf_config_from_slurm_gives_the_exact_digest(slurm_cluster, tmp_path, digits_reference):  # noqa: F811  (the imported fixture)
    run_dir = tmp_path / "run"
    job_id = submit(slurm_cluster, WORKERS_SBATCH, run_dir, DIGITS, *DIGITS_FLAGS, "--workers", "2",
                    port_base=port_base())
    state = slurm_cluster.wait_job(job_id)
    assert (state.state, state.exit_code) == ("COMPLETED", "0:0"), output(run_dir, job_id)
    done = [e for e in read_events(run_dir) if e["event"] == "training_completed"]
    assert [(e["global_step"], e["weights_sha256"]) for e in done] == [(20, digits_reference)]
