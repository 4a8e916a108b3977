"""The Ray launcher on a real 3-node Ray cluster (loopback, tests/support/raycluster.py).

Every job is the real CLI with real worker processes; each must end with the exact
weights digest of the uninterrupted local run (``digits_reference``).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

from resilient_train.errors import EXIT_FAILURE, EXIT_PREEMPTED, EXIT_USAGE
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until, survivors, worker_pids
from tests.integration.test_elastic import FLAGS as ELASTIC_FLAGS
from tests.integration.test_elastic import (INDEXED, RECIPE_FLAGS, _of, assert_same_examples_as_uninterrupted,
                                            assert_shrank_and_grew_back, run_with_triggers)
from tests.integration.test_elastic import uninterrupted  # noqa: F401  (the fixture, by request.getfixturevalue)

SLOW_DIGITS = "tests/recipes/slow_digits.py"  # digits_cnn, same weights, 0.15 s per step
RAY = ("--launcher", "ray", "--storage-shared")  # the test nodes share this machine's disk


def after_first_commit(events):
    return any(e["event"] == "checkpoint_committed" for e in events)


def scalar_steps(run_dir):
    """tag -> steps of the TensorBoard log in the supervisor's run dir (train/* is time-based)."""
    from resilient_train.runner.outputs.tensorboard import read_scalars  # imports TensorFlow

    return {tag: [step for step, _ in values] for tag, values in read_scalars(run_dir / "tensorboard").items()}


def nodes_of(events, attempt):
    return {e["rank"]: e["node"] for e in events if e["event"] == "worker_started" and e["attempt"] == attempt}


def test_two_workers_on_two_nodes_match_the_local_run(tmp_path, ray_cluster, digits_reference):
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, *RAY)
    assert job.returncode == 0, job.output
    nodes = nodes_of(job.events, 1)
    assert sorted(nodes) == [0, 1] and nodes[0] != nodes[1]  # spread: one worker per node
    assert set(nodes.values()) <= {n.node_id for n in ray_cluster.workers}
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", 20, 0)
    assert summary["weights_sha256"] == digits_reference
    # what the workers wrote on their nodes reached the supervisor's run dir
    assert (tmp_path / "run" / "attempt-1" / "step-1.txt").read_text().strip() == "20"
    assert "training_completed" in {e["event"] for e in job.events if e.get("role") == "chief"}
    assert (tmp_path / "run" / "attempt-1" / "worker-1.log").stat().st_size > 0
    # so did the chief's TensorBoard log and export, and the nodes' run dirs are gone
    steps = scalar_steps(tmp_path / "run")
    assert (steps["epoch/loss"], steps["run/restarts"]) == ([10, 20], [0])
    assert steps["checkpoint/commit_s"] == [e["global_step"] for e in job.named("checkpoint_committed")]
    export = json.loads((tmp_path / "run" / "model" / "export.json").read_text())
    assert (export["weights_sha256"], export["global_step"]) == (digits_reference, 20)
    assert not (Path(tempfile.gettempdir()) / "resilient-train-ray" / summary["run_id"]).exists()


@pytest.mark.slow  # losing a whole node below gang-restarts on Ray too
def test_kill_9_of_a_worker_on_another_node_gang_restarts_exactly(tmp_path, ray_cluster, digits_reference):
    job = run_job_until(
        SLOW_DIGITS, tmp_path / "run", *DIGITS_FLAGS, *RAY,
        when=after_first_commit,
        action=lambda proc, events: os.kill(worker_pids(events)[1], signal.SIGKILL),
    )
    assert job.returncode == 0, job.output
    exits = [e for e in job.named("worker_exited") if e["attempt"] == 1 and e["rank"] == 1]
    assert exits[0]["signal"] == "SIGKILL" and "reason" not in exits[0]  # a process death, not a node loss
    assert [g["attempt"] for g in job.named("gang_restart")] == [2]
    assert job.named("node_lost") == []
    assert [r["attempt"] for r in job.named("restored")] == [2]
    summary = job.summary
    assert (summary["status"], summary["restarts"], summary["attempts"]) == ("completed", 1, 2)
    assert summary["weights_sha256"] == digits_reference


