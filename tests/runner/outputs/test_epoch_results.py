"""An epoch's results through the manifest's extra, and the event-log check a restore makes
(runner/outputs/epoch_results.py); the kills themselves: tests/integration/test_epoch_ends.py."""

from __future__ import annotations

import json

import pytest

from resilient_train.rundir.events import EventFile
from resilient_train.runner.outputs.epoch_results import EXTRA_KEY, EpochResults, already_reported

VALIDATION = {"val_loss": 0.1 + 0.2, "val_metrics": {"mae": 1 / 3}, "val_examples": 3}


def test_the_numbers_read_back_from_the_manifest_json_are_the_same_floats():
    results = EpochResults(epoch=1, global_step=20, loss=0.1 + 0.7, metrics={"mae": 2 / 3}, validation=VALIDATION)
    extra = json.loads(json.dumps(results.to_extra()))  # as MANIFEST.json stores it
    assert EpochResults.from_extra(extra) == results
    assert EpochResults.from_extra(extra).event_fields() == {
        "epoch": 1, "global_step": 20, "loss": 0.1 + 0.7, "metrics": {"mae": 2 / 3}, **VALIDATION}


def test_a_validation_run_after_the_save_takes_the_place_of_the_missing_one():
    results = EpochResults(epoch=0, global_step=10, loss=1.5)
    assert results.event_fields() == {"epoch": 0, "global_step": 10, "loss": 1.5, "metrics": {}}
    assert results.event_fields(VALIDATION)["val_loss"] == VALIDATION["val_loss"]
    assert EpochResults(epoch=0, global_step=10, loss=1.5, validation={}).event_fields() == results.event_fields()


def test_a_checkpoint_without_results_carries_none():
    assert EpochResults.from_extra({"epoch_sums": {}}) is None
    assert EpochResults.from_extra({EXTRA_KEY: None}) is None


@pytest.mark.parametrize("bad", [-1, True, 1.0])
def test_a_bad_step_is_refused(bad):
    with pytest.raises(ValueError, match="global_step"):
        EpochResults(epoch=0, global_step=bad, loss=None)


def test_already_reported_is_this_runs_event_of_that_epoch_at_that_step(tmp_path):
    path = tmp_path / "events.jsonl"
    assert not already_reported(path, run_id="r1", epoch=0, global_step=10)  # no log yet
    log = EventFile(path)
    log.append({"event": "checkpoint_committed", "run_id": "r1", "epoch": 1, "global_step": 10})
    log.append({"event": "epoch_finished", "run_id": "r0", "epoch": 0, "global_step": 10})  # another run's
    log.append({"event": "epoch_finished", "run_id": "r1", "epoch": 0, "global_step": 12})  # another epoch length
    assert not already_reported(path, run_id="r1", epoch=0, global_step=10)
    log.append({"event": "epoch_finished", "run_id": "r1", "epoch": 0, "global_step": 10})
    assert already_reported(path, run_id="r1", epoch=0, global_step=10)
    with open(path, "ab") as handle:  # a torn last line (a killed writer) is not a report
        handle.write(b'{"event": "epoch_finished", "run_id": "r1", "epoch": 1, "glob')
    assert not already_reported(path, run_id="r1", epoch=1, global_step=20)
