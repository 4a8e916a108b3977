"""OWNER.json and the generation each attempt's chief claims (supervisor/ownership.py)."""

from __future__ import annotations

import json

import pytest

from resilient_train.checkpoint import CheckpointStore
from resilient_train.errors import StorageOwnedError
from resilient_train.supervisor.ownership import OWNER_NAME, claim_storage, generation_for


class Events(list):
    def __call__(self, event, **fields):
        self.append({"event": event, **fields})


def store_at(tmp_path) -> CheckpointStore:
    store = CheckpointStore(str(tmp_path / "storage"), emit=Events())
    store.check()
    return store


def claim(store, run_id, *, force=False, emit=None):
    claim_storage(store, run_id=run_id, run_dir=f"/runs/{run_id}", force=force, emit=emit if emit is not None else Events(),
                  clock=lambda: "2026-11-23T10:00:00+00:00")


def test_the_first_run_claims_the_storage_and_re_runs_are_silent(tmp_path):
    store, events = store_at(tmp_path), Events()
    claim(store, "run-a", emit=events)
    claim(store, "run-a", emit=events)
    assert events == [{"event": "storage_claimed", "storage": store.url, "previous_run_id": None,
                       "previous_run_dir": None, "forced": False}]
    owner = json.loads((tmp_path / "storage" / OWNER_NAME).read_text())
    assert (owner["run_id"], owner["run_dir"], owner["claimed_at"]) == ("run-a", "/runs/run-a", "2026-11-23T10:00:00+00:00")


def test_another_run_is_refused_naming_the_owner_and_the_way_out(tmp_path):
    store = store_at(tmp_path)
    claim(store, "run-a")
    with pytest.raises(StorageOwnedError) as info:
        claim(store, "run-b")
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"checkpoint storage {store.url} belongs to run run-a (run dir /runs/run-a on ")
    assert lines[0].endswith(", not to this run (run-b).")
    assert lines[1] == "Pass --force-storage to take it over (its checkpoints become this run's), or use another --storage."
    assert json.loads((tmp_path / "storage" / OWNER_NAME).read_text())["run_id"] == "run-a"


def test_force_takes_the_storage_over_with_an_event(tmp_path):
    store, events = store_at(tmp_path), Events()
    claim(store, "run-a")
    claim(store, "run-b", force=True, emit=events)
    assert events == [{"event": "storage_claimed", "storage": store.url, "previous_run_id": "run-a",
                       "previous_run_dir": "/runs/run-a", "forced": True}]
    assert json.loads((tmp_path / "storage" / OWNER_NAME).read_text())["run_id"] == "run-b"


def test_an_unreadable_owner_file_is_refused_too(tmp_path):
    store = store_at(tmp_path)
    (tmp_path / "storage" / OWNER_NAME).write_text("{torn")
    with pytest.raises(StorageOwnedError, match="belongs to run <unreadable OWNER.json>, not to this run"):
        claim(store, "run-b")


def test_the_generation_is_the_attempt_unless_the_storage_already_went_further(tmp_path):
    store = store_at(tmp_path)
    assert generation_for(store, 1) == 1
    store.claim_generation(1, run_id="run-a", attempt=1)
    assert generation_for(store, 2) == 2
    CheckpointStore(store.url, emit=Events()).claim_generation(6, run_id="run-a", attempt=6)
    assert generation_for(store, 1) == 7  # a take-over starts above the previous run's generations
    assert generation_for(store, 9) == 9
