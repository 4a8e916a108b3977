"""--straggler-policy replace (runner/health/stragglers.py decide_replace, pure; and the chief's
side, runner/health/straggler_replace.py): when a named straggler is replaced, with what numbers,
and what acting writes. A real throttled rank replaced end to end: tests/chaos/test_ci_scenarios.py."""

from __future__ import annotations

import json

import pytest

from resilient_train.rundir.layout import RunDir
from resilient_train.runner.health.straggler_replace import StragglerReplacement
from resilient_train.runner.health.stragglers import (
    RESTART_COST_ESTIMATE_S, ReplaceDecision, Straggler, decide_replace,
)


def _straggler(time_lost_s: float = 30.0, rank: int = 1, steps_left: int = 3000) -> Straggler:
    return Straggler(rank=rank, host=f"h{rank}", global_step=700, slower=1.8, evidence="stalled", stalled=0.46,
                     others_stalled=0.03, busy_ms_per_step=11.0, others_ms_per_step=6.0, window_s=6.0,
                     steps_per_s=90.9, steps_per_s_without=166.7, steps_per_s_lost=75.8, steps_left=steps_left,
                     time_lost_s=time_lost_s)


def test_replace_when_the_gain_to_the_end_exceeds_the_estimated_restart():
    decision = decide_replace(_straggler(30.0), policy="replace", restart_costs=[], cooldown_s=600,
                              since_acted_s=None)
    assert decision == ReplaceDecision(
        action="replace", reason="its cost to the end of the run (30 s) exceeds a restart's (10 s, estimated)",
        gain_s=30.0, restart_cost_s=RESTART_COST_ESTIMATE_S, restart_cost_from="estimate", steps_left=3000)
    assert RESTART_COST_ESTIMATE_S == 10.0


def test_the_runs_measured_restarts_win_over_the_estimate_their_median():
    decision = decide_replace(_straggler(30.0), policy="replace", restart_costs=[3.0, 45.0, 31.0], cooldown_s=600,
                              since_acted_s=None)
    assert (decision.action, decision.restart_cost_s, decision.restart_cost_from) == ("warn", 31.0, "measured")
    assert decision.reason == "its cost to the end of the run (30 s) does not exceed a restart's (31 s, measured in this run)"
    cheap = decide_replace(_straggler(30.0), policy="replace", restart_costs=[2.46], cooldown_s=600, since_acted_s=None)
    assert (cheap.action, cheap.restart_cost_s, cheap.restart_cost_from) == ("replace", 2.5, "measured")


def test_a_gain_equal_to_the_cost_is_not_worth_a_restart():
    assert decide_replace(_straggler(10.0), policy="replace", restart_costs=[], cooldown_s=600,
                          since_acted_s=None).action == "warn"


def test_warn_says_the_numbers_and_why_it_did_not_act():
    decision = decide_replace(_straggler(30.0), policy="warn", restart_costs=[], cooldown_s=600, since_acted_s=None)
    assert (decision.action, decision.reason, decision.gain_s, decision.restart_cost_s) == (
        "warn", "--straggler-policy warn", 30.0, 10.0)


def test_a_rank_replaced_less_than_the_cooldown_ago_is_not_replaced_again():
    kwargs = dict(policy="replace", restart_costs=[], cooldown_s=600)
    recent = decide_replace(_straggler(500.0), since_acted_s=599.0, **kwargs)
    assert (recent.action, recent.reason) == ("warn", "rank 1 was replaced 599 s ago (--straggler-cooldown 600 s)")
    assert decide_replace(_straggler(500.0), since_acted_s=600.0, **kwargs).action == "replace"
    assert decide_replace(_straggler(500.0), since_acted_s=0.0, **dict(kwargs, cooldown_s=0)).action == "replace"


def test_one_rank_at_a_time():
    decision = decide_replace(_straggler(500.0, rank=2), policy="replace", restart_costs=[], cooldown_s=600,
                              since_acted_s=None, busy_with=1)
    assert (decision.action, decision.reason) == ("warn", "the group is already restarting to replace rank 1")


def _ts(second: float) -> str:
    return f"2026-01-01T00:{int(second // 60):02d}:{second % 60:06.3f}+00:00"


def _epoch(second: float) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(_ts(second)).timestamp()


def _events(path, records) -> None:
    path.write_text("".join(json.dumps({"run_id": "r", **r}) + "\n" for r in records))


