"""Retention alone: what it deletes from a listing, through the commit path's ``delete``."""

from __future__ import annotations

import pytest

from resilient_train.checkpoint.manifest import FileEntry, Manifest
from resilient_train.checkpoint.read_path import CheckpointInfo, Status
from resilient_train.checkpoint.retention import Retention


def info(step: int, status: Status) -> CheckpointInfo:
    manifest = None if status is Status.UNCOMMITTED else Manifest(
        schema_version=1, run_id="r", epoch=0, step_in_epoch=step, global_step=step, world_size=1,
        tf_version="2.21.0", created_at="2026-01-01T00:00:00Z", files={"a": FileEntry(size=1, sha256="0" * 64)},
        weights_sha256="1" * 64)
    return CheckpointInfo(step, f"mem://ckpt/{step}", manifest, status, "", 1)


LISTING = [info(2, Status.UNCOMMITTED), info(4, Status.OK), info(6, Status.CORRUPT), info(8, Status.OK),
           info(10, Status.OK), info(12, Status.UNCOMMITTED)]


def retention() -> tuple[Retention, list[int], list[tuple[str, dict]]]:
    deleted: list[int] = []
    emitted: list[tuple[str, dict]] = []
    by_step = {i.global_step: i for i in LISTING}
    scan = lambda: {step: {"a": 1} for step in by_step}  # noqa: E731
    keeper = Retention(scan, lambda step, files: by_step[step], deleted.append, lambda e, **f: emitted.append((e, f)))
    return keeper, deleted, emitted


def test_retain_deletes_only_good_checkpoints_older_than_the_newest_keep():
    keeper, deleted, emitted = retention()
    assert keeper.retain(2) == ["mem://ckpt/4"]
    assert (deleted, emitted) == ([4], [])
    with pytest.raises(ValueError, match="Received keep=0; expected an int >= 1"):
        keeper.retain(0)


def test_garbage_is_uncommitted_and_older_than_the_newest_good_commit():
    keeper, deleted, emitted = retention()
    assert keeper.collect_garbage() == ["mem://ckpt/2"]
    assert deleted == [2]  # 12 may be an upload in progress; 6 is corrupt: verify reports it
    assert emitted == [("garbage_collected", {"group": True, "paths": ["mem://ckpt/2"], "count": 1})]
