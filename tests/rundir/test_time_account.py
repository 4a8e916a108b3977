"""Where the time went (rundir/time_account.py), from synthetic events: exact seconds per
category (to the microsecond: ts has milliseconds, epoch seconds are floats), and the categories add up to the wall time (tests/integration/test_run_page.py
checks a real killed run's summary.json)."""

from __future__ import annotations

import pytest

from resilient_train.rundir.time_account import CATEGORIES, account_time, last_invocation, restart_costs


def _ts(second: float) -> str:
    return f"2026-01-01T00:{int(second // 60):02d}:{second % 60:06.3f}+00:00"


class _Log(list):
    def add(self, t: float, event: str, **fields) -> None:
        self.append({"event": event, "ts": _ts(t), "run_id": "r", **fields})


def _killed_then_completed() -> _Log:
    """Two workers. Attempt 1 trains from 10 s at 10 steps/s, saves, ends an epoch, and loses
    rank 1 at 32 s after step 215 (its last commit: step 100); attempt 2 restores step 100,
    names rank 1 a straggler, and completes at 55 s."""
    e = _Log()
    sup, chief = {"role": "supervisor"}, {"rank": 0, "role": "chief"}
    e.add(0, "storage_claimed", storage="/s", **sup)
    e.add(0, "run_started", workers=2, **sup)
    e.add(0.5, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, **sup)
    for rank in (0, 1):
        e.add(0.6, "worker_started", rank=rank, pid=100 + rank, attempt=1, role="supervisor")
    e.add(0.7, "run_state", **{"from": "starting", "to": "running"}, attempt=1, **sup)
    e.add(8, "fresh_start", global_step=0, attempt=1, **chief)
    e.add(10, "first_step", global_step=1, attempt=1, **chief)
    e.add(10, "startup_phases", global_step=1, start="created", total_s=8.0, attempt=1, **chief,
          phases={"imports": 2, "bootstrap": 1, "strategy": 2, "fetch": 0.5, "restore": 0.5, "trace": 1.5,
                  "first_call": 0.5})
    e.add(10.01, "startup_phases", global_step=1, start="created", total_s=9.0, attempt=1, rank=1, role="worker",
          phases={"imports": 9})  # another rank's: the chief's phases split the start-up
    e.add(10, "train_progress", global_step=1, steps_per_s=0.1, attempt=1, **chief)
    e.add(15, "checkpoint_committed", global_step=50, step_in_epoch=50, epoch=0, blocked_ms=200, commit_s=0.9,
          attempt=1, **chief)
    e.add(18, "checkpoint_waited", global_step=100, in_flight_step=50, waited_ms=300, attempt=1, **chief)
    e.add(19, "checkpoint_committed", global_step=100, step_in_epoch=0, epoch=1, blocked_ms=100, commit_s=0.5,
          attempt=1, **chief)
    e.add(19.5, "epoch_finished", epoch=0, global_step=100, loss=1.0, seconds=2.0, eval_s=0.8, attempt=1, **chief)
    e.add(20, "train_progress", global_step=101, steps_per_s=10, attempt=1, **chief)
    e.add(30, "train_progress", global_step=201, steps_per_s=10, attempt=1, **chief)
    e.add(32, "worker_exited", rank=1, pid=101, attempt=1, signal="SIGKILL", state="exited", **sup)
    e.add(32.1, "run_state", **{"from": "running", "to": "stopping"}, attempt=1, reason="worker 1 exited abnormally",
          **sup)
    e.add(33, "worker_exited", rank=0, pid=100, attempt=1, signal="SIGKILL", state="killed", **sup)
    e.add(33, "attempt_reached", attempt=1, global_step=215, **sup)
    e.add(33, "run_state", **{"from": "stopping", "to": "restarting"}, attempt=1, reason="restart 1 of 3", **sup)
    e.add(33, "gang_restart", attempt=2, reason="restart 1 of 3", root_cause_rank=1, backoff_s=0.0, **sup)
    e.add(34, "run_state", **{"from": "restarting", "to": "starting"}, attempt=2, **sup)
    for rank in (0, 1):
        e.add(34.1, "worker_started", rank=rank, pid=200 + rank, attempt=2, standby=True, role="supervisor")
    e.add(37, "restored", global_step=100, epoch=1, step_in_epoch=0, attempt=2, **chief)
    e.add(40, "first_step", global_step=101, attempt=2, **chief)
    e.add(40, "startup_phases", global_step=101, start="assigned", total_s=6.0, attempt=2, **chief,
          phases={"handover": 0.5, "bootstrap": 0.5, "fetch": 1, "restore": 1, "trace": 2, "first_call": 1})
    e.add(40, "train_progress", global_step=101, steps_per_s=0.2, attempt=2, **chief)
    e.add(45, "straggler_detected", rank=1, host="h1", global_step=151, slower=3.0, busy_ms_per_step=150.0,
          others_ms_per_step=50.0, window_s=2.0, action="warn", attempt=2, role="chief")
    e.add(50, "train_progress", global_step=201, steps_per_s=10, attempt=2, **chief)
    e.add(54.5, "epoch_finished", epoch=1, global_step=250, loss=0.5, seconds=1.0, eval_s=0.5, attempt=2, **chief)
    e.add(55, "train_progress", global_step=251, steps_per_s=10, attempt=2, **chief)
    e.add(55, "training_completed", global_step=251, attempt=2, **chief)
    for rank in (0, 1):
        e.add(56, "worker_exited", rank=rank, pid=200 + rank, attempt=2, exit_code=0, state="exited", **sup)
    e.add(56.5, "run_state", **{"from": "running", "to": "succeeded"}, attempt=2, **sup)
    return e


