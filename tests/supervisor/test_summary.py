"""summary.json and its totals, computed from a hand-built run dir."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.time_account import CATEGORIES
from resilient_train.supervisor.summary import (
    RootCauseRecord,
    RunTotals,
    build_summary,
    count_lost_steps,
    final_validation,
    reached_step,
    stragglers,
    write_summary,
)


def hand_built(tmp_path) -> RunDir:
    run_dir = RunDir(tmp_path / "run")
    run_dir.attempt(1).path.mkdir(parents=True)
    run_dir.attempt(1).step_marker(0).write_text("7\n")
    run_dir.attempt(2).path.mkdir()
    run_dir.attempt(2).step_marker(0).write_text("12\n")
    run_dir.attempt(2).step_marker(1).write_text("11\n")
    return run_dir


def test_steps_of_an_attempt_killed_before_its_first_commit_count_as_lost(tmp_path):
    run_dir = hand_built(tmp_path)
    records = [
        {"event": "fresh_start", "attempt": 2, "global_step": 0},
        {"event": "restored", "attempt": 3, "global_step": 10},
    ]
    assert count_lost_steps(run_dir, records) == 7 + 2


def test_a_restore_in_attempt_1_or_without_markers_loses_nothing(tmp_path):
    run_dir = hand_built(tmp_path)
    records = [
        {"event": "restored", "attempt": 1, "global_step": 4},   # no attempt 0
        {"event": "restored", "attempt": 9, "global_step": 4},   # attempt 8 left no markers
        {"event": "restored", "attempt": "2", "global_step": 0},  # not an int: ignored
    ]
    assert count_lost_steps(run_dir, records) == 0
    assert (reached_step(run_dir, 0), reached_step(run_dir, 2), reached_step(run_dir, 8)) == (None, 12, None)


def test_final_validation_is_the_last_evaluated_epoch():
    records = [
        {"event": "epoch_finished", "epoch": 0, "val_loss": 0.5, "val_metrics": {"accuracy": 0.8}, "val_examples": 100},
        {"event": "epoch_finished", "epoch": 1},
        {"event": "epoch_finished", "epoch": 2, "val_loss": 0.25, "val_metrics": {"accuracy": 0.9}, "val_examples": 100},
    ]
    assert final_validation(records) == {"val_epoch": 3, "val_loss": 0.25, "val_metrics": {"accuracy": 0.9}, "val_examples": 100}
    assert final_validation([{"event": "epoch_finished", "epoch": 0}]) == {}


def test_summary_names_the_checkpoint_totals_and_attempts_and_is_written_atomically(tmp_path):
    run_dir = hand_built(tmp_path)
    manifest = SimpleNamespace(epoch=2, global_step=20, weights_sha256="a" * 64, inexact=[])  # the fields a summary reads
    root = RootCauseRecord(rank=1, pid=42, exit="exit code 1", type="ValueError", message="bad", global_step=7, attempt=2)
    totals = RunTotals(restarts=1, preemptions=2, lost_steps=3, root_cause=root)
    summary = build_summary(
        status="completed", run_id="r", recipe="recipes/x.py", workers=2, run_dir=run_dir,
        storage_url="file:///s", manifest=manifest, totals=totals,
        records=[{"event": "epoch_finished", "epoch": 0, "val_loss": 0.5},
                 {"event": "worker_started", "attempt": 1, "rank": 0}, {"event": "worker_started", "attempt": 1, "rank": 1},
                 {"event": "worker_started", "attempt": 2, "rank": 0}], wall_time_s=1.23456,
        finished_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
    )
    # events without a ts place no second: the whole wall time is "other", never hidden
    account = summary.pop("time_account")
    assert account["seconds"] == {**{c: 0.0 for c in CATEGORIES}, "other": 1.235}
    assert (account["wall_s"], account["goodput"]) == (1.235, 0.0)
    assert summary == {
        "status": "completed", "run_id": "r", "recipe": "recipes/x.py",
        "epochs": 2, "global_step": 20, "weights_sha256": "a" * 64, "checkpoint": "file:///s/ckpt-000000000020",
        "exact": True, "inexact": [], "attempts": 2, "restarts": 1, "preemptions": 2, "membership_changes": 0, "lost_steps": 3,
        "anomalies": [], "stragglers": [],
        "root_cause": {"rank": 1, "pid": 42, "exit": "exit code 1", "type": "ValueError", "message": "bad",
                       "global_step": 7, "attempt": 2},
        "workers": 2, "world_sizes": {"1": 2, "2": 1}, "run_dir": str(run_dir.path), "storage": "file:///s", "events": str(run_dir.events),
        "val_epoch": 1, "val_loss": 0.5, "val_metrics": None, "val_examples": None,
        "wall_time_s": 1.235, "finished_at": "2026-01-02T03:04:05+00:00",
    }
    write_summary(run_dir, summary)
    assert json.loads(run_dir.summary.read_text()) == summary
    assert [p.name for p in run_dir.path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_every_straggler_detected_is_listed_with_its_attempt():
    records = [{"event": "train_progress", "global_step": 5},
               {"event": "straggler_detected", "attempt": 2, "rank": 1, "host": "h1", "global_step": 51, "slower": 2.86,
                "busy_ms_per_step": 61.8, "others_ms_per_step": 21.6, "window_s": 3.0, "steps_per_s": 16.19,
                "steps_per_s_without": 46.24, "steps_per_s_lost": 30.05, "steps_left": 249, "time_lost_s": 10.0,
                "action": "warn", "role": "chief", "evidence": "host_time", "stalled": 0.04, "others_stalled": 0.03}]
    assert stragglers(records) == [{"attempt": 2, "rank": 1, "host": "h1", "global_step": 51, "slower": 2.86,
                                    "evidence": "host_time", "stalled": 0.04, "others_stalled": 0.03,
                                    "busy_ms_per_step": 61.8, "others_ms_per_step": 21.6, "steps_per_s": 16.19,
                                    "steps_per_s_lost": 30.05, "time_lost_s": 10.0, "action": "warn",
                                    "reason": None, "gain_s": None, "restart_cost_s": None, "restart_cost_from": None,
                                    "steps_left": 249, "moved": None, "nodes": None, "saved_step": None}]


def test_a_replaced_straggler_is_listed_with_the_decision_and_what_the_restart_moved():
    named = {"event": "straggler_detected", "attempt": 1, "rank": 1, "host": "127.0.0.1", "global_step": 600,
             "slower": 1.8, "time_lost_s": 14.2, "action": "replace", "reason": "its cost ... exceeds a restart's",
             "gain_s": 14.2, "restart_cost_s": 10.0, "restart_cost_from": "estimate", "steps_left": 2400}
    replaced = {"event": "straggler_replaced", "attempt": 1, "rank": 1, "host": "127.0.0.1", "global_step": 612,
                "moved": "fresh_process", "nodes": [], "launcher": "local"}
    warned = dict(named, attempt=2, action="warn", reason="rank 1 was replaced 20 s ago (--straggler-cooldown 600 s)")
    [first, second] = stragglers([named, replaced, warned])
    assert (first["action"], first["gain_s"], first["restart_cost_s"], first["restart_cost_from"], first["steps_left"],
            first["moved"], first["nodes"], first["saved_step"]) == (
        "replace", 14.2, 10.0, "estimate", 2400, "fresh_process", [], 612)
    assert (second["attempt"], second["action"], second["moved"], second["saved_step"]) == (2, "warn", None, None)


def test_a_root_cause_record_is_the_summary_object_and_a_hangs_adds_its_details_after_attempt():
    crash = RootCauseRecord(rank=None, pid=None, exit="not started", type="RestartNotPlacedError",
                            message="no node", global_step=None, attempt=3)
    assert list(crash.to_json().items()) == [
        ("rank", None), ("pid", None), ("exit", "not started"), ("type", "RestartNotPlacedError"),
        ("message", "no node"), ("global_step", None), ("attempt", 3)]
    hang = RootCauseRecord(rank=1, pid=4001, exit="hung", type="Hang", message="rank 1 made no progress",
                           global_step=24, attempt=1, seconds=31.0, stacks="attempt-1/stacks-1.txt", where="main thread")
    assert list(hang.to_json().items()) == [
        ("rank", 1), ("pid", 4001), ("exit", "hung"), ("type", "Hang"), ("message", "rank 1 made no progress"),
        ("global_step", 24), ("attempt", 1), ("seconds", 31.0), ("stacks", "attempt-1/stacks-1.txt"),
        ("where", "main thread")]


def test_without_a_checkpoint_the_summary_says_none():
    summary = build_summary(
        status="failed", run_id="r", recipe="x", workers=1, run_dir=RunDir("/nowhere"), storage_url="memory://s",
        manifest=None, totals=RunTotals(), records=[], wall_time_s=0.0,
    )
    assert (summary["epochs"], summary["global_step"], summary["weights_sha256"], summary["checkpoint"], summary["attempts"]) == (
        0, 0, None, None, 0)
    assert (summary["exact"], summary["inexact"]) == (None, [])
    assert "val_epoch" not in summary


def test_a_checkpoint_with_an_inexact_resume_behind_it_makes_the_summary_say_not_exact():
    from resilient_train.checkpoint.manifest import FileEntry, Manifest, now_utc

    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}
    manifest = Manifest(schema_version=1, run_id="r", epoch=3, step_in_epoch=0, global_step=30, world_size=2,
                        tf_version="2", created_at=now_utc(), files={"ckpt/x": FileEntry(1, "0" * 64)},
                        weights_sha256="b" * 64, extra={"completed": True, "inexact": [entry, "not ours"]})
    summary = build_summary(
        status="completed", run_id="r", recipe="x", workers=2, run_dir=RunDir("/nowhere"), storage_url="file:///s",
        manifest=manifest, totals=RunTotals(), records=[], wall_time_s=0.0,
    )
    assert (summary["status"], summary["exact"], summary["inexact"]) == ("completed", False, [entry])


def test_steps_finished_inside_a_call_that_broke_count_as_lost_as_the_root_cause_reports(tmp_path):
    # Issue 36: worker 0 was SIGKILLed inside a call that began at 100 (the step markers are
    # written after each call, so they still say 100); worker 1's collective broke after it
    # had finished step 114 and its error file says so. The root cause said "at global_step
    # 114", the run resumed from 100, and lost_steps said 0: 14 steps ran and were discarded.
    import signal

    from resilient_train.errors import GroupBrokenError
    from resilient_train.rundir.errorfile import choose_root_cause, read_errors, record_exception

    run_dir = RunDir(tmp_path / "run")
    attempt = run_dir.attempt(1).path
    attempt.mkdir(parents=True)
    run_dir.attempt(1).step_marker(0).write_text("100\n")
    run_dir.attempt(1).step_marker(1).write_text("100\n")
    record_exception(attempt, 1, GroupBrokenError("UnavailableError: peer 0 is gone"), global_step=114,
                     clock=lambda: 2000.0)
    reached = reached_step(run_dir, 1)
    root = choose_root_cause({0: (4242, -signal.SIGKILL, 1999.0), 1: (4243, 4, 2001.0)}, read_errors(attempt),
                             lambda rank: [], reached=reached)
    assert (root.rank, root.global_step, reached) == (0, 114, 114)
    assert root.render().splitlines()[0] == "root cause: worker 0 (pid 4242) killed by SIGKILL at global_step 114"
    assert count_lost_steps(run_dir, [{"event": "restored", "attempt": 2, "global_step": 100}]) == 14


def test_an_error_file_behind_the_markers_does_not_lower_the_reached_step(tmp_path):
    from resilient_train.rundir.errorfile import record_exception

    run_dir = hand_built(tmp_path)  # attempt 2's markers: 12 and 11
    record_exception(run_dir.attempt(2).path, 1, RuntimeError("boom"), global_step=3)
    record_exception(run_dir.attempt(2).path, 0, RuntimeError("at start-up"), global_step=None)
    assert reached_step(run_dir, 2) == 12
