"""The report page, from synthetic events: the DOM has exactly one lane per rank plus the
supervisor, one marker per fault, one tick per commit, one curve point per value, and a
resumed attempt's curve starts at its restore (tests/integration/test_report_browser.py opens
a real run's page in Chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


from resilient_train.cli import main as cli_main
from resilient_train.commands.report_page import load_run, parse_events, render_page
from resilient_train.supervisor.console import render_event
from tests.support.page_dom import PageDom


_FIELDS = re.compile(r"\b[a-z_]+=\S")  # key=value: the events' fields, not a sentence


def _ts(second: float) -> str:
    return f"2026-01-01T00:00:{second:06.3f}+00:00"


def _run_events() -> list[dict]:
    """Two workers; rank 1 SIGKILLed at step 15 of attempt 1; attempt 2 restores step 10 and completes."""
    e = []

    def add(t: float, event: str, **fields) -> None:
        e.append({"event": event, "ts": _ts(t), "run_id": "r1", **fields})

    add(0, "run_started", recipe="recipes/linear_regression.py", workers=2, role="supervisor")
    add(0.1, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, role="supervisor")
    for rank in (0, 1):
        add(0.2, "worker_started", rank=rank, pid=100 + rank, attempt=1, role="supervisor")
    add(0.3, "run_state", **{"from": "starting", "to": "running"}, attempt=1, role="supervisor")
    add(2, "fresh_start", epoch=0, step_in_epoch=0, global_step=0, rank=0, attempt=1, role="chief")
    add(3, "first_step", global_step=1, rank=0, attempt=1, role="chief")
    add(3, "train_progress", epoch=0, step_in_epoch=1, global_step=1, loss=2.0, metrics={"mae": 1.0}, rank=0,
        attempt=1, role="chief")
    add(4, "checkpoint_committed", epoch=0, step_in_epoch=5, global_step=5, rank=0, attempt=1, role="chief")
    add(4.5, "checkpoint_committed", epoch=1, step_in_epoch=0, global_step=10, rank=0, attempt=1, role="chief")
    add(4.6, "epoch_finished", epoch=0, global_step=10, loss=1.2, metrics={"mae": 0.8}, val_loss=0.4,
        val_metrics={"mae": 0.5}, rank=0, attempt=1, role="chief")
    add(5, "train_progress", epoch=1, step_in_epoch=5, global_step=15, loss=0.3, metrics={"mae": 0.4}, rank=0,
        attempt=1, role="chief")
    add(6, "worker_exited", rank=1, pid=101, attempt=1, signal="SIGKILL", state="exited", role="supervisor")
    add(6, "worker_failed", rank=1, pid=101, attempt=1, signal="SIGKILL", classification="failed", role="supervisor")
    add(6, "run_state", **{"from": "running", "to": "stopping"}, attempt=1, reason="worker 1 exited abnormally",
        role="supervisor")
    add(8, "worker_exited", rank=0, pid=100, attempt=1, signal="SIGKILL", state="killed", role="supervisor")
    add(8, "run_state", **{"from": "stopping", "to": "restarting"}, attempt=1,
        reason="attempt 1 failed (killed by SIGKILL); restart 1 of 3", role="supervisor")
    add(8, "gang_restart", attempt=2, reason="attempt 1 failed (killed by SIGKILL); restart 1 of 3",
        root_cause_rank=1, backoff_s=0.3, role="supervisor")
    for rank in (0, 1):
        add(9, "worker_started", rank=rank, pid=200 + rank, attempt=2, role="supervisor")
    add(9.1, "run_state", **{"from": "starting", "to": "running"}, attempt=2, role="supervisor")
    add(12, "restored", epoch=1, step_in_epoch=0, global_step=10, checkpoint="ckpt-10", rank=0, attempt=2,
        role="chief")
    add(14, "first_step", global_step=11, rank=0, attempt=2, role="chief")
    add(14, "train_progress", epoch=1, step_in_epoch=1, global_step=11, loss=0.35, metrics={"mae": 0.45}, rank=0,
        attempt=2, role="chief")
    add(15, "checkpoint_committed", epoch=1, step_in_epoch=5, global_step=15, rank=0, attempt=2, role="chief")
    add(15.5, "checkpoint_committed", epoch=2, step_in_epoch=0, global_step=20, rank=0, attempt=2, role="chief")
    add(15.6, "epoch_finished", epoch=1, global_step=20, loss=0.2, metrics={"mae": 0.3}, val_loss=0.1,
        val_metrics={"mae": 0.2}, rank=0, attempt=2, role="chief")
    add(16, "training_completed", global_step=20, epoch=2, weights_sha256="ab" * 32, rank=0, attempt=2, role="chief")
    for rank in (1, 0):
        add(16.5, "worker_exited", rank=rank, pid=200 + rank, attempt=2, exit_code=0, state="exited",
            role="supervisor")
    add(17, "run_state", **{"from": "running", "to": "succeeded"}, attempt=2, role="supervisor")
    add(17, "run_finished", status="completed", global_step=20, weights_sha256="ab" * 32, restarts=1, preemptions=0,
        lost_steps=5, role="supervisor")
    return e


def _write_run(tmp_path: Path, events: list[dict], *, extra_lines: list[str] = (), summary: dict | None = None) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [json.dumps(e) for e in events]
    (run_dir / "events.jsonl").write_text("\n".join([*lines[:5], *extra_lines, *lines[5:]]) + "\n")
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _dom(run_dir: Path) -> PageDom:
    dom = PageDom()
    dom.feed(render_page(load_run(run_dir)))
    return dom


def test_one_lane_per_rank_and_the_supervisor(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    assert [a["data-lane"] for a in dom.of_class("lane")] == ["supervisor", "rank 0", "rank 1"]


def test_every_fault_is_one_marker_with_its_root_cause(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    markers = dom.of_class("marker")
    # rank 1's SIGKILL (root cause), rank 0's teardown kill (secondary), the gang restart; clean exits are no faults
    assert [(m["data-event"], m["data-lane"]) for m in markers] == [
        ("worker_exited", "rank 1"), ("worker_exited", "rank 0"), ("gang_restart", "supervisor")]
    assert "00:00:06  rank 1 (pid 101) killed by SIGKILL, attempt 1\nroot cause: attempt 1 failed (killed by " \
           "SIGKILL); restart 1 of 3" in dom.titles
    assert "00:00:08  rank 0 (pid 100) killed by SIGKILL, attempt 1\nsecondary: killed by the supervisor's teardown " \
           "after a peer's failure" in dom.titles
    assert "00:00:08  restarting every worker as attempt 2 in 0.3 s: attempt 1 failed (killed by SIGKILL); " \
           "restart 1 of 3" in dom.titles  # the console's line for gang_restart


def test_every_commit_is_a_tick_and_each_attempt_a_span(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    assert [t["data-step"] for t in dom.of_class("ckpt")] == ["5", "10", "15", "20"]
    assert [a["data-attempt"] for a in dom.of_class("attempt")] == ["1", "2"]
    assert sorted((s["data-rank"], s["data-attempt"]) for s in dom.of_class("worker-span")) == [
        ("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")]


def test_the_restart_is_a_band_with_its_downtime(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    # left running at 6 s (rank 1 died), attempt 2's first step at 14 s
    assert [(b["data-kind"], b["data-attempt"], b["data-downtime"]) for b in dom.of_class("band")] == [
        ("restart", "2", "8.000")]


def test_curves_have_one_point_per_value_and_the_restore_is_marked(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    charts = [c["data-series"] for c in dom.of_class("chart")]
    assert charts == ["loss", "mae", "epoch loss", "epoch mae", "val_loss", "val_mae"]
    assert len(dom.of_class("pt")) == 3 * 2 + 2 * 4  # 3 train_progress x 2 series, 2 epoch_finished x 4 series
    assert [r["data-step"] for r in dom.of_class("restore")] == ["10"] * len(charts)
    assert [c["data-attempt"] for c in dom.of_class("curve")][:2] == ["1", "2"]  # loss: attempt 2 continues it
    view = load_run(tmp_path / "run")
    assert view.curves()["loss"] == [(1, 1, 2.0), (1, 15, 0.3), (2, 11, 0.35)]


def test_the_summary_from_events_and_goodput(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert rows["status"] == "completed"
    assert rows["global step"] == "20"
    assert rows["restarts"] == "1"
    assert rows["lost steps"] == "5"
    assert rows["wall time"] == "17.0 s"
    assert rows["stopped between runs"] == "0.0 s"  # one invocation
    # the time account's productive training (rundir/time_account.py): attempt 1 from its first step
    # at 3 s to rank 1's death at 6 s; attempt 2 from 14 s to training_completed at 16 s
    assert rows["productive training"] == "5.0 s"
    assert rows["time lost (downtime)"] == "8.0 s"
    assert rows["goodput"] == "29.4%"  # 5 / 17


def test_summary_json_wins_over_the_events(tmp_path):
    summary = {"status": "completed", "global_step": 20, "lost_steps": 7, "wall_time_s": 40.0,
               "root_cause": {"rank": 1, "exit": "killed by SIGKILL", "global_step": 15, "attempt": 1}}
    dom = _dom(_write_run(tmp_path, _run_events(), summary=summary))
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert (rows["lost steps"], rows["wall time"], rows["goodput"]) == ("7", "40.0 s", "12.5%")  # 5 / 40
    assert rows["root cause"] == "rank 1 killed by SIGKILL at global_step 15 (attempt 1)"


def test_the_summary_says_whether_the_weights_are_an_uninterrupted_runs(tmp_path):
    # Issue 51: an inexact resume was shown only in a marker's tooltip.
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}
    for name in ("inexact", "exact", "old"):
        (tmp_path / name).mkdir()
    dom = _dom(_write_run(tmp_path / "inexact", _run_events(), summary={"status": "completed", "exact": False,
                                                                        "inexact": [entry]}))
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert rows["exact"] == ("NO: not an uninterrupted run's weights: epoch 2's input differed from the one "
                             "recorded with ckpt-000000000010")
    dom = _dom(_write_run(tmp_path / "exact", _run_events(), summary={"status": "completed", "exact": True,
                                                                      "inexact": []}))
    assert dict(zip(dom.cells[0::2], dom.cells[1::2]))["exact"] == "yes"
    assert "exact" not in dict(zip(*[iter(_dom(_write_run(tmp_path / "old", _run_events())).cells)] * 2))


def test_torn_and_garbled_lines_are_skipped_and_counted(tmp_path):
    run_dir = _write_run(tmp_path, _run_events(), extra_lines=['{"event": "train_prog', "not json", "[1, 2]"])
    dom = _dom(run_dir)
    assert [s["data-skipped"] for s in dom.of_class("skipped")] == ["3"]
    assert len(dom.of_class("ckpt")) == 4
    assert parse_events([b'{"event": "a"}', b"", b"{bad"]) == ([{"event": "a"}], 1)


def test_an_old_run_without_attempts_or_summary_still_renders(tmp_path):
    events = [{"event": "run_started", "ts": _ts(0), "workers": 1},
              {"event": "train_progress", "ts": _ts(1), "global_step": 1, "loss": 1.0},
              {"event": "checkpoint_committed", "ts": _ts(2), "global_step": 1}]
    dom = _dom(_write_run(tmp_path, events))
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert rows["status"] == "unfinished (no run_finished event)"
    assert [a["data-lane"] for a in dom.of_class("lane")] == ["supervisor", "rank 0"]
    assert len(dom.of_class("pt")) == 1


def test_the_page_is_self_contained(tmp_path):
    dom = _dom(_write_run(tmp_path, _run_events()))
    assert [tag for tag, _ in dom.elements if tag in ("script", "link", "img", "iframe")] == []
    assert [a for _, a in dom.elements if any(str(v).startswith(("http:", "https:")) for k, v in a.items()
                                               if k in ("src", "href"))] == []


def test_the_command_writes_the_page_and_refuses_a_non_run_dir(tmp_path, capsys):
    run_dir = _write_run(tmp_path, _run_events())
    assert cli_main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    out = tmp_path / "elsewhere.html"
    assert cli_main(["report", str(run_dir), "--out", str(out)]) == 0
    assert out.read_text() == (run_dir / "report.html").read_text()
    capsys.readouterr()
    assert cli_main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"resilient-train: error: {tmp_path} is not a run dir: it has no events.jsonl\n"
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_preempted_and_resumed_run_counts_both_invocations(tmp_path):
    first = [{"event": "run_started", "ts": _ts(0), "workers": 1, "role": "supervisor"},
             {"event": "first_step", "ts": _ts(1), "global_step": 1, "attempt": 1, "rank": 0, "role": "chief"},
             {"event": "preemption_requested", "ts": _ts(3), "source": "supervisor:SIGTERM", "role": "supervisor"},
             {"event": "preempted", "ts": _ts(4), "global_step": 7, "attempt": 1, "rank": 0, "role": "chief"},
             {"event": "run_state", "ts": _ts(5), "from": "stopping", "to": "preempted", "attempt": 1},
             {"event": "run_finished", "ts": _ts(5), "status": "preempted", "restarts": 0, "preemptions": 1,
              "lost_steps": 0}]
    second = [{"event": "run_started", "ts": _ts(20), "workers": 1, "role": "supervisor"},
              {"event": "restored", "ts": _ts(22), "global_step": 7, "attempt": 2, "rank": 0, "role": "chief"},
              {"event": "first_step", "ts": _ts(23), "global_step": 8, "attempt": 2, "rank": 0, "role": "chief"},
              {"event": "run_finished", "ts": _ts(25), "status": "completed", "restarts": 0, "preemptions": 0,
               "lost_steps": 0}]
    summary = {"status": "completed", "preemptions": 0, "wall_time_s": 5.0}  # the last invocation's
    dom = _dom(_write_run(tmp_path, first + second, summary=summary))
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert (rows["invocations"], rows["preemptions"], rows["wall time"]) == ("2", "1", "25.0 s")
    # stopped by SIGTERM: from its run_finished (5 s) to the next run_started (20 s) is a gap, not downtime
    assert [(g["data-seconds"]) for g in dom.of_class("gap")] == ["15.000"]
    assert dom.of_class("band") == []
    assert [m["data-event"] for m in dom.of_class("marker")] == ["preemption_requested", "preempted"]


def test_a_hang_is_a_marker_and_its_stall_is_downtime(tmp_path):
    events = [e for e in _run_events() if e["event"] not in ("worker_exited", "worker_failed", "run_state")
              or e.get("attempt") != 1 or e.get("to") in ("starting", "running")]
    at = next(i for i, e in enumerate(events) if e["event"] == "gang_restart")
    events[at:at] = [
        {"event": "run_state", "ts": _ts(7.9), "from": "running", "to": "hung", "attempt": 1, "role": "supervisor"},
        {"event": "hang_detected", "ts": _ts(7.95), "attempt": 1, "rank": 1, "pid": 101, "global_step": 15,
         "seconds": 2.5, "where": "faults.py:112 _hang_forever", "stacks": "attempt-1/stacks-1.txt",
         "role": "supervisor"},
        {"event": "run_state", "ts": _ts(7.96), "from": "hung", "to": "stopping", "attempt": 1, "role": "supervisor"}]
    dom = _dom(_write_run(tmp_path, events))
    assert [(m["data-event"], m["data-lane"]) for m in dom.of_class("marker")] == [
        ("hang_detected", "rank 1"), ("gang_restart", "supervisor")]
    # the watchdog saw the last progress 2.5 s before 7.95 s; attempt 2's first step at 14 s
    assert [b["data-downtime"] for b in dom.of_class("band")] == ["8.550"]
    assert "00:00:07  hang: rank 1 made no progress for 2 s at global step 15; faults.py:112 _hang_forever " \
           "(stacks: attempt-1/stacks-1.txt)" in dom.titles


def _stopped_and_rerun(stop_source: str = "supervisor:SIGTERM") -> list[dict]:
    """The issue's case: one worker, stopped at 10 s (``stop_source``), saved global step 275
    (epoch 2, step 25: the event says epoch 1) and ended at 11.6 s; the same command run again
    20 s later resumes and completes at 41.6 s."""
    e = []

    def add(t: float, event: str, **fields) -> None:
        e.append({"event": event, "ts": _ts(t), "run_id": "r1", **fields})

    add(0, "storage_claimed", storage="/s", forced=False, role="supervisor")
    add(0, "run_started", recipe="recipes/linear_regression.py", workers=1, role="supervisor")
    add(0.1, "run_state", **{"from": "preparing", "to": "starting"}, attempt=1, role="supervisor")
    add(0.2, "worker_started", rank=0, pid=100, attempt=1, role="supervisor")
    add(0.3, "run_state", **{"from": "starting", "to": "running"}, attempt=1, role="supervisor")
    add(3, "first_step", global_step=1, rank=0, attempt=1, role="chief")
    add(9, "checkpoint_committed", epoch=1, step_in_epoch=20, global_step=270, path="/s/ckpt-270", rank=0,
        attempt=1, role="chief")
    add(10, "preemption_requested", source=stop_source, role="supervisor")
    add(10, "run_state", **{"from": "running", "to": "stopping"}, attempt=1,
        reason=f"stop requested ({stop_source.removeprefix('supervisor:')})", role="supervisor")
    add(11, "preempted", global_step=275, epoch=1, step_in_epoch=25, rank=0, attempt=1, role="chief")
    add(11.5, "worker_exited", rank=0, pid=100, attempt=1, exit_code=143, state="exited", role="supervisor")
    add(11.6, "run_state", **{"from": "stopping", "to": "preempted"}, attempt=1,
        reason=f"stop requested ({stop_source.removeprefix('supervisor:')})", role="supervisor")
    add(11.6, "run_finished", status="preempted", global_step=275, restarts=0, preemptions=1, lost_steps=0,
        role="supervisor")
    add(31.6, "run_started", recipe="recipes/linear_regression.py", workers=1, role="supervisor")
    add(31.7, "run_state", **{"from": "preparing", "to": "starting"}, attempt=2, role="supervisor")
    add(31.8, "worker_started", rank=0, pid=200, attempt=2, role="supervisor")
    add(31.9, "run_state", **{"from": "starting", "to": "running"}, attempt=2, role="supervisor")
    add(33, "restored", epoch=1, step_in_epoch=25, global_step=275, checkpoint="/s/ckpt-275", rank=0, attempt=2,
        role="chief")
    add(34.6, "first_step", global_step=276, rank=0, attempt=2, role="chief")
    add(40.6, "training_completed", global_step=300, epoch=2, rank=0, attempt=2, role="chief")
    add(41, "worker_exited", rank=0, pid=200, attempt=2, exit_code=0, state="exited", role="supervisor")
    add(41.2, "run_state", **{"from": "running", "to": "succeeded"}, attempt=2, role="supervisor")
    add(41.6, "run_finished", status="completed", global_step=300, restarts=0, preemptions=0, lost_steps=0,
        role="supervisor")
    return e


def test_a_stop_and_a_rerun_20_s_later_is_a_gap_not_downtime(tmp_path):
    run_dir = _write_run(tmp_path, _stopped_and_rerun())
    dom, view = _dom(run_dir), load_run(run_dir)
    assert [(round(i.start, 3), round(i.end, 3), i.status, i.stopped_by) for i in view.invocation_spans()] == [
        (0.0, 11.6, "preempted", "SIGTERM"), (31.6, 41.6, "completed", None)]
    assert [(g["data-seconds"]) for g in dom.of_class("gap")] == ["20.000"]
    assert "between runs: 20.0 s with no run under way (not downtime, not in goodput)\nbefore it: Run preempted: " \
           "stopped by SIGTERM (exit 143)" in dom.titles
    # a person's stop: the rerun's start-up is start-up, as the first invocation's is; no fault band
    assert dom.of_class("band") == []
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert (rows["wall time"], rows["stopped between runs"], rows["time lost (downtime)"]) == (
        "41.6 s", "20.0 s", "0.0 s")
    # productive: attempt 1 from 3 s to the stop request at 10 s (its save and exit, 10 s to 11.6 s, are
    # stopping), attempt 2 from 34.6 s to 40.6 s = 13 s of the 41.6 - 20.0 = 21.6 s the run was under way
    # (13 / 41.6 = 31.2% with the pause counted)
    assert (rows["productive training"], rows["goodput"]) == ("13.0 s", "60.2%")


def test_a_rerun_after_a_preemption_notice_pays_its_start_up_as_downtime(tmp_path):
    dom = _dom(_write_run(tmp_path, _stopped_and_rerun("notice:gce")))
    assert [(g["data-seconds"]) for g in dom.of_class("gap")] == ["20.000"]
    # the preemption's cost: the rerun's start (31.6 s) to its first step (34.6 s)
    assert [(b["data-kind"], b["data-attempt"], b["data-downtime"]) for b in dom.of_class("band")] == [
        ("preemption", "2", "3.000")]
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert (rows["stopped between runs"], rows["time lost (downtime)"], rows["goodput"]) == ("20.0 s", "3.0 s", "60.2%")


def test_a_killed_supervisor_ends_its_invocation_at_its_last_event(tmp_path):
    """Killed (kill -9) inside a restart at 10.6 s, run again at 30 s: its restart's downtime
    stops at its last event, the gap runs to the new invocation's first event (a storage
    retry before its run_started), and the rerun's start-up is a restart band."""
    events = _stopped_and_rerun()[:6]  # to the first step at 3 s
    events += [
        {"event": "worker_exited", "ts": _ts(10), "rank": 0, "pid": 100, "attempt": 1, "signal": "SIGKILL",
         "state": "exited", "role": "supervisor"},
        {"event": "run_state", "ts": _ts(10), "from": "running", "to": "stopping", "attempt": 1,
         "reason": "worker 0 exited abnormally", "role": "supervisor"},
        {"event": "run_state", "ts": _ts(10.6), "from": "stopping", "to": "restarting", "attempt": 1,
         "reason": "attempt 1 failed (killed by SIGKILL); restart 1 of 3", "role": "supervisor"},
        {"event": "storage_retry", "ts": _ts(30), "op": "ls", "path": "/s", "try_number": 1, "error": "timeout",
         "wait_s": 0.5, "role": "supervisor"}]
    events += [e for e in _stopped_and_rerun() if e["ts"] >= _ts(31.6)]
    view = load_run(_write_run(tmp_path, events))
    assert [(round(i.start, 3), round(i.end, 3), i.status) for i in view.invocation_spans()] == [
        (0.0, 10.6, None), (30.0, 41.6, "completed")]
    assert [(round(g.start, 3), round(g.end, 3), g.after) for g in view.gaps()] == [
        (10.6, 30.0, "its supervisor ended without finishing (killed?)")]
    assert [(b.kind, b.attempt, round(b.downtime_s, 3)) for b in view.bands()] == [("restart", 2, 0.6),
                                                                                   ("restart", 2, 4.6)]