def test_a_killed_run_every_second_in_one_category():
    account = account_time(_killed_then_completed(), wall_s=57.0)
    expected = {
        # 0.5 s the supervisor's own; attempt 1: 0.5 -> 10 s, the chief's 8 s of phases laid back from
        # its first step (1.5 s before its clock: launch); attempt 2: 34 -> 40 s, 6 s of phases
        "startup": 0.5 + 1.5 + 2 + 1 + 2 + 0.5 + 0.5,
        "tracing": 1.5 + 0.5 + 2 + 1,
        "restore": 0.5 + 0.5 + 1 + 1,
        # step 50's snapshot 0.2 s; step 100's wait 0.3 s and snapshot 0.1 s (inside the epoch end)
        "save_blocking": 0.2 + 0.4,
        "evaluation": 0.8 + 0.5,
        "epoch_ends": (2.0 - 0.8 - 0.4) + (1.0 - 0.5),
        # (150 - 50) ms a step over the steps from its window's start (43 s: step 131) to 55 s (step 251)
        "slow_rank_wait": 0.1 * 120,
        # steps 100 -> 215 ran twice; the run's rate: 400 steps in 40 s of train_progress
        "replayed": 115 / 10,
        "standstill": 34 - 32,  # the kill's exit -> attempt 2's start
        "finish": 56.5 - 55,
        "productive": (32 - 10) - 0.6 - 0.8 - 0.8 - 11.5 + (55 - 40) - 0.5 - 0.5 - 12.0,
        "other": 0.5,  # the wall time past the last event
    }
    assert account.seconds == pytest.approx({c: expected.get(c, 0.0) for c in CATEGORIES}, abs=1e-6)
    assert list(account.seconds) == list(CATEGORIES)
    assert sum(account.seconds.values()) == pytest.approx(57.0, abs=1e-6)
    assert account.phases == pytest.approx({"supervisor": 0.5, "launch": 1.5, "imports": 2, "bootstrap": 1.5,
                                            "strategy": 2, "handover": 0.5}, abs=1e-6)
    assert account.replayed_steps == 115
    assert account.goodput == pytest.approx(expected["productive"] / 57.0)
    a1, a2 = account.attempts
    assert (a1.attempt, a1.start, a1.end, a1.ended, a1.replayed_steps) == (1, 0.5, 34.0, "failure", 115)
    assert (a2.attempt, a2.start, a2.end, a2.ended, a2.replayed_steps) == (2, 34.0, 56.5, "completed", 0)
    for attempt in (a1, a2):
        assert sum(attempt.seconds.values()) == pytest.approx(attempt.span_s, abs=1e-6)
    # what the failure cost, as benchmarks/goodput.py counts it: standstill, the restart's start-up, replayed
    assert account.failure_cost_s == pytest.approx(2 + 6 + 11.5)


