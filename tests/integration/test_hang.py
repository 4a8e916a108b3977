"""A worker that is alive but stuck: the watchdog finds it, names it, and the run heals.

Real supervisor, real MWMS workers: tests/recipes/input_hang.py is digits_cnn whose input
on rank 1 blocks forever (a tf.py_function sleeping in a loop) on attempt 1 only. Every
process stays alive; only the progress watchdog can end attempt 1. The same job run
without the hang is the digits reference run, so the healed run must end with its digest.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from tests.integration.conftest import DIGITS_FLAGS
from tests.integration.harness import run_job

RECIPE = "tests/recipes/input_hang.py"
HANG_TIMEOUT_S = 5


def _ts(record: dict) -> float:
    return dt.datetime.fromisoformat(record["ts"]).timestamp()


def test_a_hung_input_on_rank_1_is_detected_named_and_healed(tmp_path, digits_reference):
    job = run_job(RECIPE, tmp_path / "run", *DIGITS_FLAGS, "--hang-timeout", str(HANG_TIMEOUT_S))
    assert job.returncode == 0, job.output
    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["restarts"], summary["attempts"]) == ("completed", 20, 1, 2)
    assert summary["weights_sha256"] == digits_reference

    [hang] = job.named("hang_detected")
    assert (hang["rank"], hang["attempt"], hang["phase"], hang["timeout_s"]) == (1, 1, "train", HANG_TIMEOUT_S)
    # Detected once the stall is longer than the timeout; the event rounds to 0.1 s, so a
    # stall of 5.04 s reads 5.0 (seen under load): >= is the exact bound, not a looser one.
    assert HANG_TIMEOUT_S <= hang["seconds"] < HANG_TIMEOUT_S + 2
    assert hang["stacks"] == str(tmp_path / "run" / "attempt-1" / "stacks-1.txt")
    assert "input_hang.py" in Path(hang["stacks"]).read_text()
    assert "input_hang.py" in hang["where"] and "_read" in hang["where"]
    reached = [e["global_step"] for e in job.named("attempt_reached") if e["attempt"] == 1]
    assert hang["global_step"] is not None and reached == [max(int(s) for s in hang["steps"].values() if s is not None)]

    states = [(e["from"], e["to"], e["attempt"]) for e in job.named("run_state")]
    assert states == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "hung", 1), ("hung", "stopping", 1),
        ("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "running", 2),
        ("running", "succeeded", 2),
    ]
    assert [(e["attempt"], e["root_cause_rank"]) for e in job.named("gang_restart")] == [(2, 1)]
    root = summary["root_cause"]
    assert (root["rank"], root["type"], root["global_step"], root["stacks"]) == (1, "Hang", hang["global_step"], hang["stacks"])
    assert f"hang: rank 1 made no progress for {hang['seconds']:.0f} s at global step {hang['global_step']}" in job.output

    # The timings the report quotes: last progress -> hang_detected -> killed -> training again.
    [hung] = [e for e in job.named("run_state") if e["to"] == "hung"]
    [first_again] = [e for e in job.named("first_step") if e["attempt"] == 2]
    print(f"\nhang -> hang_detected {_ts(hang) - _ts(hung):.2f} s after HUNG; "
          f"hang_detected -> first step of attempt 2: {_ts(first_again) - _ts(hang):.2f} s; "
          f"seconds without progress at detection {hang['seconds']} s; where: {hang['where']}")