@pytest.mark.slow  # the same path as the local launcher's test
def test_sigterm_to_the_supervisor_exits_143_and_rerun_loses_nothing(tmp_path, ray_cluster, digits_reference):
    run_dir = tmp_path / "run"
    job = run_job_until(
        SLOW_DIGITS, run_dir, *DIGITS_FLAGS, *RAY,
        when=after_first_commit,
        action=lambda proc, events: proc.send_signal(signal.SIGTERM),
    )
    assert job.returncode == EXIT_PREEMPTED, job.output
    assert job.summary["status"] == "preempted"
    preempted = job.named("preempted")
    assert len(preempted) == 1
    exits = {e["rank"]: e.get("exit_code") for e in job.named("worker_exited")}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    committed = [e["global_step"] for e in job.named("checkpoint_committed")]
    assert committed[-1] == preempted[0]["global_step"]  # the agreed step was saved

    rerun = run_job(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, *RAY, "--set", "step_delay_s=0")
    assert rerun.returncode == 0, rerun.output
    assert {r["global_step"] for r in rerun.named("restored")} == {preempted[0]["global_step"]}
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == digits_reference


def run_losing_the_node_of_rank_1(ray_cluster, run_dir, *flags, nodes_to_add):
    """Run the slow recipe on Ray, remove rank 1's node after the first commit, then add
    ``nodes_to_add`` fresh nodes back whatever happened; (job, the removed node's id)."""
    lost: dict[str, str] = {}

    def remove_node_of_rank_1(proc, events):
        lost["node"] = nodes_of(events, 1)[1]
        ray_cluster.remove(lost["node"])

    try:
        job = run_job_until(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, *RAY, *flags,
                            when=after_first_commit, action=remove_node_of_rank_1)
    finally:
        for _ in range(nodes_to_add):
            ray_cluster.add_worker()
    return job, lost.get("node")


def test_losing_a_whole_node_moves_the_job_to_the_spare(tmp_path, ray_cluster, digits_reference):
    # the next test module gets its own cluster; adding one back keeps 3 here
    job, lost_node = run_losing_the_node_of_rank_1(ray_cluster, tmp_path / "run", nodes_to_add=1)
    assert job.returncode == 0, job.output
    node_lost = job.named("node_lost")
    assert [e["node"] for e in node_lost] == [lost_node]
    exits = [e for e in job.named("worker_exited") if e["attempt"] == 1 and e["rank"] == 1]
    assert exits[0]["reason"] == "node lost"
    last = max(e["attempt"] for e in job.named("worker_started"))
    later = nodes_of(job.events, last)
    assert lost_node not in later.values() and len(set(later.values())) == 2
    # only the lost slot was replaced: the chief stayed on its node, in its warm standby
    assert later[0] == nodes_of(job.events, 1)[0]
    chief = [e for e in job.named("worker_started") if e["attempt"] == last and e["rank"] == 0]
    assert chief[0]["standby"] is True
    assert [e.get("replaced") for e in job.named("placement_ready")] == [None, [1]]
    summary = job.summary
    assert summary["status"] == "completed" and summary["restarts"] >= 1
    assert summary["weights_sha256"] == digits_reference
    # the new chief resumed the supervisor's TensorBoard log: each tag's steps once, in order
    steps = scalar_steps(tmp_path / "run")
    assert steps["epoch/loss"] == [10, 20] and len(steps["run/restarts"]) >= 2
    assert {tag: s for tag, s in steps.items() if s != sorted(set(s))} == {}


