"""Sharded saves, store side: the assignment, the choice, and a commit whose files come from
several writers (checkpoint/shares.py, CommitPath.upload_share / wait_for_shares).

The TensorFlow side (the data files are one standard checkpoint) is
tests/runner/state/test_sharded_save.py; the real 2-worker run, tests/integration/test_sharded_save.py.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from resilient_train.checkpoint import Status
from resilient_train.checkpoint import commit_path as commit_module
from resilient_train.checkpoint.manifest import sha256_file
from resilient_train.checkpoint.shares import (
    SHARD_AUTO_MIN_BYTES,
    SHARDED_EXTRA_KEY,
    assign_shares,
    choose_sharded_save,
    data_file_name,
    plan_read_once,
    share_record_name,
)
from resilient_train.errors import CheckpointCorruptError, StaleWriterError, StorageUnavailableError
from tests.support.storage import WEIGHTS, Backend


# ------------------------------------------------------------------ assignment


def test_shares_are_balanced_by_bytes_and_the_same_for_every_caller():
    sizes = [(f"model/layer_{i}/kernel", 4096) for i in range(6)] + [(f"model/layer_{i}/bias", 64) for i in range(6)]
    sizes.append(("_CHECKPOINTABLE_OBJECT_GRAPH", 0))
    shares = assign_shares(sizes, 2, pinned=["_CHECKPOINTABLE_OBJECT_GRAPH"])
    assert assign_shares(list(reversed(sizes)), 2, pinned=["_CHECKPOINTABLE_OBJECT_GRAPH"]) == tuple(
        tuple(reversed(share)) for share in shares)  # same owners whatever the order given
    loads = [sum(dict(sizes)[key] for key in share) for share in shares]
    assert loads == [12_480, 12_480]
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in shares[0]
    assert sorted(itertools.chain(*shares)) == sorted(key for key, _ in sizes)


def test_largest_first_into_the_lightest_share():
    assert assign_shares([("a", 10), ("b", 7), ("c", 5), ("d", 3)], 2) == (("a", "d"), ("b", "c"))
    assert assign_shares([("a", 1), ("b", 1), ("c", 1)], 3) == (("a",), ("b",), ("c",))


def test_a_share_that_would_be_empty_is_refused():
    with pytest.raises(ValueError, match="Received 2 tensors for 3 shares; share 2 would be empty"):
        assign_shares([("a", 1), ("b", 1)], 3)
    with pytest.raises(ValueError, match="Received shares=0; expected an int >= 1"):
        assign_shares([("a", 1)], 0)


def test_data_file_names_are_tensorflows():
    assert data_file_name("ckpt", 1, 2) == "ckpt.data-00001-of-00002"
    assert share_record_name(3) == "share-00003.json"
    with pytest.raises(ValueError, match="Received shard=2 of shards=2"):
        data_file_name("ckpt", 2, 2)


@pytest.mark.parametrize(("setting", "state_bytes", "workers", "async_twin", "sharded", "reason"), [
    ("off", 10 * SHARD_AUTO_MIN_BYTES, 4, True, False, "--sharded-save off"),
    ("on", 1000, 2, True, True, "--sharded-save on"),
    ("on", 1000, 1, True, False, "one worker: nothing to split"),
    ("auto", SHARD_AUTO_MIN_BYTES - 1, 4, True, False,
     f"state of {SHARD_AUTO_MIN_BYTES - 1} bytes < {SHARD_AUTO_MIN_BYTES} (auto's threshold): the chief alone is faster"),
    ("auto", SHARD_AUTO_MIN_BYTES, 4, True, True, f"state of {SHARD_AUTO_MIN_BYTES} bytes >= {SHARD_AUTO_MIN_BYTES}"),
    ("auto", SHARD_AUTO_MIN_BYTES, 4, False, False,
     "the shares are written from the async checkpointer's twin (sync checkpoints have none)"),
])
def test_the_choice_and_its_reason(setting, state_bytes, workers, async_twin, sharded, reason):
    choice = choose_sharded_save(setting, state_bytes=state_bytes, num_workers=workers, tensors=10,
                                 async_twin=async_twin)
    assert (choice.sharded, choice.shards, choice.reason) == (sharded, workers if sharded else 1, reason)


# ------------------------------------------------------------------ the commit


def _stage(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    path = tmp_path / name / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    for rel, data in files.items():
        (path / rel).write_bytes(data)
    return path


SHARE_1 = data_file_name("ckpt", 1, 2)
CHIEF_FILES = {"ckpt.index": b"index" * 20, data_file_name("ckpt", 0, 2): b"zero" * 500}
WORKER_BYTES = b"one!" * 500


WRITERS = {SHARDED_EXTRA_KEY: {"shards": 2, "writers": {data_file_name("ckpt", 0, 2): 0, SHARE_1: 1}}}


def _sharded_commit(backend: Backend, chief, worker, *, step: int, worker_bytes: bytes = WORKER_BYTES,
                    upload: bool = True):
    staged_share = _stage(backend.tmp_path, f"w-{step}", {SHARE_1: worker_bytes})
    copy = _stage(backend.tmp_path, f"x-{step}", {SHARE_1: WORKER_BYTES}) / SHARE_1  # the chief's copy
    expected = {1: {SHARE_1: sha256_file(copy)}}
    if upload:
        worker.upload_share({SHARE_1: staged_share / SHARE_1}, global_step=step, rank=1)
    return chief.commit(
        _stage(backend.tmp_path, f"c-{step}", CHIEF_FILES), run_id="run-1", epoch=0, step_in_epoch=step,
        global_step=step, world_size=2, weights_sha256=WEIGHTS, tf_version="2.21.0", shares=[SHARE_1],
        extra=WRITERS, before_manifest=lambda: chief.wait_for_shares(step, expected, copies={SHARE_1: copy},
                                                                     timeout_s=5.0))


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3)])
def two_writers(request, tmp_path):
    if request.param == "s3":
        target = request.getfixturevalue("s3_server")
        backend = Backend("s3", target.url_prefix, target.storage_options, tmp_path)
    else:
        base = f"memory://rt-tests/{tmp_path.name}" if request.param == "memory" else str(tmp_path / "store")
        backend = Backend(request.param, base, {}, tmp_path)
    url = backend.new_url()
    chief = backend.store(url)
    chief.claim_generation(1, run_id="run-1", attempt=1)
    worker = backend.store(url)
    worker.adopt_generation(1, run_id="run-1", attempt=1)
    return backend, chief, worker


def test_a_checkpoint_written_by_two_writers_is_one_committed_checkpoint(two_writers):
    backend, chief, worker = two_writers
    manifest = _sharded_commit(backend, chief, worker, step=10)
    assert sorted(manifest.files) == ["ckpt.data-00000-of-00002", SHARE_1, "ckpt.index"]
    assert manifest.files[SHARE_1].size == len(WORKER_BYTES)
    (info,) = chief.verify(10)
    assert (info.status, info.detail) == (Status.OK, "")
    manifest_again, local = chief.fetch(10, backend.tmp_path / "cache")
    assert (local / SHARE_1).read_bytes() == WORKER_BYTES and manifest_again == manifest


def test_a_share_with_other_bytes_than_the_chiefs_is_replaced_by_the_chiefs_copy(two_writers):
    backend, chief, worker = two_writers
    manifest = _sharded_commit(backend, chief, worker, step=10, worker_bytes=b"two!" * 500)
    assert [(e["global_step"], e["shard"], e["files"]) for e in backend.events.named("checkpoint_share_replaced")] == [
        (10, 1, [SHARE_1])]
    (info,) = chief.verify(10)
    assert (info.status, info.detail) == (Status.OK, "")
    _, local = chief.fetch(10, backend.tmp_path / "cache")
    assert (local / SHARE_1).read_bytes() == WORKER_BYTES and manifest.files[SHARE_1].size == len(WORKER_BYTES)


def test_a_share_that_never_arrives_fails_the_commit_without_a_manifest(two_writers, monkeypatch):
    backend, chief, worker = two_writers
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr(commit_module, "_monotonic", lambda: next(clock))
    monkeypatch.setattr(commit_module.time, "sleep", lambda seconds: None)
    with pytest.raises(StorageUnavailableError, match=r"no share from worker\(s\) \[1\] within 5 s"):
        _sharded_commit(backend, chief, worker, step=10, upload=False)
    assert [info.status for info in chief.list()] == [Status.UNCOMMITTED]


def test_a_record_left_by_an_earlier_attempt_is_not_taken(two_writers, monkeypatch):
    backend, chief, worker = two_writers
    earlier = backend.store(chief.url)  # unfenced: its record names no generation, the chief's names 1
    staged = _stage(backend.tmp_path, "old", {SHARE_1: WORKER_BYTES})
    earlier.upload_share({SHARE_1: staged / SHARE_1}, global_step=10, rank=1)
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr(commit_module, "_monotonic", lambda: next(clock))
    monkeypatch.setattr(commit_module.time, "sleep", lambda seconds: None)
    with pytest.raises(StorageUnavailableError, match=r"no share from worker\(s\) \[1\]"):
        _sharded_commit(backend, chief, worker, step=10, upload=False)


def test_a_superseded_worker_cannot_upload_its_share(two_writers):
    backend, chief, worker = two_writers
    backend.store(chief.url).claim_generation(2, run_id="run-1", attempt=2)
    staged = _stage(backend.tmp_path, "late", {SHARE_1: WORKER_BYTES})
    with pytest.raises(StaleWriterError, match="superseded by generation 2"):
        worker.upload_share({SHARE_1: staged / SHARE_1}, global_step=10, rank=1)
    assert chief.list() == []


def test_a_sharded_step_committed_again_with_the_same_bytes_replaces_only_its_manifest(two_writers):
    backend, chief, worker = two_writers
    first = _sharded_commit(backend, chief, worker, step=10)
    again = _sharded_commit(backend, chief, worker, step=10)  # the worker confirms its committed share
    assert again.files == first.files
    (info,) = chief.verify(10)
    assert info.status is Status.OK


def test_a_commit_refuses_shares_in_its_own_directory_or_without_their_entries(two_writers):
    backend, chief, _ = two_writers
    with pytest.raises(ValueError, match="expected files from other writers only"):
        chief.commit(_stage(backend.tmp_path, "both", CHIEF_FILES), run_id="run-1", epoch=0, step_in_epoch=1,
                     global_step=1, world_size=2, weights_sha256=WEIGHTS, tf_version="2.21.0", shares=[SHARE_1])


def test_verify_names_a_corrupted_share_and_its_writer(two_writers):
    backend, chief, worker = two_writers
    _sharded_commit(backend, chief, worker, step=10)
    fs, root = backend.raw_fs(chief)
    fs.pipe_file(f"{root}/ckpt-000000000010/{SHARE_1}", b"ONE!" * 500)  # same size, other bytes
    (info,) = chief.verify(10)
    assert (info.status, info.detail) == (Status.CORRUPT, f"sha256 mismatch in {SHARE_1} (its share's writer: worker 1)")


def test_the_chief_gives_up_waiting_when_a_rescue_is_asked(two_writers):
    backend, chief, _ = two_writers
    copy = _stage(backend.tmp_path, "copy", {SHARE_1: WORKER_BYTES}) / SHARE_1
    with pytest.raises(StorageUnavailableError, match=r"gave up waiting for worker\(s\) \[1\]: a rescue was asked"):
        chief.wait_for_shares(10, {1: {SHARE_1: sha256_file(copy)}}, copies={SHARE_1: copy}, timeout_s=600.0,
                              give_up=lambda: "a rescue was asked")


# ------------------------------------------------------------------ read-once restore


def _sizes(shards: int) -> dict[str, int]:
    return {"ckpt.index": 100, "callbacks.json": 10, **{data_file_name("ckpt", k, shards): 1000 + k for k in range(shards)}}


def test_read_once_gives_each_share_to_one_rank_and_the_small_files_to_all():
    plan, reason = plan_read_once({SHARDED_EXTRA_KEY: {"shards": 2}}, _sizes(2), workers=2)
    assert plan is not None and reason == "2 shares read once by 2 of 2 workers"
    assert plan.owners == ((data_file_name("ckpt", 0, 2), 0), (data_file_name("ckpt", 1, 2), 1))
    assert plan.common == ("callbacks.json", "ckpt.index")
    assert plan.others(0) == {data_file_name("ckpt", 1, 2)} and plan.others(1) == {data_file_name("ckpt", 0, 2)}
    assert [plan.store_bytes(_sizes(2), rank) for rank in (0, 1)] == [1110, 1111]
    # Every byte of the data files read once; the small files once per rank.
    assert sum(plan.store_bytes(_sizes(2), rank) for rank in (0, 1)) == sum(_sizes(2).values()) + 110


@pytest.mark.parametrize(("shards", "workers", "owners"), [(4, 2, [0, 1, 0, 1]), (2, 3, [0, 1])])
def test_read_once_restores_on_another_number_of_workers(shards, workers, owners):
    plan, reason = plan_read_once({SHARDED_EXTRA_KEY: {"shards": shards}}, _sizes(shards), workers=workers)
    assert plan is not None and [owner for _, owner in plan.owners] == owners
    assert reason == f"{shards} shares read once by {min(shards, workers)} of {workers} workers"


@pytest.mark.parametrize(("extra", "files", "workers", "reason"), [
    ({}, _sizes(2), 2, "not a sharded checkpoint"),
    ({SHARDED_EXTRA_KEY: {"shards": 2}}, _sizes(2), 1, "one worker: nothing to share"),
    ({SHARDED_EXTRA_KEY: {"shards": 1}}, _sizes(1), 2, f"the manifest's {SHARDED_EXTRA_KEY} record names shards=1"),
    ({SHARDED_EXTRA_KEY: {"shards": 3}}, _sizes(2), 2, "the manifest lists no ckpt.data-00000-of-00003"),
])
def test_read_once_is_refused_with_its_reason(extra, files, workers, reason):
    assert plan_read_once(extra, files, workers=workers) == (None, reason)


def test_a_partial_fetch_downloads_only_what_is_not_skipped(two_writers):
    backend, chief, worker = two_writers
    manifest = _sharded_commit(backend, chief, worker, step=10)
    reader = backend.store(chief.url)
    part = reader.fetch_part(manifest, backend.tmp_path / "cache", skip=frozenset({SHARE_1}))
    assert (part.source, part.missing, part.whole) == ("read_once", {SHARE_1}, False)
    assert sorted(p.name for p in part.path.iterdir()) == ["ckpt.data-00000-of-00002", "ckpt.index"]
    assert reader.bytes_downloaded == part.store_bytes == manifest.total_size - len(WORKER_BYTES)
    (part.path / SHARE_1).write_bytes(WORKER_BYTES)  # what the peer sends
    got, local = reader.complete(part)
    assert got == manifest and (local / SHARE_1).read_bytes() == WORKER_BYTES and not part.path.exists()
    # The private copy now serves whole, and nothing more is read.
    again = reader.fetch_part(manifest, backend.tmp_path / "cache", skip=frozenset({SHARE_1}))
    assert (again.source, again.whole, again.path, reader.bytes_downloaded) == (
        "local_cache", True, local, part.store_bytes)


def test_a_file_a_peer_sent_wrong_is_refused_and_nothing_installed(two_writers):
    backend, chief, worker = two_writers
    manifest = _sharded_commit(backend, chief, worker, step=10)
    reader = backend.store(chief.url)
    part = reader.fetch_part(manifest, backend.tmp_path / "cache", skip=frozenset({SHARE_1}))
    (part.path / SHARE_1).write_bytes(b"ONE!" * 500)
    with pytest.raises(CheckpointCorruptError, match=f"sha256 mismatch in {SHARE_1} \\(as its peer sent it\\)"):
        reader.complete(part)
    assert not (backend.tmp_path / "cache" / "ckpt-000000000010").exists() and not part.path.exists()


def test_a_partial_fetch_of_a_corrupt_own_share_fails_and_leaves_nothing(two_writers):
    backend, chief, worker = two_writers
    manifest = _sharded_commit(backend, chief, worker, step=10)
    fs, root = backend.raw_fs(chief)
    fs.pipe_file(f"{root}/ckpt-000000000010/{SHARE_1}", b"ONE!" * 500)
    reader = backend.store(chief.url)
    # Rank 0 does not read share 1: its part is fine; rank 1's fails on its own share.
    fine = reader.fetch_part(manifest, backend.tmp_path / "r0", skip=frozenset({SHARE_1}))
    reader.discard(fine)
    assert not fine.path.exists()
    with pytest.raises(CheckpointCorruptError, match=f"sha256 mismatch in {SHARE_1}"):
        reader.fetch_part(manifest, backend.tmp_path / "r1", skip=frozenset({data_file_name("ckpt", 0, 2)}))
    assert list((backend.tmp_path / "r1").iterdir()) == []
