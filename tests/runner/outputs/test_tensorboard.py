"""TensorBoardLog fed with events in-process: tags, steps, and the cut after a kill."""

import pytest

pytest.importorskip("tensorflow")
from resilient_train.runner.outputs.tensorboard import TensorBoardLog, read_scalars, truncate_event_files  # noqa: E402


def progress(step, loss):
    return {"event": "train_progress", "epoch": 0, "step_in_epoch": step, "steps_per_epoch": 10,
            "global_step": step, "steps_per_s": 5.0, "steps_per_call": 4, "loss": loss, "accuracy": 0.5, "attempt": 1, "rank": 0}


def test_scalars_come_from_the_events(tmp_path):
    log = TensorBoardLog(tmp_path)
    log({"event": "fresh_start", "global_step": 0, "attempt": 1})
    log(progress(1, 2.0))
    log({"event": "checkpoint_committed", "global_step": 1, "commit_s": 0.25, "blocked_ms": 3.0})
    log({"event": "epoch_finished", "epoch": 0, "global_step": 2, "loss": 1.5, "metrics": {"accuracy": 0.75},
         "val_loss": 1.25, "val_metrics": {"accuracy": 0.5}, "val_examples": 9})
    log({"event": "worker_started", "global_step": 99})  # not a scalar
    log.close()
    assert read_scalars(tmp_path) == {
        "run/restarts": [(0, 0.0)],
        "train/loss": [(1, 2.0)],
        "train/accuracy": [(1, 0.5)],
        "perf/steps_per_s": [(1, 5.0)],
        "perf/steps_per_call": [(1, 4.0)],
        "checkpoint/commit_s": [(1, 0.25)],
        "checkpoint/blocked_ms": [(1, 3.0)],
        "epoch/loss": [(2, 1.5)],
        "eval/loss": [(2, 1.25)],
        "epoch/accuracy": [(2, 0.75)],
        "eval/accuracy": [(2, 0.5)],
    }


def test_resume_drops_the_dead_attempts_steps_past_the_restored_one(tmp_path):
    dead = TensorBoardLog(tmp_path)
    dead({"event": "fresh_start", "global_step": 0, "attempt": 1})
    for step in range(1, 8):
        dead(progress(step, float(step)))
    # killed: never closed, and a torn half record at the end of its file
    (only_file,) = tmp_path.iterdir()
    with open(only_file, "ab") as handle:
        handle.write(b"\x20\x00\x00\x00\x00\x00\x00\x00\x01\x02")

    resumed = TensorBoardLog(tmp_path)
    resumed({"event": "restored", "global_step": 4, "attempt": 2})
    for step in range(5, 10):
        resumed(progress(step, float(step)))
    resumed.close()
    scalars = read_scalars(tmp_path)
    assert scalars["train/loss"] == [(step, float(step)) for step in range(1, 10)]
    assert scalars["run/restarts"] == [(0, 0.0), (4, 1.0)]
    assert len(list(tmp_path.iterdir())) == 2


def test_restoring_the_same_step_twice_keeps_one_restart_marker_per_step(tmp_path):
    for attempt in (1, 2, 3):
        log = TensorBoardLog(tmp_path)
        log({"event": "restored" if attempt > 1 else "fresh_start", "global_step": 0 if attempt == 1 else 3,
             "attempt": attempt})
        log(progress(4, 4.0))
        log.close()
    scalars = read_scalars(tmp_path)
    assert scalars["run/restarts"] == [(0, 0.0), (3, 2.0)]
    assert scalars["train/loss"] == [(4, 4.0)]


def test_truncating_nothing_leaves_files_untouched(tmp_path):
    log = TensorBoardLog(tmp_path)
    log(progress(1, 1.0))
    log.close()
    (path,) = tmp_path.iterdir()
    before = path.stat().st_mtime_ns
    assert truncate_event_files(tmp_path, 5) == 0
    assert path.stat().st_mtime_ns == before
