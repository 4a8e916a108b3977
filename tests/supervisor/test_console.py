"""The console's fresh-start line after every checkpoint was rejected."""

import io
import json

from resilient_train.supervisor.console import EventTail


def write(path, *records):
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps({"ts": "2026-11-23T10:00:00.000000+00:00", **record}) + "\n")


def test_a_fresh_start_after_the_only_checkpoint_was_rejected_says_so(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    out = io.StringIO()
    tail = EventTail(path, out)
    write(path, {"event": "checkpoint_rejected", "path": "/c/ckpt-000000000010", "reason": "sha256 mismatch in ckpt.index",
                 "global_step": 10},
          {"event": "fresh_start", "epoch": 0, "step_in_epoch": 0, "global_step": 0})
    tail.pump()
    lines = out.getvalue().splitlines()
    assert lines[-1] == "10:00:00  no restorable checkpoint: 1 checkpoint was rejected (see above); starting from step 0"
    write(path, {"event": "fresh_start", "epoch": 0, "step_in_epoch": 0, "global_step": 0})
    tail.pump()
    assert out.getvalue().splitlines()[-1] == "10:00:00  no checkpoint found: starting from step 0"


def test_progress_commit_and_restore_lines_number_the_same_epoch_the_same_way():
    from resilient_train.supervisor.console import render_event

    at = {"ts": "2026-11-23T06:55:29", "epoch": 1, "step_in_epoch": 20, "global_step": 60}
    progress = render_event({**at, "event": "train_progress", "steps_per_epoch": 40, "steps_per_s": 20.0})
    commit = render_event({**at, "event": "checkpoint_committed", "path": "s/ckpt-000000000060"})
    restore = render_event({**at, "event": "restored", "checkpoint": "s/ckpt-000000000060"})
    assert progress.startswith("06:55:29  epoch 2  step   20/40  (global 60)")
    assert commit == "06:55:29  checkpoint committed at global step 60 (epoch 2, step 20) -> s/ckpt-000000000060"
    assert restore == "06:55:29  restored global step 60 (epoch 2, step 20) from s/ckpt-000000000060"


def test_run_state_transitions_stay_out_of_the_human_view(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    out = io.StringIO()
    tail = EventTail(path, out)
    write(path, {"event": "run_state", "from": "running", "to": "stopping", "attempt": 1, "reason": "worker 1 exited abnormally"},
          {"event": "input_digest", "epoch": 0, "sha256": "ab" * 32},
          {"event": "gang_restart", "attempt": 2})
    assert [r["event"] for r in tail.pump()] == ["run_state", "input_digest", "gang_restart"]
    assert out.getvalue().splitlines() == ["10:00:00 gang_restart           attempt=2"]


def test_a_hang_is_one_line_naming_rank_step_and_where():
    from resilient_train.supervisor.console import hang_line, render_event

    hang = {"event": "hang_detected", "ts": "2026-11-23T06:55:29", "rank": 1, "seconds": 31.2, "global_step": 24,
            "epoch": 0, "step_in_epoch": 24, "where": "main thread in input_hang.py:47 _read",
            "stacks": "runs/x/attempt-1/stacks-1.txt"}
    assert render_event(hang) == (
        "06:55:29  hang: rank 1 made no progress for 31 s at global step 24 (epoch 1, step 24); "
        "main thread in input_hang.py:47 _read (stacks: runs/x/attempt-1/stacks-1.txt)"
    )
    assert hang_line({**hang, "global_step": None}) == (
        "rank 1 made no progress for 31 s before its first step of the attempt; main thread in input_hang.py:47 _read"
    )
