"""Contract tests of CheckpointStore, run once per backend (memory, local dir, real S3)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from resilient_train.checkpoint import CheckpointStore, Manifest, Status
from resilient_train.checkpoint.manifest import MANIFEST_NAME, sha256_file
from resilient_train.errors import CheckpointCorruptError

from tests.support.storage import DATA_FILE, FILES, WEIGHTS, Backend, write_ckpt_dir


def steps(store: CheckpointStore) -> list[tuple[int, Status]]:
    return [(info.global_step, info.status) for info in store.list()]


def test_check_then_commit_list_and_latest(backend: Backend) -> None:
    store = backend.store()
    store.check()
    assert store.list() == []
    assert store.latest_manifest() is None

    first = backend.commit(store, 7)
    second = backend.commit(store, 12, extra={"completed": True, "epochs": 5})

    infos = store.list()
    assert [(i.global_step, i.status, i.detail) for i in infos] == [(7, Status.OK, ""), (12, Status.OK, "")]
    assert infos[1].path == f"{store.url}/ckpt-000000000012"
    assert infos[1].size == sum(FILES.values()) == second.total_size
    assert infos[0].manifest == first
    assert set(second.files) == set(FILES)
    assert second.extra == {"completed": True, "epochs": 5}
    assert (second.epoch, second.step_in_epoch, second.world_size) == (1, 2, 2)
    assert store.latest_manifest() == second
    # the probe object written by check() is gone
    fs, root = backend.raw_fs(store)
    assert [p for p in fs.find(root) if ".rt-probe" in p] == []


def test_manifest_is_written_last_and_matches_the_bytes(backend: Backend) -> None:
    store = backend.store()
    local = write_ckpt_dir(backend.tmp_path / "stage", seed=3)
    manifest = store.commit(local, run_id="r", epoch=0, step_in_epoch=3, global_step=3, world_size=1,
                            weights_sha256=WEIGHTS, tf_version="2.21.0")
    fs, root = backend.raw_fs(store)
    stored = Manifest.from_json(fs.cat_file(f"{root}/ckpt-000000000003/{MANIFEST_NAME}"), path="x")
    assert stored == manifest
    for rel in FILES:
        assert manifest.files[rel] == sha256_file(local / rel)


def test_verify_hashes_every_file(backend: Backend) -> None:
    store = backend.store()
    for gs in (1, 2):
        backend.commit(store, gs)
    assert [(i.global_step, i.status) for i in store.verify()] == [(1, Status.OK), (2, Status.OK)]
    assert [(i.global_step, i.status) for i in store.verify(2)] == [(2, Status.OK)]
    assert store.verify(99) == []


def test_fetch_downloads_verifies_and_reuses_a_matching_cache(backend: Backend) -> None:
    writer = backend.store()
    manifest = backend.commit(writer, 5)
    reader = backend.store(writer.url, faults={})  # counts reads, injects nothing
    cache = backend.tmp_path / "cache"

    got, path = reader.fetch(5, cache)
    assert got == manifest
    assert path == cache / "ckpt-000000000005"
    assert {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} == set(FILES) | {MANIFEST_NAME}
    for rel, entry in manifest.files.items():
        assert sha256_file(path / rel) == entry
    stats = reader.fs.stats
    assert stats["bytes_read"] >= sum(FILES.values())
    reads, bytes_read = stats["reads"], stats["bytes_read"]

    again, path2 = reader.fetch(5, cache)  # cache hit: only the manifest is read
    assert (again, path2) == (manifest, path)
    assert stats["reads"] == reads + 1
    assert stats["bytes_read"] == bytes_read + len(manifest.to_json().encode())

    (path / DATA_FILE).write_bytes(b"stale")  # a stale copy is replaced, not trusted
    reader.fetch(5, cache)
    assert sha256_file(path / DATA_FILE) == manifest.files[DATA_FILE]
    assert sorted(p.name for p in cache.iterdir()) == ["ckpt-000000000005"]  # no staging leftovers


def test_fetch_of_an_uncommitted_step_is_refused(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-000000000004: not committed \(no MANIFEST.json\)"):
        store.fetch(4, backend.tmp_path / "cache")


def test_restore_latest_returns_newest(backend: Backend) -> None:
    store = backend.store()
    assert store.restore_latest(backend.tmp_path / "cache") is None
    for gs in (10, 20, 30):
        backend.commit(store, gs)
    manifest, path = store.restore_latest(backend.tmp_path / "cache")
    assert manifest.global_step == 30
    assert path.name == "ckpt-000000000030"
    assert backend.events.named("checkpoint_rejected") == []


def test_retain_keeps_exactly_the_newest(backend: Backend) -> None:
    store = backend.store()
    for gs in (1, 2, 3, 4, 5):
        backend.commit(store, gs)
    deleted = store.retain(keep=2)
    assert deleted == [f"{store.url}/ckpt-00000000000{gs}" for gs in (1, 2, 3)]
    assert steps(store) == [(4, Status.OK), (5, Status.OK)]
    fs, root = backend.raw_fs(store)
    fs.invalidate_cache()
    remaining = sorted({p[len(root) + 1:].split("/")[0] for p in fs.find(root)})
    assert remaining == ["ckpt-000000000004", "ckpt-000000000005"]
    assert store.retain(keep=2) == []


def test_retain_never_deletes_the_newest_good_one_nor_damaged_ones(backend: Backend) -> None:
    store = backend.store()
    for gs in (1, 2, 3, 4):
        backend.commit(store, gs)
    fs, root = backend.raw_fs(store)
    fs.rm_file(f"{root}/ckpt-000000000004/{DATA_FILE}")  # newest is now torn
    assert store.retain(keep=1) == [f"{store.url}/ckpt-000000000001", f"{store.url}/ckpt-000000000002"]
    assert steps(store) == [(3, Status.OK), (4, Status.TORN)]
    with pytest.raises(ValueError, match="keep=0"):
        store.retain(keep=0)


def test_retention_after_each_commit_reads_only_manifests_it_has_not_seen(backend: Backend, monkeypatch) -> None:
    store = backend.store()
    reads: list[int] = []
    read_manifest = store._reader._read_manifest
    monkeypatch.setattr(store._reader, "_read_manifest", lambda step: reads.append(step) or read_manifest(step))
    deleted = []
    for gs in (1, 2, 3, 4):
        backend.commit(store, gs)
        deleted += store.retain(keep=3)
    assert reads == [1, 2, 3, 4]  # each manifest once, not every kept one after every commit
    assert deleted == [f"{store.url}/ckpt-000000000001"]
    fs, root = backend.raw_fs(store)
    fs.rm_file(f"{root}/ckpt-000000000004/{DATA_FILE}")  # a listing that changed is inspected again
    backend.commit(store, 5)
    assert store.retain(keep=2) == [f"{store.url}/ckpt-000000000002"]  # 3 and 5 good; 4 torn stays
    assert reads == [1, 2, 3, 4, 4, 5]
    assert steps(store) == [(3, Status.OK), (4, Status.TORN), (5, Status.OK)]


def test_known_entries_are_linked_unread_on_local_disk_and_checked_when_streamed(backend: Backend, monkeypatch) -> None:
    from resilient_train.checkpoint import commit_path as store_module
    from resilient_train.checkpoint.manifest import FileEntry

    store = backend.store()
    local = write_ckpt_dir(backend.tmp_path / "stage-known", 3)
    known = {DATA_FILE: sha256_file(local / DATA_FILE)}
    hashed: list[str] = []
    monkeypatch.setattr(store_module, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path))
    manifest = store.commit(local, run_id="run-1", epoch=0, step_in_epoch=3, global_step=3, world_size=1,
                            weights_sha256=WEIGHTS, tf_version="2.21.0", known=known)
    assert manifest.files[DATA_FILE] == known[DATA_FILE]
    linked = backend.name == "local"  # the only backend where a commit links instead of streaming
    # linked files are hashed by reading them, except the known one; streamed ones as they are sent
    assert sorted(hashed) == (sorted(Path(rel).name for rel in FILES if rel != DATA_FILE) if linked else [])
    assert [i.status for i in store.verify()] == [Status.OK]
    wrong = {DATA_FILE: FileEntry(size=FILES[DATA_FILE], sha256="0" * 64)}
    other = write_ckpt_dir(backend.tmp_path / "stage-wrong", 4)
    if linked:
        return
    with pytest.raises(CheckpointCorruptError, match="changed after it was staged"):
        store.commit(other, run_id="run-1", epoch=0, step_in_epoch=4, global_step=4, world_size=1,
                     weights_sha256=WEIGHTS, tf_version="2.21.0", known=wrong)
    assert [(i.global_step, i.status) for i in store.list()][0] == (3, Status.OK)


def test_collect_garbage_removes_only_old_uncommitted(backend: Backend) -> None:
    store = backend.store()
    backend.commit(store, 0)
    backend.commit(store, 2)
    backend.commit(store, 4)
    fs, root = backend.raw_fs(store)
    fs.rm_file(f"{root}/ckpt-000000000000/ckpt.index")  # committed but torn: must stay
    fs.pipe_file(f"{root}/ckpt-000000000001/ckpt.index", b"left over by a crash")  # no manifest
    fs.pipe_file(f"{root}/ckpt-000000000003/ckpt.index", b"x")
    fs.pipe_file(f"{root}/ckpt-000000000003/{MANIFEST_NAME}", b"{not json")  # unreadable manifest
    fs.pipe_file(f"{root}/ckpt-000000000005/ckpt.index", b"upload in progress")  # newer: keep

    before = store.list()
    assert [(i.global_step, i.status) for i in before] == [
        (0, Status.TORN), (1, Status.UNCOMMITTED), (2, Status.OK), (3, Status.UNCOMMITTED),
        (4, Status.OK), (5, Status.UNCOMMITTED)]
    assert before[3].detail.startswith("manifest unreadable: manifest is not valid JSON")

    deleted = store.collect_garbage()
    assert deleted == [f"{store.url}/ckpt-000000000001", f"{store.url}/ckpt-000000000003"]
    assert steps(store) == [(0, Status.TORN), (2, Status.OK), (4, Status.OK), (5, Status.UNCOMMITTED)]
    gc = backend.events.named("garbage_collected")
    assert gc == [{"event": "garbage_collected", "group": True, "paths": deleted, "count": 2}]
    assert store.collect_garbage() == []
    assert len(backend.events.named("garbage_collected")) == 1


def test_recommit_with_identical_bytes_rewrites_only_the_manifest(backend: Backend) -> None:
    store = backend.store()
    backend.commit(store, 8, seed=1)
    counting = backend.store(store.url, faults={})
    final = backend.commit(counting, 8, seed=1, extra={"completed": True})
    assert counting.fs.stats["files_written"] == 1  # MANIFEST.json only
    assert store.latest_manifest() == final
    assert final.extra == {"completed": True}
    assert [(i.global_step, i.status) for i in store.verify()] == [(8, Status.OK)]


def test_recommit_with_other_bytes_is_never_torn(backend: Backend) -> None:
    store = backend.store()
    backend.commit(store, 6, seed=1)
    backend.commit(store, 8, seed=1)
    crashing = backend.store(store.url, faults={"stop_after_files": 1})
    from resilient_train.chaos.faultfs import SimulatedCrash

    with pytest.raises(SimulatedCrash):
        backend.commit(crashing, 8, seed=2)  # different bytes, killed after one file
    # the old manifest went first: step 8 is uncommitted, not torn or corrupt
    assert [(i.global_step, i.status) for i in store.verify()] == [(6, Status.OK), (8, Status.UNCOMMITTED)]
    assert store.restore_latest(backend.tmp_path / "cache")[0].global_step == 6

    redo = backend.commit(store, 8, seed=2)
    assert [(i.global_step, i.status) for i in store.verify()] == [(6, Status.OK), (8, Status.OK)]
    assert store.latest_manifest() == redo


def test_commit_validates_before_uploading(backend: Backend) -> None:
    store = backend.store()
    local = write_ckpt_dir(backend.tmp_path / "stage", seed=1)
    with pytest.raises(ValueError, match="world_size=0"):
        store.commit(local, run_id="r", epoch=0, step_in_epoch=0, global_step=1, world_size=0,
                     weights_sha256=WEIGHTS, tf_version="2.21.0")
    with pytest.raises(ValueError, match="expected an existing directory"):
        store.commit(backend.tmp_path / "missing", run_id="r", epoch=0, step_in_epoch=0, global_step=1,
                     world_size=1, weights_sha256=WEIGHTS, tf_version="2.21.0")
    (local / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match="reserved for the manifest"):
        store.commit(local, run_id="r", epoch=0, step_in_epoch=0, global_step=1, world_size=1,
                     weights_sha256=WEIGHTS, tf_version="2.21.0")
    assert store.list() == []


def test_url_is_normalised(tmp_path: Path) -> None:
    assert CheckpointStore("memory://a/b/", emit=lambda *a, **k: None).url == "memory://a/b"
    assert CheckpointStore(f"{tmp_path}/x/", emit=lambda *a, **k: None).url == f"{tmp_path}/x"
    assert CheckpointStore.dir_name(42) == "ckpt-000000000042"
    with pytest.raises(ValueError, match="global_step=-1"):
        CheckpointStore.dir_name(-1)


def test_manifest_json_is_stable(backend: Backend) -> None:
    store = backend.store()
    manifest = backend.commit(store, 1)
    record = json.loads(manifest.to_json())
    assert sorted(record) == sorted([
        "schema_version", "run_id", "epoch", "step_in_epoch", "global_step", "world_size",
        "tf_version", "created_at", "files", "weights_sha256", "extra"])
    assert record["files"]["assets/vocab.txt"]["size"] == FILES["assets/vocab.txt"]


def test_a_local_commit_takes_the_storage_roots_mode(tmp_path):
    """A team's shared root (0750 here) keeps its checkpoints readable by the group,
    whatever umask the writing worker runs under (the run dir's private 0077)."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o750)
    previous = os.umask(0o077)
    try:
        store = CheckpointStore(str(root))
        store.commit(write_ckpt_dir(tmp_path / "staged", 1), run_id="r", epoch=0, step_in_epoch=5,
                     global_step=5, world_size=1, weights_sha256=WEIGHTS, tf_version="2.21")
    finally:
        os.umask(previous)
    committed = root / CheckpointStore.dir_name(5)
    paths = [committed, *committed.rglob("*")]
    modes = {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in paths}
    assert modes == {p.relative_to(root).as_posix(): 0o750 if p.is_dir() else 0o640 for p in paths}
    assert f"{committed.name}/MANIFEST.json" in modes and f"{committed.name}/assets" in modes
