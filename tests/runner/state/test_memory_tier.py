"""The memory tier's pure parts: the snapshot schedule, why a rescue commits nothing, the
Rescuer's decisions, and the twin's hand-over between a snapshot and a rescue."""

import threading
from contextlib import contextmanager

import pytest

from resilient_train.runner.state.checkpointing import AsyncCheckpointer, SaveRequest
from resilient_train.runner.state.memory_tier import (
    AutoInterval,
    Rescuer,
    RescueUnavailable,
    Snapshot,
    SnapshotSchedule,
    rescue_skip_reason,
)


def test_the_schedule_ends_calls_at_every_snapshot_step_and_restarts_at_saves():
    schedule = SnapshotSchedule(5)
    assert schedule.call_length(global_step=0, max_steps=100) == 5
    assert schedule.call_length(global_step=3, max_steps=100) == 2
    assert schedule.call_length(global_step=3, max_steps=1) == 1
    assert (schedule.due(4), schedule.due(5)) == (False, True)
    schedule.taken(5)
    assert (schedule.due(9), schedule.due(10)) == (False, True)
    schedule.taken(7)  # a save at 7 (an epoch end) is a snapshot too
    assert schedule.call_length(global_step=7, max_steps=100) == 5
    assert (schedule.due(11), schedule.due(12)) == (False, True)
    assert SnapshotSchedule(3, start_step=40).call_length(global_step=40, max_steps=8) == 3


def test_auto_snapshots_after_every_call_until_the_agreed_interval_is_decided():
    schedule = SnapshotSchedule(None, start_step=10)
    assert schedule.pending and schedule.call_length(global_step=10, max_steps=64) == 64
    assert (schedule.due(10), schedule.due(11)) == (False, True)
    schedule.taken(11)
    schedule.decide(40)
    assert not schedule.pending
    # auto's interval does not cut calls: the snapshot waits for the end of the call that reaches it
    assert schedule.call_length(global_step=11, max_steps=64) == 64
    assert (schedule.due(50), schedule.due(51), schedule.due(75)) == (False, True, True)
    with pytest.raises(ValueError, match="Received every_steps=0"):
        schedule.decide(0)


def test_auto_proposes_the_interval_that_keeps_snapshots_within_the_budget():
    auto = AutoInterval()
    assert auto.proposal(step_s=0.002, call_steps=8) == 0  # nothing timed yet
    for seconds in (0.5, 0.004, 0.005):  # the first (tracing) is not counted; the slowest of the rest is
        assert auto.proposal(step_s=0.002, call_steps=8) == 0
        auto.snapshot_took(seconds)
    assert auto.proposal(step_s=None, call_steps=8) == 0  # no step time measured yet
    # 5 ms / (2% of 2 ms) = 125 steps, rounded up to whole calls of 8: 128
    assert auto.proposal(step_s=0.002, call_steps=8) == 128
    assert auto.chosen == {"every_steps": 128, "capture_every_steps": 128, "snapshot_ms": 5.0, "capture_ms": 0.0,
                           "step_ms": 2.0, "budget": 0.02, "capture_budget": 0.02, "call_steps": 8,
                           "limited_by": "budget"}
    assert auto.capture_every == 128
    assert auto.proposal(step_s=1.0, call_steps=1) == 128  # decided: proposal() keeps the decision


def test_auto_revises_the_interval_once_the_step_time_stays_off_for_long_enough():
    """The first steps ran beside the warm standbys' start-up: 155 ms a step, 4 ms later."""
    auto = AutoInterval()
    for seconds, capture_s in ((0.5, 0.4), (0.1, 0.095), (0.1, 0.095)):
        auto.snapshot_took(seconds, capture_s=capture_s)
    # 5 ms / (1.5% of 155 ms) = 2.2 -> 3; 95 ms / (2% of 155 ms) = 30.6 -> 31, a multiple of 3: 33
    assert auto.proposal(step_s=0.155, call_steps=1) == 3
    assert auto.capture_every == 33
    for seconds, capture_s in ((0.0027, 0.0), (0.0026, 0.0), (0.073, 0.07)):  # later snapshots (one captured)
        auto.snapshot_took(seconds, capture_s=capture_s)
    assert [auto.revision(step_s=0.2, call_steps=1) for _ in range(30)] == [0] * 30  # 1.29x: within 1.5x
    # 4 ms a step: off by 39x, but only the 20th call in a row revises, from the newest snapshots:
    # the slowest rest 3 ms (73 - 70) / (1.5% of 4 ms) = 50 -> 72 (whole calls of 24);
    # the capture 70 ms / (2% of 4 ms) = 875 -> 936 (a multiple of 72)
    assert [auto.revision(step_s=0.004, call_steps=24) for _ in range(20)] == [0] * 19 + [72]
    assert auto.chosen == {"every_steps": 72, "capture_every_steps": 936, "snapshot_ms": 73.0, "capture_ms": 70.0,
                           "step_ms": 4.0, "budget": 0.02, "capture_budget": 0.02, "call_steps": 24,
                           "limited_by": "budget"}
    assert auto.capture_every == 936
    # a slow moment (one call off, then back) changes nothing
    assert [auto.revision(step_s=s, call_steps=24) for s in (0.04, 0.004, 0.0041)] == [0, 0, 0]
    assert auto.chosen["every_steps"] == 72