@pytest.mark.slow  # node loss on Ray: the spare test above; a restart that cannot be placed: tests/supervisor/launchers/test_ray_units.py
def test_losing_a_node_with_no_spare_fails_the_run_and_a_rerun_loses_no_commit(
    tmp_path, ray_cluster, digits_reference, monkeypatch
):
    """2 nodes of 2 CPUs, a worker of 2 CPUs on each: after one node dies, no placement is left."""
    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "5")  # the jobs inherit this process's environment
    run_dir = tmp_path / "run"
    spare = ray_cluster.workers[-1].node_id
    ray_cluster.remove(spare)
    # two nodes added back: 3 again for the tests after this one
    job, lost_node = run_losing_the_node_of_rank_1(ray_cluster, run_dir, "--cpus-per-worker", "2", nodes_to_add=2)
    assert job.returncode == EXIT_FAILURE, job.output
    assert "Traceback" not in job.output
    assert [e["node"] for e in job.named("node_lost")] == [lost_node]
    failed = job.named("launch_failed")
    assert [(e["attempt"], e["launcher"]) for e in failed] == [(2, "ray")]
    assert failed[0]["reason"].startswith("could not place 2 workers: Ray could not place 2 workers with {'CPU': 2.0} each")
    committed = [e["global_step"] for e in job.named("checkpoint_committed")]
    summary = job.summary
    assert (summary["status"], summary["attempts"], summary["global_step"]) == ("failed", 2, committed[-1])
    root = summary["root_cause"]
    assert (root["type"], root["exit"], root["attempt"], root["message"]) == (
        "RestartNotPlacedError", "not started", 2, failed[0]["reason"])
    assert [e["status"] for e in job.named("run_finished")] == ["failed"]

    monkeypatch.setenv("RT_RAY_PLACEMENT_TIMEOUT_S", "60")
    rerun = run_job(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, *RAY, "--set", "step_delay_s=0")
    assert rerun.returncode == 0, rerun.output
    assert {r["global_step"] for r in rerun.named("restored") if r["attempt"] == 3} == {committed[-1]}
    assert rerun.summary["weights_sha256"] == digits_reference


def test_more_cpus_than_the_cluster_has_is_a_clean_error(tmp_path, ray_cluster):
    job = run_job(
        DIGITS, tmp_path / "run", *DIGITS_FLAGS, *RAY, "--cpus-per-worker", "64",
        env={"RT_RAY_PLACEMENT_TIMEOUT_S": "3"},
    )
    assert job.returncode == EXIT_USAGE, job.output
    assert "Ray could not place 2 workers with {'CPU': 64.0} each (spread) within 3 s" in job.output
    assert "Traceback" not in job.output
    assert job.named("worker_started") == []


@pytest.mark.slow  # the same guarantee as the local launcher's test
def test_no_worker_outlives_a_sigkilled_supervisor(tmp_path, ray_cluster):
    """The driver's death makes Ray kill its slot actors; their workers get the parent-death signal."""
    pids: dict[int, int] = {}

    def kill_supervisor(proc, events):
        pids.update(worker_pids(events))
        proc.send_signal(signal.SIGKILL)

    job = run_job_until(
        DIGITS, tmp_path / "run", *RAY, "--epochs", "50",
        when=lambda events: any(e["event"] == "first_step" for e in events),
        action=kill_supervisor,
    )
    assert job.returncode == -signal.SIGKILL
    assert sorted(pids) == [0, 1]
    assert survivors(pids.values(), within_s=60) == []


@pytest.mark.slow  # the supervisor's resize path is tests/integration/test_elastic.py's; Ray's capacity has unit tests
@pytest.mark.parametrize("recipe", [INDEXED, SLOW_DIGITS])
def test_an_elastic_run_continues_on_the_node_left_and_grows_back_when_one_joins(tmp_path, ray_cluster, recipe, request):
    """--workers 1:2 on 2 nodes that hold one worker each (2 CPUs): rank 1's node dies with
    no spare -> attempt 2 runs 1 worker from the last commit; a node joins -> attempt 3 is
    back at 2 from attempt 2's agreed save, and the run completes. No restart is spent. With
    the indexed recipe every global step trained on the uninterrupted 2-worker run's examples
    (per-step index digests) and the weights are within test_elastic's tolerance of its."""
    ray_cluster.remove(ray_cluster.workers[-1].node_id)  # no spare
    recipe_flags = RECIPE_FLAGS[INDEXED] if recipe == INDEXED else ("--set", "step_delay_s=0.5")
    flags = (*ELASTIC_FLAGS, *RAY, "--cpus-per-worker", "2", "--workers", "1:2", *recipe_flags)
    try:
        job = run_with_triggers(recipe, tmp_path / "run", *flags, triggers=[
            (lambda events: bool(_of(events, "checkpoint_committed", 1)),
             lambda events: ray_cluster.remove(nodes_of(events, 1)[1])),
            (lambda events: bool(_of(events, "first_step", 2)), lambda events: ray_cluster.add_worker()),
        ])
    finally:
        while len(ray_cluster.workers) < 3:  # 3 again for the tests after this one
            ray_cluster.add_worker()
    assert_shrank_and_grew_back(job)
    if recipe == INDEXED:
        assert_same_examples_as_uninterrupted(job.run_dir, request.getfixturevalue("uninterrupted"))