def test_tooltips_read_as_the_console_does(tmp_path):
    """The console's lines, word for word (epochs from 1: the event's epoch 1 is "epoch 2")."""
    run_dir = _write_run(tmp_path, _stopped_and_rerun())
    dom, view = _dom(run_dir), load_run(run_dir)
    markers = [(e["event"], text) for _, e, text in view.faults()]
    assert markers == [
        ("preemption_requested", "00:00:10  the run got SIGTERM: the workers save at one agreed step, then stop"),
        ("preempted", "00:00:11  saved global step 275 (epoch 2, step 25) and stopped"),
        ("worker_exited", "00:00:11  rank 0 (pid 100) exit code 143, attempt 1\n"
                          "stopped after the preemption's checkpoint (exit 143)")]
    assert [m["data-event"] for m in dom.of_class("marker")] == [event for event, _ in markers]
    assert all(text in dom.titles for _, text in markers)
    preempted = next(e for e in view.events if e["event"] == "preempted")
    assert markers[1][1] == render_event(preempted)  # the console's own line for it
    assert "checkpoint committed at global step 270 (epoch 2, step 20)" in dom.titles
    assert [t for t in dom.titles if _FIELDS.search(t)] == []  # no key=value dump anywhere


def test_events_the_console_leaves_to_the_supervisor_read_as_its_lines(tmp_path):
    events = _run_events()
    events.insert(-2, {"event": "restart_budget_exhausted", "ts": _ts(16.9), "attempt": 2, "role": "supervisor",
                       "reason": "restart budget exhausted (3 restarts)"})
    events.insert(-2, {"event": "rescue_requested", "ts": _ts(16.9), "attempt": 2, "rank": 0, "dead_ranks": [1],
                       "deadline_s": 2.5, "role": "supervisor"})
    dom = _dom(_write_run(tmp_path, events))
    assert "00:00:16  Stopping: restart budget exhausted (3 restarts)" in dom.titles
    assert "00:00:16  rescue: asked rank 0 to commit its in-memory snapshot (rank 1 died); waiting at most 2.5 s" \
        in dom.titles