def test_summary_json_block_is_rounded_and_says_what_it_could_not_measure():
    block = account_time(_killed_then_completed(), wall_s=57.0).to_json()
    assert block["seconds"]["replayed"] == 11.5 and block["percent"]["standstill"] == round(200 / 57, 2)
    assert block["attempts"]["1"]["ended"] == "failure" and block["attempts"]["1"]["replayed_steps"] == 115
    assert block["notes"] == []
    quiet = account_time([r for r in _killed_then_completed() if r["event"] != "straggler_detected"], wall_s=57.0)
    assert quiet.seconds["slow_rank_wait"] == 0.0
    assert quiet.notes[0].startswith("slow_rank_wait: no straggler_detected, so 0")


def _stopped_and_rerun() -> _Log:
    e = _Log()
    sup, chief = {"role": "supervisor"}, {"rank": 0, "role": "chief"}
    e.add(0, "run_started", workers=1, **sup)
    e.add(0.1, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, **sup)
    e.add(0.2, "worker_started", rank=0, pid=100, attempt=1, **sup)
    e.add(3, "first_step", global_step=1, attempt=1, **chief)
    e.add(10, "preemption_requested", source="supervisor:SIGTERM", **sup)
    e.add(10, "run_state", **{"from": "running", "to": "stopping"}, attempt=1, reason="stop requested (SIGTERM)", **sup)
    e.add(11, "preempted", global_step=275, attempt=1, **chief)
    e.add(11.5, "worker_exited", rank=0, pid=100, attempt=1, exit_code=143, state="exited", **sup)
    e.add(11.6, "run_finished", status="preempted", **sup)
    e.add(31.0, "storage_claimed", storage="/s", **sup)  # the rerun's supervisor, before its run_started
    e.add(31.6, "run_started", workers=1, **sup)
    e.add(31.7, "run_state", **{"from": "preparing", "to": "starting"}, attempt=2, **sup)
    e.add(31.8, "worker_started", rank=0, pid=200, attempt=2, **sup)
    e.add(33, "restored", global_step=275, attempt=2, **chief)
    e.add(34.6, "first_step", global_step=276, attempt=2, **chief)
    e.add(40.6, "training_completed", global_step=300, attempt=2, **chief)
    e.add(41.6, "run_finished", status="completed", **sup)
    return e


def test_a_stop_and_a_rerun_the_pause_is_between_runs_the_save_and_exit_is_stopping():
    events = _stopped_and_rerun()
    account = account_time(events, gaps=[(11.6, 31.0)])
    assert account.wall_s == pytest.approx(41.6)
    expected = {"between_runs": 19.4, "startup": 0.1 + 2.9 + 0.7 + 2.9, "productive": 7 + 6, "stopping": 1.6,
                "finish": 1.0}
    assert account.seconds == pytest.approx({c: expected.get(c, 0.0) for c in CATEGORIES}, abs=1e-6)
    assert account.goodput == pytest.approx(13 / (41.6 - 19.4))
    assert [a.ended for a in account.attempts] == ["stop", "completed"]
    # summary.json accounts for the last invocation only (its wall_time_s): from the rerun's first event
    last = account_time(last_invocation(events), wall_s=11.0)
    assert [a.attempt for a in last.attempts] == [2]
    assert last.seconds["startup"] == pytest.approx(0.7 + 2.9) and last.seconds["other"] == pytest.approx(0.4)
    assert sum(last.seconds.values()) == pytest.approx(11.0, abs=1e-6)


def test_a_hang_stands_still_from_its_last_progress_and_a_start_up_that_never_trained():
    e = _Log()
    sup, chief = {"role": "supervisor"}, {"rank": 0, "role": "chief"}
    e.add(0, "run_started", workers=2, **sup)
    e.add(0, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, **sup)
    e.add(2, "first_step", global_step=1, attempt=1, **chief)
    e.add(30, "hang_detected", attempt=1, rank=1, seconds=20.0, **sup)
    e.add(30, "run_state", **{"from": "running", "to": "hung"}, attempt=1, **sup)
    e.add(31, "run_state", **{"from": "restarting", "to": "starting"}, attempt=2, **sup)
    e.add(35, "worker_exited", rank=0, attempt=2, exit_code=1, state="exited", **sup)
    e.add(35, "run_state", **{"from": "running", "to": "failed"}, attempt=2, **sup)
    account = account_time(e)
    expected = {"startup": 2 + 4, "productive": 8, "standstill": 31 - 10}
    assert account.seconds == pytest.approx({c: expected.get(c, 0.0) for c in CATEGORIES}, abs=1e-6)
    assert account.phases == pytest.approx({"supervisor": 0.0, "launch": 2.0, "never_trained": 4.0})