def test_auto_captures_the_input_less_often_within_its_own_budget():
    """digits_cnn's shape: the iterator state is the dear part of a snapshot (and of a save,
    which captures on the same interval: runner/state/saving.py _save_captures)."""
    auto = AutoInterval()
    for seconds, capture_s in ((0.3, 0.2), (0.062, 0.06), (0.0635, 0.0615)):
        auto.snapshot_took(seconds, capture_s=capture_s)
    assert auto.capture_every == 0  # not proposed yet
    # the rest: 2 ms / (75% of 2% of 10 ms) = 13.3 -> 14 steps; the capture:
    # 61.5 ms / (2% of 10 ms) = 307.5 -> 308 steps, a multiple of 14: 308
    assert auto.proposal(step_s=0.01, call_steps=7) == 14
    assert auto.capture_every == 308
    # a budget of its own, not a share of the snapshots' (a restore replays at most this many batches)
    assert AutoInterval(capture_budget=0.005)._choose(rest_s=0.002, capture_s=0.0615, step_s=0.01,
                                                      call_steps=7)["capture_every_steps"] == 1232
    with pytest.raises(ValueError, match=r"Received capture_budget=0; expected a fraction in \(0, 1\)"):
        AutoInterval(capture_budget=0)
    assert (auto.chosen["snapshot_ms"], auto.chosen["capture_ms"]) == (63.5, 61.5)


def test_schedule_captures_at_its_own_interval():
    schedule = SnapshotSchedule(None)
    assert schedule.capture_due(5)  # undecided: every snapshot captures
    schedule.decide(10, 30)
    assert schedule.capture_due(10)  # nothing captured yet
    schedule.captured(10)
    assert (schedule.capture_due(39), schedule.capture_due(40)) == (False, True)
    schedule.decide(10, 4)  # under the snapshot interval: at every snapshot
    assert schedule.capture_every == 10
    explicit = SnapshotSchedule(6)
    explicit.captured(6)
    assert (explicit.capture_due(11), explicit.capture_due(12)) == (False, True)


def test_auto_never_snapshots_more_often_than_once_per_call():
    auto = AutoInterval()
    for seconds in (0.1, 0.001, 0.001):
        auto.snapshot_took(seconds)
    # 1 ms / (2% of 1 s) rounds up to 1 step, but a call is 50 steps
    assert auto.proposal(step_s=1.0, call_steps=50) == 50
    assert auto.chosen["limited_by"] == "call"


@pytest.mark.parametrize("settings, message", [
    ({"budget": 0}, "Received budget=0; expected a fraction in (0, 1)"),
    ({"probes": 1}, "Received probes=1; expected >= 2"),
])
def test_auto_refuses_a_bad_budget_or_probe_count(settings, message):
    with pytest.raises(ValueError) as raised:
        AutoInterval(**settings)
    assert message in str(raised.value)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "5"])
def test_the_schedule_refuses_a_bad_interval(bad):
    with pytest.raises(ValueError, match=f"Received every_steps={bad!r}"):
        SnapshotSchedule(bad)


def test_why_a_rescue_commits_nothing():
    assert rescue_skip_reason(None, None) == "no snapshot yet"
    assert rescue_skip_reason(None, 10) == "no snapshot yet"
    assert rescue_skip_reason(10, 10) == "snapshot of step 10 is not newer than the last commit (step 10)"
    assert rescue_skip_reason(8, 10) == "snapshot of step 8 is not newer than the last commit (step 10)"
    assert rescue_skip_reason(13, 10) is None
    assert rescue_skip_reason(13, None) is None
    assert rescue_skip_reason(13, 10, incomplete=True).startswith("snapshot incomplete")


class FakeSaver:
    def __init__(self, snapshot, busy=None):
        self.snapshot, self.busy, self.held = snapshot, busy, 0

    @contextmanager
    def rescue_hold(self, timeout_s):
        self.held += 1
        yield self.snapshot, self.busy


def rescuer_for(saver, *, committed=None, commit=None, unable=None):
    events, commits = [], []

    def default_commit(request):
        commits.append(request)

    rescuer = Rescuer(saver, rank=1, commit=commit or default_commit, last_committed=lambda: committed,
                      deadline_s=5.0, unable=lambda: unable, emit=lambda name, **fields: events.append((name, fields)),
                      clock=iter([100.0, 100.25]).__next__, wall_clock=lambda: 50.5)
    return rescuer, events, commits


def test_the_rescuer_commits_a_newer_snapshot_marked_as_a_rescue():
    request = SaveRequest(global_step=16, epoch=1, step_in_epoch=6, extra={"completed": False}, blocked_ms=1.0)
    rescuer, events, commits = rescuer_for(FakeSaver(Snapshot(request, completed_at=50.0)), committed=10)
    rescuer.rescue()
    assert [(c.global_step, c.extra, c.blocked_ms) for c in commits] == [
        (16, {"completed": False, "rescue": {"rank": 1, "snapshot_age_s": 0.5}}, None)]
    assert events == [("rescue_committed", {"global_step": 16, "rank": 1, "snapshot_age_s": 0.5, "seconds": 0.25})]


