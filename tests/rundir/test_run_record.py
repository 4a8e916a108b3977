"""run.json: the run id is created once, atomically, and kept across re-runs."""

from __future__ import annotations

import json

from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.run_record import load_or_create_run_id


def test_the_first_call_creates_the_id_and_later_calls_keep_it(tmp_path):
    run_dir = RunDir(tmp_path)
    ids = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    assert load_or_create_run_id(run_dir, recipe="recipes/x.py", new_id=lambda: next(ids)) == "aaaaaaaaaaaa"
    assert json.loads(run_dir.run_file.read_text()) == {"run_id": "aaaaaaaaaaaa", "recipe": "recipes/x.py"}
    assert load_or_create_run_id(run_dir, recipe="recipes/other.py", new_id=lambda: next(ids)) == "aaaaaaaaaaaa"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary left behind


def test_an_unreadable_record_is_replaced_by_a_new_id(tmp_path):
    run_dir = RunDir(tmp_path)
    run_dir.run_file.write_text('{"run_id": "tor')
    assert load_or_create_run_id(run_dir, recipe="r", new_id=lambda: "cccccccccccc") == "cccccccccccc"
    run_dir.run_file.write_text('{"recipe": "r"}')
    assert load_or_create_run_id(run_dir, recipe="r", new_id=lambda: "dddddddddddd") == "dddddddddddd"
    assert json.loads(run_dir.run_file.read_text())["run_id"] == "dddddddddddd"


def test_a_default_id_is_twelve_hex_digits(tmp_path):
    run_id = load_or_create_run_id(RunDir(tmp_path), recipe="r")
    assert len(run_id) == 12 and int(run_id, 16) >= 0
