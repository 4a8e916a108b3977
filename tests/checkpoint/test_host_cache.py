"""The host cache: write-through on commit, verified reads, fallback to shared storage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from resilient_train.checkpoint import CheckpointStore
from resilient_train.checkpoint.manifest import sha256_file

FILES = {"ckpt.index": b"index-bytes" * 10, "ckpt.data-00000-of-00001": bytes(range(256)) * 64}


def _stage(root: Path, step: int) -> Path:
    staging = root / "staging" / f"ckpt-{step:012d}"
    staging.mkdir(parents=True)
    for rel, data in FILES.items():
        (staging / rel).write_bytes(data + bytes([step]))
    return staging


def _commit(store: CheckpointStore, root: Path, step: int):
    return store.commit(_stage(root, step), run_id="r", epoch=0, step_in_epoch=step, global_step=step,
                        world_size=2, weights_sha256="0" * 64, tf_version="x")


@pytest.fixture
def stores(tmp_path):
    events: list[tuple[str, dict[str, Any]]] = []
    emit = lambda event, **fields: events.append((event, fields))  # noqa: E731
    # Shared storage that is not the staging disk (as S3 or an NFS mount would be): the
    # fault-injecting filesystem, with no faults, in front of a local directory. (A store on
    # the staging disk itself gets hard links: the last tests.)
    shared = f"faulty://{tmp_path / 'shared'}"
    chief = CheckpointStore(shared, host_cache=tmp_path / "host-cache", emit=emit)
    reader = CheckpointStore(shared, host_cache=tmp_path / "host-cache", emit=emit)
    return chief, reader, events, tmp_path


def _fetched(events):
    return [f["source"] for e, f in events if e == "checkpoint_fetched"]


def test_commit_writes_through_and_keeps_only_the_newest(stores):
    chief, _, _, tmp = stores
    _commit(chief, tmp, 5)
    manifest = _commit(chief, tmp, 10)
    assert sorted(p.name for p in (tmp / "host-cache").iterdir()) == ["ckpt-000000000010"]
    cached = tmp / "host-cache" / "ckpt-000000000010"
    assert {rel: sha256_file(cached / rel) for rel in manifest.files} == manifest.files


def test_a_restart_restores_from_the_host_cache_without_downloading(stores, monkeypatch):
    chief, reader, events, tmp = stores
    manifest = _commit(chief, tmp, 10)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded from shared storage")

    monkeypatch.setattr(reader._reader, "_download", no_download)  # the bytes must come from the cache
    got, local = reader.restore_latest(tmp / "rank-1" / "cache")
    assert got == manifest and _fetched(events) == ["host_cache"]
    assert {rel: sha256_file(local / rel) for rel in manifest.files} == manifest.files


def test_a_corrupt_host_cache_copy_is_rejected_and_shared_storage_used(stores):
    chief, reader, events, tmp = stores
    manifest = _commit(chief, tmp, 10)
    data = tmp / "host-cache" / "ckpt-000000000010" / "ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # same size, different bytes: only the sha256 can tell
    data.write_bytes(bytes(raw))
    got, local = reader.restore_latest(tmp / "rank-1" / "cache")
    assert got == manifest
    assert [(f["path"], f["reason"]) for e, f in events if e == "cache_rejected"] == [
        (str(data.parent), "sha256 mismatch in ckpt.data-00000-of-00001")
    ]
    assert _fetched(events) == ["shared"]
    assert {rel: sha256_file(local / rel) for rel in manifest.files} == manifest.files  # the correct digest


def test_a_missing_host_cache_falls_back_silently(stores):
    chief, reader, events, tmp = stores
    _commit(chief, tmp, 10)
    for path in (tmp / "host-cache").rglob("*"):
        if path.is_file():
            path.unlink()
    (tmp / "host-cache" / "ckpt-000000000010").rmdir()
    reader.restore_latest(tmp / "rank-1" / "cache")
    assert _fetched(events) == ["shared"]
    assert not [e for e, _ in events if e == "cache_rejected"]


def test_a_corrupt_private_cache_copy_is_rejected_too(stores):
    chief, reader, events, tmp = stores
    _commit(chief, tmp, 10)
    cache = tmp / "rank-1" / "cache"
    reader.restore_latest(cache)  # from the host cache
    (cache / "ckpt-000000000010" / "ckpt.index").write_bytes(b"x" * 111)  # 111 bytes = the right size
    for path in (tmp / "host-cache").iterdir():
        shutil.rmtree(path)
    reader.restore_latest(cache)
    assert _fetched(events) == ["host_cache", "shared"]
    assert [f["reason"] for e, f in events if e == "cache_rejected"] == ["sha256 mismatch in ckpt.index"]


def test_without_a_host_cache_nothing_is_written_locally(tmp_path):
    store = CheckpointStore(str(tmp_path / "shared"), emit=lambda *a, **k: None)
    _commit(store, tmp_path, 3)
    assert not (tmp_path / "host-cache").exists()


def test_a_store_on_the_staging_disk_gets_links_not_copies(tmp_path):
    store = CheckpointStore(str(tmp_path / "shared"), host_cache=tmp_path / "host-cache", emit=lambda *a, **k: None)
    manifest = _commit(store, tmp_path, 10)
    staged = tmp_path / "staging" / "ckpt-000000000010"
    for rel in FILES:
        names = [staged / rel, tmp_path / "shared" / "ckpt-000000000010" / rel,
                 tmp_path / "host-cache" / "ckpt-000000000010" / rel]
        assert len({(p.stat().st_dev, p.stat().st_ino) for p in names}) == 1, rel  # one inode, three names
    assert manifest.files == {rel: sha256_file(staged / rel) for rel in FILES}
    assert {rel: sha256_file(tmp_path / "shared" / "ckpt-000000000010" / rel) for rel in FILES} == manifest.files


def test_a_linked_recommit_never_writes_into_the_inode_other_names_share(tmp_path):
    store = CheckpointStore(str(tmp_path / "shared"), emit=lambda *a, **k: None)
    _commit(store, tmp_path, 10)
    committed = tmp_path / "shared" / "ckpt-000000000010" / "ckpt.index"
    kept = tmp_path / "kept-name"
    os.link(committed, kept)  # e.g. a reader's cache linked to the committed file
    before = kept.read_bytes()
    shutil.rmtree(tmp_path / "staging")
    staging = tmp_path / "staging" / "ckpt-000000000010"
    staging.mkdir(parents=True)
    for rel, data in FILES.items():
        (staging / rel).write_bytes(b"other " + data)
    manifest = store.commit(staging, run_id="r", epoch=0, step_in_epoch=10, global_step=10, world_size=2,
                            weights_sha256="0" * 64, tf_version="x")
    assert kept.read_bytes() == before  # the re-commit replaced the name, not the bytes behind it
    assert committed.read_bytes() == b"other " + FILES["ckpt.index"]
    assert manifest.files["ckpt.index"] == sha256_file(committed)
