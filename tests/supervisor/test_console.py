"""The console's fresh-start line after every checkpoint was rejected (issue 11 pt 8)."""

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


def test_run_state_transitions_stay_out_of_the_human_view(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    out = io.StringIO()
    tail = EventTail(path, out)
    write(path, {"event": "run_state", "from": "running", "to": "stopping", "attempt": 1, "reason": "worker 1 exited abnormally"},
          {"event": "gang_restart", "attempt": 2})
    assert [r["event"] for r in tail.pump()] == ["run_state", "gang_restart"]
    assert out.getvalue().splitlines() == ["10:00:00 gang_restart           attempt=2"]
