"""A worker that never joins: it says which rank it could not reach, at which address, in time.

Two real worker processes (no supervisor, like test_stale_writer.py: each is given its own
TF_CONFIG), where rank 1's TF_CONFIG names a chief address that nothing listens on, a
closed port on 127.0.0.1: what a wrong address or a firewall between two nodes looks like
from rank 1. Rank 1 must fail within its share of the start-up timeout with a
PeerUnreachableError naming rank 0 and that address, instead of waiting in TensorFlow's
cluster registration (an hour by default), and the root cause of the attempt is rank 1's
line. The chief reached rank 1 (rank 1's port placeholder listened), then waits at
TensorFlow's registration barrier for a peer that never registers: bounded by the start-up
timeout, it exits 4 (the group broke), a secondary failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.tf_config import build_tf_config
from resilient_train.errors import EXIT_FAILURE, EXIT_GROUP_BROKEN
from resilient_train.rundir.errorfile import choose_root_cause, read_errors
from tests.integration.harness import REPO, environment

LINEAR = "recipes/linear_regression.py"
STARTUP_TIMEOUT_S = 8  # rank 1 probes for half of it


def start_worker(run_dir: Path, tf_config: dict, rank: int) -> subprocess.Popen:
    env = environment(RT_ATTEMPT="1", RT_GENERATION="1", RT_RUN_ID="never-joins", TF_CONFIG=json.dumps(tf_config))
    with open(run_dir / f"worker-{rank}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "resilient_train.runner", LINEAR, "--run-dir", str(run_dir), "--workers", "2",
             "--startup-timeout", str(STARTUP_TIMEOUT_S), "--no-warm-standby"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )


def test_a_worker_that_cannot_reach_the_chief_names_the_rank_and_address(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    chief_port, worker_port, closed_port = free_ports(3)
    real = [f"127.0.0.1:{chief_port}", f"127.0.0.1:{worker_port}"]
    wrong = [f"127.0.0.1:{closed_port}", f"127.0.0.1:{worker_port}"]  # rank 1's view of the chief
    started = time.monotonic()
    procs = {0: start_worker(run_dir, build_tf_config(real, 0), 0), 1: start_worker(run_dir, build_tf_config(wrong, 1), 1)}
    exits = {}
    try:
        for rank in (1, 0):
            exits[rank] = (procs[rank].pid, procs[rank].wait(timeout=180), time.time())
            print(f"\nrank {rank} exited {time.monotonic() - started:.1f} s after start "
                  f"(start-up timeout {STARTUP_TIMEOUT_S} s)")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = (run_dir / "worker-1.log").read_text(errors="replace")
    returncode = exits[1][1]

    expected = (f"rank 1 (127.0.0.1:{worker_port}) could not reach rank 0 (chief) at 127.0.0.1:{closed_port} "
                f"within {STARTUP_TIMEOUT_S / 2:.0f} s (connection refused: nothing listens there)")
    assert returncode == EXIT_FAILURE, log
    assert f"resilient-train worker 1: peer unreachable: {expected}" in log
    chief, error = read_errors(run_dir / "attempt-1")
    assert (error.rank, error.type, error.secondary) == (1, "resilient_train.errors.PeerUnreachableError", False)
    assert error.message.startswith(expected)
    assert exits[0][1] == EXIT_GROUP_BROKEN, (run_dir / "worker-0.log").read_text(errors="replace")
    assert (chief.rank, chief.short_type, chief.secondary) == (0, "GroupBrokenError", True)
    assert "Wait_for_all_tasks_to_register" in chief.message

    root = choose_root_cause(exits, [chief, error], lambda rank: [])
    assert root is not None and (root.rank, root.secondary_ranks) == (1, [0])
    assert f"  PeerUnreachableError: {expected}" in root.render()
