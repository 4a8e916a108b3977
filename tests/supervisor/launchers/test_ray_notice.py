"""A preemption notice on ONE node of an elastic Ray run: a planned shrink, no lost step.

Each node of the loopback cluster (tests/support/raycluster.py) has its own GCE metadata
server (tests/support/metadata_server.py): its raylet is started with its own
GCE_METADATA_HOST, so the slot actors and the workers on that node, and only they, watch
that server. ``--workers 1:2`` on two nodes of one CPU each: one worker per node, no spare.
After attempt 1's first commit, node B's server says ``instance/preempted = TRUE``. The
worker there votes stop, the group saves the step it agreed on and exits 143; the
supervisor has the Ray launcher avoid node B (``node_avoided``), resizes to the one worker
node A holds (RESIZING, reason naming the notice, no budget spent), and attempt 2 restores
exactly the saved step on node A and completes. The indexed recipe trains every global step
on the uninterrupted 2-worker run's examples, so the weights are within test_elastic's
tolerance of that run's (floating-point reduction order only).
"""

from __future__ import annotations

import pytest

from tests.integration.test_elastic import FLAGS as ELASTIC_FLAGS
from tests.integration.test_elastic import INDEXED, RECIPE_FLAGS, _of, assert_same_examples_as_uninterrupted, run_with_triggers
from tests.integration.test_elastic import uninterrupted  # noqa: F401  (the fixture, by request.getfixturevalue)
from tests.supervisor.launchers.test_ray import RAY, nodes_of
from tests.support.metadata_server import MetadataServer
from tests.support.raycluster import joined_cluster


def test_a_notice_on_one_node_shrinks_the_elastic_run_without_a_lost_step(tmp_path, request, monkeypatch):
    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "30")  # the job inherits it: a wrong wait is seen, not endless
    with MetadataServer("gce") as quiet, MetadataServer("gce") as doomed, \
            joined_cluster(nodes=2, cpus_per_node=1, node_env=[quiet.environ(), doomed.environ()]) as cluster:
        node_a, node_b = (node.node_id for node in cluster.workers)
        job = run_with_triggers(INDEXED, tmp_path / "run", *ELASTIC_FLAGS, *RAY, "--workers", "1:2",
                                *RECIPE_FLAGS[INDEXED], triggers=[
                                    (lambda events: bool(_of(events, "checkpoint_committed", 1)),
                                     lambda events: doomed.announce())])
    assert job.returncode == 0, job.output
    events = job.events
    first = nodes_of(events, 1)
    assert sorted(first.values()) == sorted([node_a, node_b])
    on_b = [rank for rank, node in first.items() if node == node_b]

    # Only node B's worker had the notice (node A's server never said anything).
    notices = job.named("preemption_notice")
    assert {(e["rank"], e["provider"], e["kind"], e["action"]) for e in notices} == {(on_b[0], "gce", "preempted", "stop")}
    avoided = job.named("node_avoided")
    assert [(e["attempt"], e["nodes"], e["providers"], e["placeable"], e["action"]) for e in avoided] == [
        (1, [node_b], ["gce"], 1, "shrink")]
    reason = f"preemption notice (gce) on node {node_b}: the group continues without it at 1 workers"
    resizing = [e for e in events if e["event"] == "run_state" and e["to"] == "resizing"]
    assert [(e["attempt"], e["reason"]) for e in resizing] == [(1, reason)]
    resizes = [(e["attempt"], e["from"], e["to"], e["reason"]) for e in job.named("world_size_changed") if "from" in e]
    assert resizes == [(2, 2, 1, reason)]

    # The agreed save is attempt 1's last commit, and attempt 2 restores exactly that step.
    saved = [e["global_step"] for e in _of(events, "preempted", 1)]
    assert len(saved) == 1
    assert max(e["global_step"] for e in _of(events, "checkpoint_committed", 1)) == saved[0]
    assert [e["global_step"] for e in _of(events, "restored", 2)] == saved
    assert nodes_of(events, 2) == {0: node_a}  # never node B again
    summary = job.summary
    assert (summary["status"], summary["global_step"]) == ("completed", 20)
    assert (summary["restarts"], summary["preemptions"], summary["membership_changes"], summary["lost_steps"]) == (
        0, 0, 1, 0)
    assert summary["world_sizes"] == {"1": 2, "2": 1}
    assert_same_examples_as_uninterrupted(job.run_dir, request.getfixturevalue("uninterrupted"))
