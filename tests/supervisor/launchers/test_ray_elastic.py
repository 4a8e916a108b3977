"""An elastic run on Ray loses a node with no spare: it shrinks to the node left and completes.

The cluster (tests/support/raycluster.py, ``one_cpu_ray_cluster``) is a 0-CPU head and two
1-CPU nodes, so each node holds exactly one worker of ``--workers 1:2``. A node is removed
(``allow_graceful=False``: raylet, object store and every process on it killed at once)
after the third commit. Ray declares it dead only after its health check misses 10
heartbeats (~5 s here), so the supervisor usually sees the attempt end while Ray still
lists the node alive, and the next attempt's Ray calls on that node's slot then fail with
the node's death (issue 30: an ``ActorDiedError`` from the replacement slot's ``where``
ended the run with exit 1).
Whichever Ray call notices first, the slot is lost, the run shrinks to one worker from the
last commit, and it completes at the last step.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import DIGITS
from tests.integration.harness import run_job_until
from tests.supervisor.launchers.test_ray import RAY, nodes_of

EPOCHS, STEPS_PER_EPOCH, SAVE_EVERY = 2, 80, 10
FLAGS = ("--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH),
         "--save-every-steps", str(SAVE_EVERY), "--workers", "1:2", *RAY)
# Where Ray's verdict on the node reaches the run (module docstring), and how the run shrinks:
# declared dead when attempt 1 settles -> a membership change, no restart spent; declared
# dead only while attempt 2 replaces the lost slot -> attempt 1 was a failure (1 restart),
# the replacement is lost, and the supervisor starts attempt 2 at the size Ray can place.
NODE_DEAD_AT_SETTLE = ("capacity fell: the launcher can place 1 of 2 workers", 0)
NODE_DEAD_AT_REPLACE = ("no placement for 2 workers", 1)


def after_third_commit(events):
    return sum(e["event"] == "checkpoint_committed" for e in events) >= 3


@pytest.mark.slow  # ~2-4 min on 2 busy cores; test_ray.py's elastic test covers the supervisor's resize path
@pytest.mark.parametrize("lost_rank", [0, 1], ids=["chief-node", "other-node"])
def test_losing_a_node_without_a_spare_shrinks_to_one_worker_and_completes(
    tmp_path, one_cpu_ray_cluster, lost_rank, monkeypatch
):
    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "20")  # the job inherits it: a wrong wait is seen, not endless
    cluster = one_cpu_ray_cluster
    lost: dict[str, str] = {}

    def remove_node(proc, events):
        lost["node"] = nodes_of(events, 1)[lost_rank]
        cluster.remove(lost["node"])

    try:
        job = run_job_until(DIGITS, tmp_path / "run", *FLAGS, when=after_third_commit, action=remove_node, timeout=480)
    finally:
        while len(cluster.workers) < 2:  # 2 nodes again for the next test
            cluster.add_worker()
    assert job.returncode == 0, job.output
    assert "Traceback" not in job.output
    events = job.events
    first = nodes_of(events, 1)
    assert sorted(first) == [0, 1] and first[0] != first[1]
    survivor = first[1 - lost_rank]

    resizes = [e for e in job.named("world_size_changed") if "from" in e]  # the supervisor's, not the chief's
    assert len(resizes) == 1, resizes
    shrink = resizes[0]
    assert (shrink["attempt"], shrink["from"], shrink["to"]) == (2, 2, 1)
    summary = job.summary
    assert (shrink["reason"], summary["restarts"]) in (NODE_DEAD_AT_SETTLE, NODE_DEAD_AT_REPLACE)
    if shrink["reason"] == NODE_DEAD_AT_REPLACE[0]:
        lost_slots = [(e["slots"], e["error"], e["retry"]) for e in job.named("placement_lost")]
        assert lost_slots == [([lost_rank], "ActorDiedError", True)]
    # attempt 2 ran one worker, on the node left, to the end
    attempts = sorted({e["attempt"] for e in job.named("worker_started")})
    assert attempts == [1, 2]
    assert nodes_of(events, 2) == {0: survivor}
    # it resumed from a commit of attempt 1, never one before its last commit event: the
    # chief's newest commits can die with its node before their events come back, so the
    # restored step may be past the last event's (a save step, in storage all the same)
    committed_1 = [e["global_step"] for e in events if e["event"] == "checkpoint_committed" and e["attempt"] == 1]
    assert len(committed_1) >= 3 and committed_1[:3] == [10, 20, 30]
    restored = [e["global_step"] for e in job.named("restored") if e["attempt"] == 2]
    assert len(restored) == 1 and restored[0] % SAVE_EVERY == 0
    assert committed_1[-1] <= restored[0] < EPOCHS * STEPS_PER_EPOCH
    if lost_rank == 1:  # the chief lived: every commit's event came back
        assert restored == [committed_1[-1]]

    assert (summary["status"], summary["global_step"]) == ("completed", EPOCHS * STEPS_PER_EPOCH)
    assert summary["world_sizes"] == {"1": 2, "2": 1}
    assert [e["status"] for e in job.named("run_finished")] == ["completed"]
    assert job.named("launch_failed") == []
