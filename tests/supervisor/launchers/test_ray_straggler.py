"""--straggler-policy replace on the Ray launcher: a worker throttled for real (the chaos throttle,
SIGSTOP 50 ms / SIGCONT 50 ms on its pid, chaos/nemesis.py ``Throttle``) on one node of a loopback
cluster (tests/support/raycluster.py; ``--workers 2`` on three nodes of one CPU) is named, the
chief's straggler marker has the Ray launcher avoid that node (``node_avoided``, provider
``straggler``), the group saves the step the stop names and exits 143, and attempt 2 runs on the
two other nodes from exactly that step. The local launcher's case, with the final digest, is
tests/chaos/test_ci_scenarios.py's."""

from __future__ import annotations

import pytest

from resilient_train.chaos.nemesis import Throttle
from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.test_elastic import _of, run_with_triggers
from tests.supervisor.launchers.test_ray import RAY, nodes_of
from tests.support.raycluster import joined_cluster

FLAGS = ("--epochs", "1", "--steps-per-epoch", "3000", "--global-batch-size", "32", "--save-every-steps", "1000",
         "--straggler-window", "6", "--straggler-policy", "replace", "--snapshot-every", "off")


@pytest.mark.slow  # a Ray cluster and a 3000-step run (minutes on 2 cores); test_ray_notice.py's fixed-size case and tests/chaos/test_ci_scenarios.py's replace test cover its parts
def test_a_throttled_worker_is_replaced_off_its_node(tmp_path, monkeypatch):
    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "30")
    throttles: list[Throttle] = []
    throttled: dict[str, int | str] = {}

    def throttle_rank_1(events):
        started = {e["rank"]: e for e in events if e["event"] == "worker_started" and e["attempt"] == 1}
        throttled.update(pid=started[1]["pid"], node=started[1]["node"])
        throttles.append(Throttle(int(throttled["pid"]), 0.05, 0.05).start())

    with joined_cluster(nodes=3, cpus_per_node=1):
        try:
            job = run_with_triggers("recipes/digits_cnn.py", tmp_path / "run", *FLAGS, *RAY, timeout=600, triggers=[
                (lambda events: bool(_of(events, "first_step", 1)), throttle_rank_1)])
        finally:
            for throttle in throttles:
                throttle.stop()
    assert job.returncode == 0, job.output
    events = job.events
    [named] = job.named("straggler_detected")
    assert (named["attempt"], named["rank"], named["evidence"], named["action"]) == (1, 1, "stalled", "replace")
    assert [(e["attempt"], e["nodes"], e["providers"], e["placeable"], e["action"]) for e in job.named("node_avoided")] == [
        (1, [throttled["node"]], ["straggler"], 2, "restart")]
    [request] = [e for e in job.named("preemption_requested") if e["source"] == "straggler:1"]
    saved = request["global_step"]
    assert [e["global_step"] for e in _of(events, "preempted", 1)] == [saved]
    assert {e["rank"]: e.get("exit_code") for e in _of(events, "worker_exited", 1)} == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    assert [(e["rank"], e["global_step"], e["moved"], e["nodes"], e["launcher"]) for e in job.named("straggler_replaced")] == [
        (1, saved, "node_avoided", [throttled["node"]], "ray")]
    assert [e["global_step"] for e in _of(events, "restored", 2)] == [saved]
    second = nodes_of(events, 2)
    assert sorted(second) == [0, 1] and throttled["node"] not in second.values()
    summary = job.summary
    assert (summary["status"], summary["restarts"], summary["preemptions"], summary["lost_steps"]) == (
        "completed", 0, 1, 0)
