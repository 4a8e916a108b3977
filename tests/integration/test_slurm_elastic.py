"""Elastic ``--workers 1:2`` on a real two-node Slurm cluster (tests/support/slurm_nodes.py).

deploy/slurm/run.sbatch is submitted as a user would, with ``--no-kill`` on two nodes with one
task each; the supervisor runs in the batch step on node0 and asks ``scontrol show job`` for
the allocation's size (SlurmLauncher.capacity). The scenario, each change made the way it
happens on a real cluster:

1. node1 dies (every process on it SIGKILLed: slurmd, slurmstepd, rank 1). Slurm notices by
   slurmd's silence (SlurmdTimeout), sets node1 DOWN, drops it from the ``--no-kill`` job
   (NodeList node0, NumNodes 1) and ends the step. No spare: the run continues at 1 worker
   from attempt 1's last commit, spending no restart.
2. node1 comes back (its slurmd restarts) and the allocation is grown onto it with Slurm
   22.05's one way to grow a running job: an allocation ``--dependency=expand:JOB`` whose
   nodes ``scontrol update jobid=GRANT NumNodes=0`` hands to the job. The supervisor sees
   capacity 2, the group saves at an agreed step and the run continues at 2 workers.

The indexed recipe proves the data across both resizes: every global step trains on the
examples the uninterrupted 2-worker run's same step trains on, and the weights differ from
that run's by float reduction order only (tests/integration/test_elastic.py's helpers).

Slow (a few minutes): RT_SLOW=1 or RT_REQUIRE_SLURM=1 (``make test-all``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.harness import REPO, Job, read_events
from tests.integration.test_elastic import (  # noqa: F401  (uninterrupted: a module fixture)
    FLAGS, INDEXED, RECIPE_FLAGS, assert_same_examples_as_uninterrupted, assert_shrank_and_grew_back, uninterrupted,
)
from tests.integration.test_slurm import RUN_SBATCH, job_env, output, port_base, wait_for
from tests.support.slurm_nodes import slurm_nodes  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("RT_SLOW") != "1" and os.environ.get("RT_REQUIRE_SLURM") != "1",
        reason="real Slurm scenarios; set RT_SLOW=1 (or RT_REQUIRE_SLURM=1) to run them",
    ),
]


def _of(run_dir: Path, name: str, attempt: int) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == name and e.get("attempt") == attempt]


def test_a_lost_node_shrinks_the_run_and_an_expanded_allocation_grows_it_back(slurm_nodes, tmp_path, uninterrupted):  # noqa: F811  (the imported fixture)
    cluster, run_dir = slurm_nodes, tmp_path / "run"
    job_id = cluster.sbatch(
        "--no-kill", "--nodes=2", "--ntasks-per-node=1", f"--output={tmp_path / 'sbatch-%j.out'}",
        RUN_SBATCH, INDEXED, "--run-dir", str(run_dir), "--workers", "1:2", *FLAGS, *RECIPE_FLAGS[INDEXED],
        env=job_env(run_dir, port_base()), cwd=REPO,
    )
    wait_for(lambda: any(e["global_step"] >= 4 for e in _of(run_dir, "checkpoint_committed", 1)),
             "attempt 1 to commit step 4")
    assert cluster.allocation(job_id) == ("node[0-1]", "2")

    cluster.crash("node1")
    wait_for(lambda: cluster.allocation(job_id)[0] != "node[0-1]", "Slurm to drop the dead node1 from the job", 180)
    assert cluster.allocation(job_id) == ("node0", "1")
    assert cluster.node_states()["node1"] == "down*"

    cluster.boot("node1")
    cluster.wait_idle("node1")
    grant = cluster.expansion(job_id, "node1")
    wait_for(lambda: bool(_of(run_dir, "first_step", 2)), "attempt 2 (1 worker) to train", 300)
    cluster.merge(grant)
    assert cluster.allocation(job_id) == ("node[0-1]", "2")

    state = cluster.wait_job(job_id)
    assert (state.state, state.exit_code, state.restarts) == ("COMPLETED", "0:0", 0), output(run_dir, job_id)
    assert_shrank_and_grew_back(Job(0, output(run_dir, job_id), run_dir))
    steps = [(e["attempt"], e["slurm_job"]) for e in read_events(run_dir) if e["event"] == "slurm_step_started"]
    assert steps == [(1, job_id), (2, job_id), (3, job_id)]  # one allocation throughout
    lost = [(e["rank"], e.get("signal")) for e in _of(run_dir, "worker_exited", 1) if e["rank"] == 1]
    assert lost == [(1, "SIGKILL")]  # its node died: no report, counted as SIGKILL once Slurm ended the step

    assert_same_examples_as_uninterrupted(run_dir, uninterrupted)
