"""Generation fencing, once per backend (memory://, local disk, real S3 via SeaweedFS, GCS
via fake-gcs-server).

A store that claimed generation g must not upload, commit or delete once generation > g
exists; claims and manifests are create-only where the backend has conditional writes.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest

from resilient_train.checkpoint import CheckpointStore, Status
from resilient_train.checkpoint import commit_path as store_module
from resilient_train.checkpoint._files import write_create_only
from resilient_train.errors import StaleWriterError, StorageError
from tests.support.storage import WEIGHTS, Backend, write_ckpt_dir


def commit(backend: Backend, store: CheckpointStore, step: int, *, seed: int | None = None,
           on_uploaded: Callable[[str], None] | None = None) -> Any:
    local = write_ckpt_dir(backend.tmp_path / f"stage-{uuid.uuid4().hex[:8]}", step if seed is None else seed)
    return store.commit(local, run_id="run-1", epoch=0, step_in_epoch=step, global_step=step, world_size=1,
                        weights_sha256=WEIGHTS, tf_version="2.21.0", on_uploaded=on_uploaded)


def snapshot(backend: Backend, store: CheckpointStore) -> dict[str, bytes]:
    """Every object under the store's root (names relative to it) with its bytes."""
    fs, root = backend.raw_fs(store)
    fs.invalidate_cache(root)
    return {path[len(root.rstrip("/")) + 1:]: fs.cat_file(path) for path in sorted(fs.find(root))}


def test_a_claim_creates_its_generation_file_once(backend):
    url = backend.new_url()
    store = backend.store(url)
    assert store.newest_generation() is None
    assert store.claim_generation(3, run_id="run-1", attempt=3) == 3
    assert store.newest_generation() == 3
    claimed = backend.events.named("generation_claimed")
    assert [(e["generation"], e["attempt"], e["path"]) for e in claimed] == [(3, 3, f"{store.url}/generations/gen-3.json")]
    with pytest.raises(StaleWriterError, match=r"generation 3 in .* is already claimed by run run-1 attempt 3"):
        backend.store(url).claim_generation(3, run_id="run-2", attempt=3)


def test_without_a_given_generation_the_next_free_one_is_claimed(backend):
    url = backend.new_url()
    backend.store(url).claim_generation(2, run_id="run-1", attempt=2)
    assert backend.store(url).claim_generation(None, run_id="run-1", attempt=1) == 3
    assert backend.store(url).claim_generation(None, run_id="run-1", attempt=1) == 4


def test_a_claim_below_the_newest_generation_is_fenced_at_once(backend):
    url = backend.new_url()
    backend.store(url).claim_generation(5, run_id="run-1", attempt=5)
    with pytest.raises(StaleWriterError, match="generation 4 .* superseded by generation 5"):
        backend.store(url).claim_generation(4, run_id="run-1", attempt=4)
    fenced = backend.events.named("stale_writer_fenced")
    assert [(e["generation"], e["newer_generation"], e["op"]) for e in fenced] == [(4, 5, "claim generation in")]


def test_a_superseded_writer_can_neither_commit_nor_delete(backend):
    url = backend.new_url()
    old = backend.store(url)
    old.claim_generation(1, run_id="run-1", attempt=1)
    assert commit(backend, old, 10).extra == {"generation": 1}
    new = backend.store(url)
    new.claim_generation(2, run_id="run-1", attempt=2)
    for step in (20, 30):
        assert commit(backend, new, step).extra == {"generation": 2}
    before = snapshot(backend, new)

    with pytest.raises(StaleWriterError, match=r"generation 1 .* superseded by generation 2 .*refusing to commit"):
        commit(backend, old, 40)
    with pytest.raises(StaleWriterError, match="refusing to delete"):
        old.retain(1)
    with pytest.raises(StaleWriterError, match="refusing to commit"):
        commit(backend, old, 30, seed=99)  # re-committing a step the new attempt owns

    assert snapshot(backend, new) == before
    fenced = backend.events.named("stale_writer_fenced")
    assert [(e["generation"], e["newer_generation"], e["op"]) for e in fenced] == [
        (1, 2, "commit"), (1, 2, "delete"), (1, 2, "commit")
    ]
    assert fenced[1]["path"] == f"{new.url}/ckpt-000000000010"
    assert new.retain(1) == [f"{new.url}/ckpt-000000000010", f"{new.url}/ckpt-000000000020"]


def test_a_writer_frozen_mid_upload_stops_at_its_next_upload(backend, monkeypatch):
    """The store-level twin of tests/integration/test_stale_writer.py."""
    url = backend.new_url()
    old, new = backend.store(url), backend.store(url)
    old.claim_generation(1, run_id="run-1", attempt=1)
    uploaded: list[str] = []
    now = [0.0]
    monkeypatch.setattr(store_module, "_monotonic", lambda: now[0])

    def newer_attempt_commits_meanwhile(name: str) -> None:
        uploaded.append(name)
        if len(uploaded) == 1:  # "frozen" after the first file; a new attempt runs
            new.claim_generation(2, run_id="run-1", attempt=2)
            commit(backend, new, 20, seed=7)
            now[0] += store_module.FENCE_RECHECK_S  # the freeze: no new attempt starts faster

    with pytest.raises(StaleWriterError, match=r"refusing to upload .*/ckpt-000000000020/ckpt\.data"):
        commit(backend, old, 20, seed=1, on_uploaded=newer_attempt_commits_meanwhile)
    assert uploaded == ["assets/vocab.txt"]
    [info] = new.verify()
    assert (info.global_step, info.status, info.manifest.extra) == (20, Status.OK, {"generation": 2})


