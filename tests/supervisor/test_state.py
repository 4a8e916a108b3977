"""The run state machine: every row of the table is accepted, everything else raises."""

from __future__ import annotations

import itertools

import pytest

from resilient_train.supervisor.state import (
    EVENT_RUN_STATE,
    TRANSITIONS,
    RunState,
    RunStateMachine,
)

LEGAL = {
    (RunState.PREPARING, RunState.STARTING),
    (RunState.PREPARING, RunState.SUCCEEDED),
    (RunState.STARTING, RunState.RUNNING),
    (RunState.STARTING, RunState.FAILED),
    (RunState.RUNNING, RunState.SUCCEEDED),
    (RunState.RUNNING, RunState.STOPPING),
    (RunState.RUNNING, RunState.HUNG),
    (RunState.HUNG, RunState.STOPPING),
    (RunState.RUNNING, RunState.RESIZING),
    (RunState.RESIZING, RunState.STOPPING),
    (RunState.STOPPING, RunState.SUCCEEDED),
    (RunState.STOPPING, RunState.RESTARTING),
    (RunState.STOPPING, RunState.FAILED),
    (RunState.STOPPING, RunState.PREEMPTED),
    (RunState.RESTARTING, RunState.STARTING),
}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __call__(self, event: str, **fields) -> None:
        self.events.append((event, fields))


def test_the_table_is_exactly_the_documented_transitions():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
    assert set(TRANSITIONS) == set(RunState)


def test_values_are_the_stable_event_names():
    assert [s.value for s in RunState] == [
        "preparing", "starting", "running", "hung", "resizing", "stopping", "restarting", "succeeded", "failed", "preempted",
    ]


def test_terminal_states_are_those_nothing_leaves():
    assert {s for s in RunState if s.is_terminal} == {RunState.SUCCEEDED, RunState.FAILED, RunState.PREEMPTED}


@pytest.mark.parametrize(("source", "target"), sorted(LEGAL), ids=lambda s: s.value)
def test_every_legal_transition_is_accepted_and_announced_once(source, target):
    emit = Recorder()
    machine = RunStateMachine(emit, state=source)
    assert machine.transition(target, attempt=3, reason="why") is source
    assert machine.state is target and machine.is_terminal is target.is_terminal
    assert emit.events == [(EVENT_RUN_STATE, {"from": source.value, "to": target.value, "attempt": 3, "reason": "why"})]


@pytest.mark.parametrize(
    ("source", "target"),
    sorted(set(itertools.product(RunState, RunState)) - LEGAL),
    ids=lambda s: s.value,
)
def test_every_other_transition_raises_and_changes_nothing(source, target):
    emit = Recorder()
    machine = RunStateMachine(emit, state=source)
    with pytest.raises(RuntimeError) as raised:
        machine.transition(target, attempt=1)
    assert str(raised.value) == f"Illegal run state transition {source.value} -> {target.value}"
    assert machine.state is source and emit.events == []


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        (RunState.RUNNING, RunState.RESTARTING, "Illegal run state transition running -> restarting"),
        (RunState.SUCCEEDED, RunState.STARTING, "Illegal run state transition succeeded -> starting"),
        (RunState.PREPARING, RunState.RUNNING, "Illegal run state transition preparing -> running"),
        (RunState.FAILED, RunState.FAILED, "Illegal run state transition failed -> failed"),
    ],
)
def test_illegal_transitions_name_both_states(source, target, message):
    with pytest.raises(RuntimeError, match=f"^{message}$"):
        RunStateMachine(Recorder(), state=source).transition(target, attempt=1)


def test_a_fresh_machine_prepares_and_a_transition_without_reason_has_no_reason_field():
    emit = Recorder()
    machine = RunStateMachine(emit)
    assert machine.state is RunState.PREPARING and not machine.is_terminal
    machine.transition(RunState.STARTING, attempt=1)
    machine.transition(RunState.RUNNING, attempt=1)
    assert emit.events == [
        ("run_state", {"from": "preparing", "to": "starting", "attempt": 1}),
        ("run_state", {"from": "starting", "to": "running", "attempt": 1}),
    ]


def test_a_transition_carries_its_payload_to_the_next_without_announcing_it():
    emit = Recorder()
    machine = RunStateMachine(emit, state=RunState.RUNNING)
    stall = object()
    machine.transition(RunState.HUNG, attempt=1, reason="no progress", carrying=stall)
    assert machine.carried is stall
    assert emit.events == [(EVENT_RUN_STATE, {"from": "running", "to": "hung", "attempt": 1, "reason": "no progress"})]
    machine.transition(RunState.STOPPING, attempt=1)
    assert machine.carried is None


def test_each_state_is_entered_carrying_its_one_payload_type():
    import dataclasses

    from resilient_train.supervisor.attempt import CARRIED_BY, Failed, Resize, Start, Stop, StopCause, expect_carried

    assert {state.value: kind.__name__ for state, kind in CARRIED_BY.items()} == {
        "starting": "Start", "hung": "Stall", "resizing": "Resize", "stopping": "Stop", "restarting": "Restart",
        "failed": "Failed"}
    expect_carried(RunState.STARTING, Start(2, Resize(3, "capacity fell")))
    expect_carried(RunState.RUNNING, None)
    with pytest.raises(RuntimeError, match="stopping is entered carrying a Stop, not None"):
        expect_carried(RunState.STOPPING, None)
    with pytest.raises(RuntimeError, match="failed is entered carrying a Failed"):
        expect_carried(RunState.FAILED, Start(1))
    hang = Stop(StopCause.HANG, "hang: rank 1 made no progress for 30 s", hang={"rank": 1})
    assert (hang.cause, hang.hang, hang.resize, hang.rescue_answer) == (StopCause.HANG, {"rank": 1}, None, None)
    with pytest.raises(ValueError, match="Received cause=failure with hang="):
        Stop(StopCause.FAILURE, "worker 1 exited abnormally", hang={"rank": 1})
    with pytest.raises(ValueError, match="Received cause=resize with resize=None"):
        Stop(StopCause.RESIZE, "resize")
    assert dataclasses.replace(hang, rescue_answer={"event": "rescue_committed"}).rescue_answer == {
        "event": "rescue_committed"}
    assert Failed().fatal is False
