import hashlib

import pytest

from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stepindices import (StepIndexLog, index_digest, read_step_indices,
                                                 replayed_conflicts)


def test_digest_is_sha256_of_the_comma_joined_indices():
    assert index_digest([17, 3, 1204]) == hashlib.sha256(b"17,3,1204").hexdigest()


def _record(run_dir, attempt, steps):
    path = RunDir(run_dir).attempt(attempt).step_indices
    path.parent.mkdir(parents=True, exist_ok=True)
    log = StepIndexLog(path)
    for step, indices in steps:
        log.write(step, indices)
    log.flush()
    log.close()


def test_attempts_merge_and_a_replayed_step_with_other_indices_is_a_conflict(tmp_path):
    _record(tmp_path, 1, [(1, [0, 1]), (2, [2, 3]), (3, [4, 5])])
    _record(tmp_path, 2, [(3, [4, 5]), (4, [6, 7])])
    assert read_step_indices(tmp_path) == {s: index_digest(i) for s, i in [(1, [0, 1]), (2, [2, 3]), (3, [4, 5]), (4, [6, 7])]}
    assert replayed_conflicts(tmp_path) == []
    _record(tmp_path, 3, [(2, [3, 2])])
    assert read_step_indices(tmp_path)[2] == index_digest([3, 2])  # the later attempt wins
    assert replayed_conflicts(tmp_path) == [2]


def test_a_closed_log_writes_nothing(tmp_path):
    log = StepIndexLog(None)
    log.write(1, [1])
    log.flush()
    assert read_step_indices(tmp_path) == {}


def test_a_malformed_line_is_named(tmp_path):
    path = RunDir(tmp_path).attempt(1).step_indices
    path.parent.mkdir()
    path.write_text("1 abc\nbad\n")
    with pytest.raises(ValueError, match=r"step-indices.txt:2: 'bad' is not '<global step> <sha256>'"):
        read_step_indices(tmp_path)
