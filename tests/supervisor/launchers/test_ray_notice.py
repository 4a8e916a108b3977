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

The slow variant is the fixed-size case: ``--workers 2`` on three nodes, a notice on rank
1's node -> the attempt ends 143 at the save and restarts, as a preemption, on the two
other nodes, and the weights are bit-identical to the uninterrupted local run's.
"""

from __future__ import annotations

import contextlib

import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.conftest import DIGITS_FLAGS
from tests.integration.test_elastic import FLAGS as ELASTIC_FLAGS
from tests.integration.test_elastic import INDEXED, RECIPE_FLAGS, _of, assert_same_examples_as_uninterrupted, run_with_triggers
from tests.integration.test_elastic import uninterrupted  # noqa: F401  (the fixture, by request.getfixturevalue)
from tests.supervisor.launchers.test_ray import RAY, nodes_of
from tests.support.metadata_server import MetadataServer
from tests.support.raycluster import joined_cluster


@pytest.mark.slow  # test_preemption_notices.py (a notice saves the agreed step), test_elastic.py (shrink and grow) and test_ray.py (a lost node) cover its parts
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


@pytest.mark.slow  # a second Ray cluster and run (~3-4 min on 2 busy cores); the elastic case above is the default
def test_a_notice_on_one_node_of_a_fixed_size_run_restarts_it_on_the_other_nodes(tmp_path, monkeypatch, digits_reference):
    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "30")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(MetadataServer("gce")) for _ in range(3)]
        cluster = stack.enter_context(joined_cluster(nodes=3, cpus_per_node=1,
                                                     node_env=[server.environ() for server in servers]))
        by_node = {node.node_id: server for node, server in zip(cluster.workers, servers)}
        doomed: dict[str, str] = {}

        def announce_on_rank_1(events):
            doomed["node"] = nodes_of(events, 1)[1]
            by_node[doomed["node"]].announce()

        job = run_with_triggers("tests/recipes/slow_digits.py", tmp_path / "run", *DIGITS_FLAGS, *RAY,
                                "--set", "step_delay_s=0.3", triggers=[
                                    (lambda events: bool(_of(events, "checkpoint_committed", 1)), announce_on_rank_1)])
    assert job.returncode == 0, job.output
    events = job.events
    avoided = job.named("node_avoided")
    assert [(e["attempt"], e["nodes"], e["placeable"], e["action"]) for e in avoided] == [
        (1, [doomed["node"]], 2, "restart")]
    exits = {e["rank"]: e.get("exit_code") for e in _of(events, "worker_exited", 1)}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    saved = [e["global_step"] for e in _of(events, "preempted", 1)]
    assert len(saved) == 1
    assert [e["global_step"] for e in _of(events, "restored", 2)] == saved
    second = nodes_of(events, 2)
    assert sorted(second) == [0, 1] and doomed["node"] not in second.values()
    summary = job.summary
    assert (summary["restarts"], summary["preemptions"], summary["membership_changes"], summary["lost_steps"]) == (
        0, 1, 0, 0)
    assert summary["weights_sha256"] == digits_reference
