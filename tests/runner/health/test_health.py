"""Numerical health (runner/health/): the in-graph test of a step, the host's reading of a
call's rows, the policy, the commit's finiteness guard and the NaN injection."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import EXIT_FAILURE, EXIT_FATAL, AnomalyRollbackError, NumericalAnomalyError, exit_rule_for
from resilient_train.runner.training import control_row
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.health.anomaly_policy import (
    HealthGuard, HostSuspicion, check_finite_state, implicated_hosts, pending_rollback, transients_per_host,
)
from resilient_train.runner.health.detector import Anomaly, first_anomaly, logs_nonfinite, step_nonfinite
from resilient_train.runner.health.injection import NanInjection

NAMES = control_row.layout(["loss", "accuracy"])


def row(loss: float, nonfinite: float = 0.0) -> np.ndarray:
    votes = control_row.Votes(nonfinite=nonfinite, next_call=4.0)
    return np.concatenate([np.array([loss, 0.5], np.float32), control_row.encode(votes)])


def test_a_nan_or_inf_in_the_loss_or_any_gradient_is_flagged_and_finite_steps_are_not():
    finite = [tf.constant([1.0, 2.0]), tf.constant([[3.0]])]
    assert float(step_nonfinite(tf.constant(0.5), finite)) == 0.0
    assert float(step_nonfinite(tf.constant(float("nan")), finite)) == 1.0
    assert float(step_nonfinite(tf.constant(0.5), [finite[0], tf.constant([[float("inf")]])])) == 1.0
    assert float(step_nonfinite(tf.constant(0.5), [None, tf.constant([float("nan")])])) == 1.0  # None: no gradient
    assert float(logs_nonfinite({"loss": tf.constant(0.5), "acc": tf.constant(float("nan"))})) == 1.0
    assert float(logs_nonfinite({"loss": tf.constant(0.5)})) == 0.0


def test_the_first_row_with_the_column_set_names_its_global_step_and_batch():
    rows = [row(0.25), row(0.5), row(float("nan"), nonfinite=2.0), row(float("nan"), nonfinite=4.0)]
    anomaly = first_anomaly(rows, NAMES, first_global_step=11, position=lambda: (1, 10))
    assert anomaly == Anomaly(global_step=13, epoch=1, step_in_epoch=12, replicas=2,
                              values={"loss": anomaly.values["loss"], "accuracy": 0.5})
    assert np.isnan(anomaly.values["loss"])
    assert "global step 13 (epoch 1, batch 12 of the epoch)" in anomaly.describe()


def test_a_healthy_call_asks_nothing_of_the_position():
    def position() -> tuple[int, int]:
        raise AssertionError("read only when a row has an anomaly")

    assert first_anomaly([row(0.25), row(0.5)], NAMES, first_global_step=1, position=position) is None


def test_stop_reports_once_and_raises_a_fatal_error_naming_the_step():
    events = []
    guard = HealthGuard("stop", emit=lambda name, **fields: events.append((name, fields)))
    guard.after_call(None, last_global_step=4)
    assert events == []
    anomaly = Anomaly(global_step=5, epoch=0, step_in_epoch=4, replicas=1, values={"loss": float("nan")})
    with pytest.raises(NumericalAnomalyError, match="global step 5 .epoch 0, batch 4 of the epoch.*loss=nan"):
        guard.after_call(anomaly, last_global_step=8, settle=lambda: events.append(("settled", {})))
    assert exit_rule_for(NumericalAnomalyError("x")).code == EXIT_FATAL
    assert events[1] == ("settled", {})  # the earlier save's commit is waited for, then the stop
    assert events[:1] == [("anomaly_detected", {"group": True, "kind": "nonfinite", "global_step": 5, "epoch": 0,
                                            "step_in_epoch": 4, "replicas": 1, "values": {"loss": "nan"},
                                            "action": "stop"})]
    json.dumps(events[0][1], allow_nan=False)  # the event's values are JSON (no NaN literal)
    assert guard.requires_finite_commit


def test_ignore_reports_the_first_anomaly_only_and_trains_on():
    events = []
    guard = HealthGuard("ignore", emit=lambda name, **fields: events.append(fields["global_step"]))
    for step in (5, 6):
        guard.after_call(Anomaly(global_step=step, epoch=0, step_in_epoch=step - 1, replicas=2,
                                 values={"loss": float("inf")}), last_global_step=step)
    assert events == [5]
    assert not guard.requires_finite_commit


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="on_anomaly='rollbak'"):
        HealthGuard("rollbak", emit=lambda *a, **k: None)


def test_the_commit_guard_refuses_a_state_with_a_non_finite_float_and_names_it():
    check_finite_state([("model/w", np.ones(3, np.float32)), ("step", np.int64(7))], global_step=7)
    with pytest.raises(NumericalAnomalyError, match="global step 8 .* in model/b"):
        check_finite_state([("model/w", np.ones(3, np.float32)), ("model/b", np.array([np.nan], np.float32))],
                           global_step=8)


def test_the_injection_poisons_exactly_the_armed_steps_of_this_rank_and_attempt(monkeypatch):
    faults = json.dumps([{"point": "nan_loss", "global_step": 3, "rank": 1},
                         {"point": "nan_loss", "global_step": 5, "rank": 0},
                         {"point": "nan_loss", "global_step": 9, "rank": 1, "attempt": 2}])
    plan = FaultPlan.from_env({"RT_FAULTS": faults}, rank=1, attempt=1)
    injection = NanInjection.from_plan(plan)
    assert injection.steps == (3,)
    counter = tf.Variable(0, dtype=tf.int64)
    seen = []
    for _ in range(4):  # the step being trained is counter + 1
        seen.append(bool(np.isnan(float(injection.poisoned(tf.constant(0.5), counter)))))
        counter.assign_add(1)
    assert seen == [False, False, True, False]
    loss = tf.constant(0.5)
    assert NanInjection.from_plan(FaultPlan([], rank=0, attempt=1)).poisoned(loss, counter) is loss  # nothing added


def test_a_loss_spike_multiplies_its_steps_loss_by_100_or_by_its_factor():
    faults = json.dumps([{"point": "loss_spike", "global_step": 2, "rank": 0, "attempt": "all"},
                         {"point": "loss_spike", "global_step": 4, "rank": 0, "attempt": "all", "factor": 10000}])
    injection = NanInjection.from_plan(FaultPlan.from_env({"RT_FAULTS": faults}, rank=0, attempt=3))
    assert (injection.spike_steps, injection.spike_factors) == ((2, 4), (100.0, 10000.0))
    counter = tf.Variable(0, dtype=tf.int64)
    seen = []
    for _ in range(5):  # the step being trained is counter + 1
        seen.append(float(injection.poisoned(tf.constant(0.5), counter)))
        counter.assign_add(1)
    assert seen == [0.5, 50.0, 0.5, 5000.0, 0.5]


def anomaly_at(step: int, loss: float = float("nan")) -> Anomaly:
    return Anomaly(global_step=step, epoch=0, step_in_epoch=step - 1, replicas=1, values={"loss": loss})


def recorder():
    events = []
    return events, lambda name, **fields: events.append({"event": name, "run_id": "r", **fields})


def test_rollback_leaves_restartably_after_the_earlier_commit_and_the_events_say_what_to_replay():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit)
    settled = []
    with pytest.raises(AnomalyRollbackError, match="global step 6 .*rolling back"):
        guard.after_call(anomaly_at(6), last_global_step=8, settle=lambda: settled.append(True))
    assert settled == [True]
    assert exit_rule_for(AnomalyRollbackError("x")).code == EXIT_FAILURE  # the gang restart is the rollback
    assert pending_rollback(events, run_id="r")["global_step"] == 6
    assert pending_rollback(events, run_id="another run") is None


def test_a_replay_that_passes_the_step_cleanly_is_transient_and_trains_on():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit)
    guard.replay_to(6, restored_step=4, values={"loss": "nan"})
    guard.after_call(None, last_global_step=5)  # not there yet: no verdict
    assert [e["event"] for e in events] == ["rolled_back"]
    guard.after_call(None, last_global_step=8)
    assert events[1] == {"event": "replay_verdict", "run_id": "r", "group": True, "global_step": 6,
                         "verdict": "transient", "values_before": {"loss": "nan"}, "hosts": []}
    assert pending_rollback([{"event": "anomaly_detected", "run_id": "r", "action": "rollback", "global_step": 6},
                             *events], run_id="r") is None  # judged: a later attempt replays nothing
    guard.after_call(None, last_global_step=12)
    assert len(events) == 2


def test_an_anomaly_back_at_the_same_step_is_deterministic_and_stops():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit)
    guard.replay_to(6, restored_step=4, values={"loss": "nan"})
    with pytest.raises(NumericalAnomalyError, match="global step 6 .*came back when replayed") as raised:
        guard.after_call(anomaly_at(6), last_global_step=8)
    assert not isinstance(raised.value, AnomalyRollbackError)  # fatal: no further restart
    assert [(e["event"], e.get("verdict"), e.get("values")) for e in events] == [
        ("rolled_back", None, None), ("replay_verdict", "deterministic", {"loss": "nan"})]


def test_an_anomaly_at_another_step_of_a_replay_is_a_new_one():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit)
    guard.replay_to(6, restored_step=4, values={})
    with pytest.raises(AnomalyRollbackError, match="global step 9"):
        guard.after_call(anomaly_at(9), last_global_step=10)
    assert [(e["event"], e.get("verdict"), e["global_step"]) for e in events] == [
        ("rolled_back", None, 4), ("replay_verdict", "transient", 6), ("anomaly_detected", None, 9)]


def test_no_replay_when_the_anomaly_is_not_after_the_restored_step():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit)
    guard.replay_to(4, restored_step=4, values={})
    guard.after_call(None, last_global_step=8)
    assert events == []


def test_with_skip_a_deterministic_non_finite_step_rolls_back_again_to_replay_without_its_batch():
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit, skip=True)
    guard.replay_to(6, restored_step=4, values={"loss": "nan"})
    with pytest.raises(AnomalyRollbackError, match="global step 6 .*deterministic.*that batch is skipped"):
        guard.after_call(anomaly_at(6), last_global_step=8)
    assert [(e["event"], e.get("verdict"), e.get("action")) for e in events] == [
        ("rolled_back", None, None), ("replay_verdict", "deterministic", "skip")]
    # Replicas that differ again at the same step: no batch explains them, so the run stops.
    guard = HealthGuard("rollback", emit=emit, skip=True)
    guard.replay_to(10, restored_step=8, values={})
    replicas = Anomaly(global_step=10, epoch=0, step_in_epoch=9, replicas=2, values={}, kind="replicas", ranks=(0, 1))
    with pytest.raises(NumericalAnomalyError) as raised:
        guard.after_call(replicas, last_global_step=10)
    assert not isinstance(raised.value, AnomalyRollbackError) and events[-1]["action"] == "stop"
    assert HealthGuard("stop", emit=emit, skip=True).rolls_back is False  # skip only under rollback


def test_the_next_attempt_reads_the_skip_list_from_the_events_and_the_checkpoint_and_saves_it(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [{"event": "anomaly_detected", "run_id": "r", "action": "rollback", "global_step": 6},
             {"event": "replay_verdict", "run_id": "r", "global_step": 6, "verdict": "deterministic", "action": "skip"},
             {"event": "replay_verdict", "run_id": "old", "global_step": 3, "verdict": "deterministic", "action": "skip"},
             {"event": "replay_verdict", "run_id": "r", "global_step": 9, "verdict": "deterministic", "action": "stop"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    events, emit = recorder()
    guard = HealthGuard("rollback", emit=emit, run_id="r", events_path=path, skip=True)
    sent = []
    guard.load_extra({"skipped_steps": [2]})  # the restored checkpoint's
    guard.arm_replay(is_chief=True, restored_step=4, gather=lambda v: sent.append(v) or [v])
    assert sent == [0, 1, 6]  # no pending replay; one skip, then its step
    assert guard.skipped == (2, 6) and guard.skips(6) and not guard.skips(7)
    assert guard.extra() == {"skipped_steps": [2, 6]}
    assert events == []  # nothing replayed
    answers = iter([0, 1, 6])  # a non-chief sends zeros and adopts the chief's answers
    other = HealthGuard("rollback", emit=emit, run_id="r", events_path=path, skip=True)
    other.load_extra({"skipped_steps": [2]})
    other.arm_replay(is_chief=False, restored_step=4, gather=lambda v: [next(answers)])
    assert other.skipped == (2, 6)
    assert HealthGuard("rollback", emit=emit).extra() == {}


def test_an_anomaly_points_at_its_named_ranks_hosts_or_at_the_one_host_of_a_run_that_names_none():
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.2"]
    assert implicated_hosts([1, 2], hosts) == ["10.0.0.2"]
    assert implicated_hosts([0, 2], hosts) == ["10.0.0.1", "10.0.0.2"]
    assert implicated_hosts(None, hosts) == []  # a non-finite step on several hosts: nobody to blame
    assert implicated_hosts([], ["127.0.0.1", "127.0.0.1"]) == ["127.0.0.1"]
    assert implicated_hosts([5], hosts) == []  # a rank this attempt does not have


def test_transients_are_counted_per_host_from_this_runs_verdicts_only():
    records = [{"event": "replay_verdict", "run_id": "r", "verdict": "transient", "hosts": ["a"]},
               {"event": "replay_verdict", "run_id": "r", "verdict": "transient", "hosts": ["a", "b"]},
               {"event": "replay_verdict", "run_id": "r", "verdict": "deterministic", "hosts": ["a"]},
               {"event": "replay_verdict", "run_id": "old", "verdict": "transient", "hosts": ["a"]},
               {"event": "replay_verdict", "run_id": "r", "verdict": "transient"}]  # written before hosts were
    assert transients_per_host(records, run_id="r") == {"a": 2, "b": 1}


def _judged_transient(tmp_path, *, before: int, limit: int | None, ranks: list[int] | None):
    """A chief that replays a rolled-back anomaly naming ``ranks`` (2 ranks on host h1, 1 on h2),
    with ``before`` earlier transients on h1 in events.jsonl, through to a transient verdict."""
    path = tmp_path / "events.jsonl"
    lines = [{"event": "replay_verdict", "run_id": "r", "global_step": 2 * k + 1, "verdict": "transient",
              "hosts": ["h1"]} for k in range(before)]
    lines.append({"event": "anomaly_detected", "run_id": "r", "action": "rollback", "global_step": 10,
                  "values": {}, **({"ranks": ranks} if ranks is not None else {})})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    events, emit = recorder()
    suspected = []
    guard = HealthGuard("rollback", emit=emit, run_id="r", events_path=path, hosts=["h1", "h1", "h2"],
                        max_transients=limit, suspect=lambda host, on: suspected.append((host, on)))
    guard.arm_replay(is_chief=True, restored_step=8, gather=lambda v: [v])
    guard.after_call(None, last_global_step=12)
    return events, suspected


def test_the_transient_that_reaches_the_limit_on_a_host_suspects_it_once(tmp_path):
    events, suspected = _judged_transient(tmp_path, before=1, limit=2, ranks=[0])
    assert [(e["event"], e.get("hosts")) for e in events] == [
        ("rolled_back", None), ("replay_verdict", ["h1"]), ("host_suspected", None)]
    assert {k: events[2][k] for k in ("host", "ranks", "transients", "limit", "group")} == {
        "host": "h1", "ranks": [0, 1], "transients": 2, "limit": 2, "group": True}
    assert suspected == [("h1", [0, 1])]


def test_below_the_limit_without_a_limit_or_on_another_host_nothing_is_suspected(tmp_path):
    for before, limit, ranks in ((0, 2, [1]), (5, None, [0]), (1, 2, [2]), (1, 2, None)):
        events, suspected = _judged_transient(tmp_path, before=before, limit=limit, ranks=ranks)
        assert suspected == [] and "host_suspected" not in [e["event"] for e in events], (before, limit, ranks)
    events, _ = _judged_transient(tmp_path, before=0, limit=2, ranks=None)  # NaN on two hosts: unattributed
    assert events[1]["hosts"] == []


def test_a_suspected_host_gets_a_notice_marker_per_rank_and_the_chief_asks_to_stop(tmp_path):
    attempt_dir = tmp_path / "attempt-3"
    attempt_dir.mkdir()
    suspicion = HostSuspicion(attempt_dir)
    assert not suspicion.stop_requested() and suspicion.source() is None
    suspicion("10.0.0.7", [2, 3])
    assert suspicion.stop_requested() and suspicion.source() == "notice:suspect-hardware"
    assert [(p.name, json.loads(p.read_text())) for p in sorted(attempt_dir.glob("notice-*.json"))] == [
        (f"notice-{rank}.json", {"provider": "suspect-hardware", "kind": "transient-anomalies", "host": "10.0.0.7"})
        for rank in (2, 3)]


def test_the_host_limit_takes_n_or_off_and_refuses_anything_else():
    from resilient_train.job.config import ConfigError, JobConfig

    assert JobConfig(recipe="r.py").max_transients_per_host == 3
    assert JobConfig(recipe="r.py", max_transients_per_host="off").max_transients_per_host == "off"
    for bad in (0, -1, True, "2"):
        with pytest.raises(ConfigError, match=rf"^Received max_transients_per_host={bad!r}; expected an integer >= 1 "
                                              r"or 'off'$"):
            JobConfig(recipe="r.py", max_transients_per_host=bad)


def test_the_console_names_the_suspected_host_and_a_transient_verdicts_hosts():
    from resilient_train.supervisor.console import _host_suspected, _preemption_requested, _replay_verdict

    assert _replay_verdict({"verdict": "transient", "global_step": 10, "hosts": ["127.0.0.1"]}, None) == (
        "replayed step 10 without the anomaly: it was transient on 127.0.0.1 (not the data or the model); "
        "training goes on")
    assert _host_suspected({"host": "h1", "transients": 2, "limit": 2, "ranks": [0, 1]}, None).startswith(
        "host h1 had 2 transient anomalies (--max-transients-per-host 2): suspected faulty hardware")
    assert _preemption_requested({"source": "notice:suspect-hardware"}, None) == (
        "this host is suspected of faulty hardware (repeated transient anomalies; resume the run on other "
        "hardware): the workers save at one agreed step, then stop")