def test_the_chief_replaces_writes_the_rank_marker_and_asks_for_its_stop(tmp_path):
    run = RunDir(tmp_path)
    attempt = run.attempt(1)
    attempt.path.mkdir(parents=True)
    _events(run.events, [{"event": "run_started", "ts": _ts(0), "role": "supervisor"}])
    chief = StragglerReplacement("replace", 600.0, attempt_dir=attempt.path, events=run.events, run_id="r",
                                 wall_clock=lambda: _epoch(30))
    assert (chief.stop_requested(), chief.source()) == (False, None)
    straggler = _straggler(30.0)
    decision = chief.decide(straggler)
    assert (decision.action, decision.restart_cost_from) == ("replace", "estimate")  # no restart in the run yet
    chief.replace(straggler, decision)
    assert (chief.stop_requested(), chief.source()) == (True, "straggler:1")
    assert json.loads(attempt.notice(1).read_text()) == {
        "provider": "straggler", "kind": "replace", "host": "h1", "rank": 1, "global_step": 700, "gain_s": 30.0,
        "restart_cost_s": 10.0}
    assert chief.decide(_straggler(30.0, rank=0)).reason == "the group is already restarting to replace rank 1"


def test_the_chief_reads_the_runs_restarts_and_the_ranks_last_replacement(tmp_path):
    run = RunDir(tmp_path)
    sup, chief = {"role": "supervisor"}, {"rank": 0, "role": "chief"}
    _events(run.events, [
        {"event": "run_started", "ts": _ts(0), **sup},
        {"event": "run_state", "from": "preparing", "to": "starting", "attempt": 1, "ts": _ts(0), **sup},
        {"event": "first_step", "global_step": 1, "attempt": 1, "ts": _ts(2), **chief},
        {"event": "straggler_detected", **chief, "rank": 1, "action": "replace", "attempt": 1, "ts": _ts(8)},
        {"event": "preemption_requested", "source": "straggler:1", "attempt": 1, "ts": _ts(9), **chief},
        {"event": "run_state", "from": "restarting", "to": "starting", "attempt": 2, "ts": _ts(11), **sup},
        {"event": "first_step", "global_step": 91, "attempt": 2, "ts": _ts(14), **chief},
        {"event": "straggler_detected", "rank": 1, "action": "replace", "attempt": 9, "ts": _ts(20), "run_id": "x"},
    ])
    replacement = StragglerReplacement("replace", 600.0, attempt_dir=tmp_path, events=run.events, run_id="r",
                                       wall_clock=lambda: _epoch(68))
    again = replacement.decide(_straggler(500.0))
    assert (again.action, again.reason) == ("warn", "rank 1 was replaced 60 s ago (--straggler-cooldown 600 s)")
    assert (again.restart_cost_s, again.restart_cost_from) == (5.0, "measured")  # 9 -> 11 -> 14 s
    other = replacement.decide(_straggler(500.0, rank=0))  # another rank: no cooldown
    assert (other.action, other.restart_cost_s) == ("replace", 5.0)


def test_without_an_attempt_directory_there_is_no_supervisor_to_restart_the_group(tmp_path):
    replacement = StragglerReplacement("replace", 600.0, attempt_dir=None, events=None, run_id="r")
    decision = replacement.decide(_straggler(30.0))
    assert (decision.action, decision.reason) == ("warn", "no supervisor to restart the group (no attempt directory)")


@pytest.mark.parametrize("policy", ["warn", "replace"])
def test_progress_emits_the_decision_and_acts_only_on_replace(policy, tmp_path, monkeypatch):
    from resilient_train.runner.training import progress as progress_module
    from resilient_train.runner.training.progress import Progress

    emitted = []
    monkeypatch.setattr(progress_module, "emit", lambda event, **fields: emitted.append((event, fields)))

    class OneStraggler:
        latest_ms = latest_stalled = None

        def observed(self, *args, **kwargs):
            return [_straggler(30.0)]

    run = RunDir(tmp_path)
    run.attempt(1).path.mkdir(parents=True)
    replacement = StragglerReplacement(policy, 600.0, attempt_dir=run.attempt(1).path, events=run.events,
                                       run_id="r")
    progress = Progress(1e9, 4000, 1, lambda: 0.0, OneStraggler(), replacement)
    progress.first_pending = False
    progress.advanced(10, epoch=0, step_in_epoch=700, global_step=700, means={}, steps_per_call=10)
    [(event, fields)] = emitted
    assert (event, fields["rank"], fields["action"], fields["gain_s"], fields["restart_cost_s"]) == (
        "straggler_detected", 1, policy, 30.0, 10.0)
    assert replacement.stop_requested() == (policy == "replace")
    assert run.attempt(1).notice(1).exists() == (policy == "replace")
