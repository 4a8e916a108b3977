"""rundir/atomic.py: a reader sees the old file or the new one; temporaries are recognisable."""

from __future__ import annotations

import pytest

from resilient_train.rundir.atomic import is_temporary, replacing, write_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "summary.json"
    write_atomic(target, "first\n")
    write_atomic(target, b"second\n", fsync=True)
    assert target.read_bytes() == b"second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with replacing(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk on fire")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_temporaries_are_named_so_copiers_can_skip_them(tmp_path):
    with replacing(tmp_path / "events.out.tfevents.1.host") as tmp:
        assert is_temporary(tmp.name)
        tmp.write_bytes(b"x")
    assert not is_temporary("events.out.tfevents.1.host")
    assert not is_temporary("worker-0.log")