def test_every_fault_marker_has_the_consoles_words():
    """No marker falls back to a label: each fault event has a console sentence, or the
    supervisor's own line (SAID_BY_SUPERVISOR, for events the console hides); a worker's exit
    has the page's root-cause text."""
    from resilient_train.commands.report_page import FAULT_EVENTS
    from resilient_train.supervisor.console import CONSOLE, SAID_BY_SUPERVISOR

    assert [name for name in FAULT_EVENTS if name != "worker_exited"
            and CONSOLE.get(name) is None and name not in SAID_BY_SUPERVISOR] == []
    assert [name for name in SAID_BY_SUPERVISOR if CONSOLE[name] is not None] == []  # only for hidden ones


def test_an_anomaly_its_rollback_its_verdict_and_a_suspected_host_are_markers_in_the_consoles_words(tmp_path):
    events = _run_events()
    at = {"rank": 0, "role": "chief", "run_id": "r1"}
    events.insert(-2, {"event": "anomaly_detected", "ts": _ts(12.5), "attempt": 2, "kind": "replicas",
                       "global_step": 12, "epoch": 1, "step_in_epoch": 2, "replicas": 2, "ranks": [0, 1], "values": {},
                       "action": "rollback", **at})
    events.insert(-2, {"event": "rolled_back", "ts": _ts(12.6), "attempt": 2, "global_step": 10, "anomaly_step": 12,
                       **at})
    events.insert(-2, {"event": "replay_verdict", "ts": _ts(12.7), "attempt": 2, "global_step": 12,
                       "verdict": "transient", "values_before": {}, "hosts": ["127.0.0.1"], **at})
    events.insert(-2, {"event": "host_suspected", "ts": _ts(12.8), "attempt": 2, "host": "127.0.0.1", "ranks": [0, 1],
                       "transients": 1, "limit": 1, **at})
    run_dir = _write_run(tmp_path, events)
    dom, view = _dom(run_dir), load_run(run_dir)
    health = [(e["event"], text) for _, e, text in view.faults()
              if e["event"] in ("anomaly_detected", "rolled_back", "replay_verdict", "host_suspected")]
    assert [(event, text[:10]) for event, text in health] == [
        ("anomaly_detected", "00:00:12  "), ("rolled_back", "00:00:12  "), ("replay_verdict", "00:00:12  "),
        ("host_suspected", "00:00:12  ")]
    assert health[1][1] == "00:00:12  rolled back to global step 10: replaying up to step 12"
    assert health[2][1] == ("00:00:12  replayed step 12 without the anomaly: it was transient on 127.0.0.1 (not the "
                            "data or the model); training goes on")
    assert all(text in dom.titles for _, text in health)
    assert [m["data-event"] for m in dom.of_class("marker")].count("host_suspected") == 1