def test_a_workers_sigterm_is_a_stop_not_a_failure():
    e = _Log()
    sup = {"role": "supervisor"}
    e.add(0, "run_started", workers=2, **sup)
    e.add(0, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, **sup)
    e.add(2, "first_step", global_step=1, attempt=1, rank=0, role="chief")
    e.add(9, "preemption_requested", source="worker:1", attempt=1, rank=1, role="worker")
    e.add(10, "preempted", global_step=90, attempt=1, rank=0, role="chief")
    e.add(10.5, "worker_exited", rank=1, attempt=1, exit_code=143, state="exited", **sup)
    e.add(11, "run_state", **{"from": "running", "to": "stopping"}, attempt=1, reason="every worker exited", **sup)
    e.add(11, "run_state", **{"from": "stopping", "to": "preempted"}, attempt=1, **sup)
    account = account_time(e)
    assert [a.ended for a in account.attempts] == ["stop"]
    expected = {"startup": 2, "productive": 7, "stopping": 2}
    assert account.seconds == pytest.approx({c: expected.get(c, 0.0) for c in CATEGORIES}, abs=1e-6)


def test_replayed_steps_without_a_step_rate_cost_the_attempts_own_average():
    # no two train_progress in any attempt: attempt 1 ran steps 1..20 in its 22 s of training
    events = [r for r in _killed_then_completed() if r["event"] != "train_progress"]
    for r in events:
        if r["event"] == "attempt_reached":
            r["global_step"] = 20
        if r["event"] == "restored":
            r["global_step"] = 15
    for r in events:  # no straggler's steps to count either, nor saves: only the replay is carved
        if r["event"] in ("straggler_detected", "checkpoint_committed", "checkpoint_waited", "epoch_finished"):
            r["event"] = "ignored"
    account = account_time(events, wall_s=57.0)
    assert account.attempts[0].replayed_steps == 5
    assert account.attempts[0].seconds["replayed"] == pytest.approx(5 * 22 / 20, abs=1e-6)


def test_a_restarts_measured_cost_is_its_standstill_and_the_next_attempts_start_up_not_a_rerun():
    """The straggler policy's measured restart cost (runner/health/stragglers.py decide_replace)."""
    assert restart_costs(account_time(_killed_then_completed())) == pytest.approx([2 + 6])  # 32 -> 34 -> 40 s
    assert restart_costs(account_time(_stopped_and_rerun())) == []  # a stop, then a new invocation: no restart


def test_a_restart_after_an_agreed_save_costs_its_stopping_too():
    e = _Log()
    sup, chief = {"role": "supervisor"}, {"rank": 0, "role": "chief"}
    e.add(0, "run_started", workers=2, **sup)
    e.add(0, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, **sup)
    e.add(2, "first_step", global_step=1, attempt=1, **chief)
    e.add(9, "preemption_requested", source="straggler:1", global_step=90, attempt=1, **chief)
    e.add(10, "preempted", global_step=90, attempt=1, **chief)
    e.add(10.5, "worker_exited", rank=1, attempt=1, exit_code=143, state="exited", **sup)
    e.add(11, "run_state", **{"from": "stopping", "to": "restarting"}, attempt=1, **sup)
    e.add(11, "run_state", **{"from": "restarting", "to": "starting"}, attempt=2, **sup)
    e.add(12.5, "restored", global_step=90, attempt=2, **chief)
    e.add(14, "first_step", global_step=91, attempt=2, **chief)
    e.add(20, "training_completed", global_step=200, attempt=2, **chief)
    account = account_time(e)
    assert [a.ended for a in account.attempts] == ["stop", "completed"]
    assert restart_costs(account) == pytest.approx([(11 - 9) + (14 - 11)])