def test_the_rescuer_skips_with_the_reason():
    request = SaveRequest(global_step=10, epoch=1, step_in_epoch=0)
    for saver, committed, reason, drained in [
        (FakeSaver(None), None, "no snapshot yet", True),
        (FakeSaver(Snapshot(request, 1.0)), 10, "snapshot of step 10 is not newer than the last commit (step 10)", True),
        (FakeSaver(None, busy="snapshot incomplete: x"), None, "snapshot incomplete: x", False),  # still in flight
    ]:
        rescuer, events, commits = rescuer_for(saver, committed=committed)
        rescuer.rescue()
        assert (events, commits) == ([("rescue_skipped", {"rank": 1, "reason": reason, "drained": drained})], [])


def test_a_worker_that_can_never_rescue_says_why_and_does_not_touch_the_twin():
    request = SaveRequest(global_step=16, epoch=1, step_in_epoch=6)
    saver = FakeSaver(Snapshot(request, 1.0))
    reason = "the state of chief-only callbacks (CSVLogger) lives on the chief"
    rescuer, events, commits = rescuer_for(saver, committed=10, unable=reason)
    rescuer.rescue()
    assert (events, commits, saver.held) == ([("rescue_skipped", {"rank": 1, "reason": reason, "drained": False})], [], 0)


def test_a_failed_rescue_commit_is_named():
    def fail(request):
        raise OSError("disk full")

    request = SaveRequest(global_step=16, epoch=1, step_in_epoch=6)
    rescuer, events, _ = rescuer_for(FakeSaver(Snapshot(request, 1.0)), commit=fail)
    rescuer.rescue()
    assert events == [("rescue_skipped", {"rank": 1, "reason": "commit failed: OSError: disk full", "drained": True,
                                          "global_step": 16})]


def test_a_commit_that_cannot_be_made_here_is_skipped_with_its_own_reason():
    def unavailable(request):
        raise RescueUnavailable("the chief-only callbacks' state at step 10 was never committed (newest commit: none)")

    request = SaveRequest(global_step=16, epoch=1, step_in_epoch=6)
    rescuer, events, _ = rescuer_for(FakeSaver(Snapshot(request, 1.0)), commit=unavailable)
    rescuer.rescue()
    assert events == [("rescue_skipped", {
        "rank": 1, "reason": "the chief-only callbacks' state at step 10 was never committed (newest commit: none)",
        "drained": True, "global_step": 16})]


class FakeTwin:
    def __init__(self):
        self.snapshots = 0
        self.fail = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.block = False

    def snapshot(self):
        self.entered.set()
        if self.block:
            self.release.wait(5)
        if self.fail:
            raise RuntimeError("collective aborted")
        self.snapshots += 1


def test_a_snapshot_is_complete_only_after_it_returned():
    twin = FakeTwin()
    saver = AsyncCheckpointer(twin, persist=lambda request: None, emit=lambda *a, **k: None, wall_clock=lambda: 7.0)
    with saver.rescue_hold(0.1) as (snapshot, busy):
        assert (snapshot, busy) == (None, None)
    saver.save(SaveRequest(global_step=3, epoch=0, step_in_epoch=3), persist=False)
    with saver.rescue_hold(0.1) as (snapshot, busy):
        assert (snapshot.request.global_step, snapshot.completed_at, busy) == (3, 7.0, None)
    twin.fail = True
    with pytest.raises(RuntimeError):
        saver.save(SaveRequest(global_step=6, epoch=0, step_in_epoch=6), persist=False)
    with saver.rescue_hold(0.1) as (snapshot, busy):
        assert snapshot is None and busy.startswith("snapshot incomplete")


def test_a_rescue_waits_for_a_snapshot_in_progress_and_no_snapshot_starts_while_it_holds_the_twin():
    twin = FakeTwin()
    twin.block = True
    saver = AsyncCheckpointer(twin, persist=lambda request: None, emit=lambda *a, **k: None, wall_clock=lambda: 7.0)
    taking = threading.Thread(target=saver.save, args=(SaveRequest(global_step=3, epoch=0, step_in_epoch=3),),
                              kwargs={"persist": False})
    taking.start()
    assert twin.entered.wait(5)
    with saver.rescue_hold(0.05) as (snapshot, busy):  # still blocked (a dead collective): never used
        assert snapshot is None and busy.startswith("snapshot incomplete")
    twin.release.set()
    taking.join(5)
    with saver.rescue_hold(5) as (snapshot, busy):
        assert (snapshot.request.global_step, busy) == (3, None)
        twin.block = False
        later = threading.Thread(target=saver.save, args=(SaveRequest(global_step=6, epoch=0, step_in_epoch=6),),
                                 kwargs={"persist": False})
        twin.entered.clear()
        later.start()
        assert not twin.entered.wait(0.2)  # held: the twin is not written under the rescue
    later.join(5)
    assert twin.snapshots == 2 and saver.latest.request.global_step == 6