def test_where_the_time_went_one_bar_per_attempt_and_a_table_that_adds_up(tmp_path):
    dom = _dom(_write_run(tmp_path, _stopped_and_rerun()))
    bars = dom.of_class("time-bar")
    assert [(b["data-attempt"], b["data-seconds"]) for b in bars] == [("run", "41.600"), ("1", "11.500"),
                                                                      ("2", "9.900")]
    segments = [(s["data-category"], round(float(s["data-seconds"]), 2)) for s in dom.of_class("time-seg")]
    # the run's bar first: its categories in the table's order, then attempt 1's (0.1 s to the end of its
    # invocation, 11.6 s), then attempt 2's (31.7 s to 41.6 s; each supervisor's 0.1 s before its first
    # attempt is the run's start-up, in no attempt)
    assert segments == [
        ("productive", 13.0), ("startup", 6.0), ("stopping", 1.6), ("finish", 1.0), ("between_runs", 20.0),
        ("productive", 7.0), ("startup", 2.9), ("stopping", 1.6),
        ("productive", 6.0), ("startup", 2.9), ("finish", 1.0)]
    table = {r["data-category"]: float(r["data-seconds"]) for r in dom.of_class("time-row")}
    assert sum(table.values()) == pytest.approx(41.6, abs=1e-3) and table["other"] == pytest.approx(0, abs=1e-3)
    assert [r["data-phase"] for r in dom.of_class("time-phase")] == ["supervisor", "launch"]
    [definition] = [attrs for _, attrs in dom.elements if attrs.get("id") == "goodput-definition"]
    assert definition["data-goodput"] == "60.2%"  # the summary's goodput: one definition
