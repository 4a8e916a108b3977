"""rundir/layout.py: the one place that names run-dir files."""

from __future__ import annotations

from pathlib import Path

import pytest

from resilient_train.rundir.layout import AttemptDir, RunDir, attempt_number


def test_every_file_of_a_run_has_its_documented_name():
    run = RunDir("runs/digits")
    assert [run.events, run.summary, run.run_file, run.fingerprint, run.lock] == [
        Path("runs/digits/events.jsonl"), Path("runs/digits/summary.json"), Path("runs/digits/run.json"),
        Path("runs/digits/fingerprint.json"), Path("runs/digits/supervisor.lock"),
    ]
    assert [run.tensorboard, run.model, run.checkpoints, run.host_cache, run.work_dir(1)] == [
        Path("runs/digits/tensorboard"), Path("runs/digits/model"), Path("runs/digits/checkpoints"),
        Path("runs/digits/local/host-cache"), Path("runs/digits/local/rank-1"),
    ]
    attempt = run.attempt(3)
    assert [attempt.job, attempt.log(1), attempt.error(1), attempt.step_marker(1)] == [
        Path("runs/digits/attempt-3/job.json"), Path("runs/digits/attempt-3/worker-1.log"),
        Path("runs/digits/attempt-3/error-1.json"), Path("runs/digits/attempt-3/step-1.txt"),
    ]
    assert [attempt.phase_marker(1), attempt.stacks(1)] == [
        Path("runs/digits/attempt-3/phase-1.txt"), Path("runs/digits/attempt-3/stacks-1.txt"),
    ]
    assert [attempt.slurm_exit(0), attempt.slurm_term(0)] == [
        Path("runs/digits/attempt-3/slurm-task-0.json"), Path("runs/digits/attempt-3/slurm-term-0"),
    ]


def test_attempts_are_listed_in_numeric_order_and_strays_ignored(tmp_path):
    for name in ("attempt-10", "attempt-2", "attempt-x", "attempt-3.old"):
        (tmp_path / name).mkdir()
    (tmp_path / "attempt-7").write_text("a file, not an attempt")
    run = RunDir(tmp_path)
    assert [a.number for a in run.attempts()] == [2, 10]
    assert run.next_attempt_number() == 11
    assert RunDir(tmp_path / "empty").next_attempt_number() == 1


def test_attempt_dirs_are_recognised_by_name_only():
    assert attempt_number("attempt-12") == 12
    assert attempt_number("attempt-") is None
    assert AttemptDir.at("/r/attempt-4").number == 4
    with pytest.raises(ValueError, match=r"Received attempt dir '/r/logs'; expected a directory named attempt-<n>"):
        AttemptDir.at("/r/logs")
    with pytest.raises(ValueError, match=r"Received attempt=0; expected >= 1"):
        RunDir("/r").attempt(0)