def test_a_commit_without_a_pause_reads_the_fence_before_it_starts_and_before_its_manifest(backend, monkeypatch):
    url = backend.new_url()
    store = backend.store(url)
    store.claim_generation(1, run_id="run-1", attempt=1)
    reads: list[int | None] = []
    newest = store._writer._fence.newest
    monkeypatch.setattr(store._writer._fence, "newest", lambda: reads.append(newest()) or reads[-1])
    monkeypatch.setattr(store_module, "_monotonic", lambda: 0.0)  # no time passes between uploads
    commit(backend, store, 10)
    assert reads == [1, 1]  # not once per file: each read is a listing of the storage
    [info] = store.verify()
    assert (info.global_step, info.status, info.manifest.extra) == (10, Status.OK, {"generation": 1})


def test_create_only_writes_refuse_an_existing_object(backend):
    """On S3 this is a PUT with If-None-Match: * ; SeaweedFS answers 412."""
    store = backend.store()
    fs, root = backend.raw_fs(store)
    path = f"{root}/probe/once.json"
    local = backend.name == "local"
    write_create_only(fs, path, b"first", local=local)
    with pytest.raises(FileExistsError):
        write_create_only(fs, path, b"second", local=local)
    fs.invalidate_cache(root)
    assert fs.cat_file(path) == b"first"


class _NoFallback:
    """A filesystem proxy that fails the test if ``write_create_only`` falls back to the
    non-atomic exists-then-put: create-only must be the backend's own conditional write."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def exists(self, path: str) -> bool:
        raise AssertionError(f"write_create_only fell back to exists-then-put for {path}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def test_create_only_is_the_backends_own_conditional_write(backend):
    """S3: PUT with If-None-Match: * (412). GCS: ifGenerationMatch=0 (412). Local: a hard link."""
    store = backend.store()
    fs, root = backend.raw_fs(store)
    path = f"{root}/probe/atomic.json"
    local = backend.name == "local"
    write_create_only(_NoFallback(fs), path, b"first", local=local)
    with pytest.raises(FileExistsError):
        write_create_only(_NoFallback(fs), path, b"second", local=local)
    fs.invalidate_cache(root)
    assert fs.cat_file(path) == b"first"


def test_a_fenced_manifest_is_created_only_if_absent(backend):
    """Two writers of one generation racing for one step: the second manifest PUT fails."""
    url = backend.new_url()
    store, rival = backend.store(url), backend.store(url)
    store.claim_generation(1, run_id="run-1", attempt=1)
    files: list[str] = []

    def rival_commits_first(name: str) -> None:
        files.append(name)
        if len(files) == 3:
            commit(backend, rival, 20, seed=5)

    with pytest.raises(StorageError, match="another writer committed it concurrently"):
        commit(backend, store, 20, seed=6, on_uploaded=rival_commits_first)
    [info] = rival.list()
    assert info.manifest is not None and info.manifest.extra == {}


def test_an_unfenced_store_behaves_as_before(backend):
    store = backend.store()
    commit(backend, store, 10)
    assert commit(backend, store, 10).extra == {}  # the same bytes again: manifest replaced
    assert store.newest_generation() is None
    assert backend.events.named("stale_writer_fenced") == []


def test_a_rescuer_adopts_its_attempts_generation_without_claiming_it(backend):
    # A non-chief rank that may commit a rescue (runner/state/memory_tier.py) writes under the
    # generation its chief claimed: its commits carry it, and a newer attempt fences them.
    url = backend.new_url()
    chief = backend.store(url)
    chief.claim_generation(1, run_id="run-1", attempt=1)
    claimed = snapshot(backend, chief)
    rescuer = backend.store(url)
    assert rescuer.adopt_generation(1, run_id="run-1", attempt=1) == 1
    assert snapshot(backend, rescuer) == claimed  # adopting writes nothing
    assert commit(backend, rescuer, 16).extra == {"generation": 1}
    assert backend.store(url).adopt_generation(None, run_id="run-1", attempt=1) == 1  # the newest, when none is given
    backend.store(url).claim_generation(2, run_id="run-1", attempt=2)
    with pytest.raises(StaleWriterError, match=r"generation 1 .* superseded by generation 2 .*refusing to commit"):
        commit(backend, rescuer, 17)


def test_adopting_in_an_unfenced_storage_leaves_the_store_unfenced(backend):
    store = backend.store(backend.new_url())
    assert store.adopt_generation(None, run_id="run-1", attempt=1) is None
    assert commit(backend, store, 3).extra == {}
