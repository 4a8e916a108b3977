"""The commit protocol under injected faults: torn uploads, flipped bytes, flaky and
misconfigured storage. Every backend; faults come from the seeded ``faulty`` filesystem."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from resilient_train.checkpoint import CheckpointStore, RetryPolicy, Status
from resilient_train.chaos.faultfs import SimulatedCrash
from resilient_train.commands.verify import verify_command
from resilient_train.errors import EXIT_FAILURE, StorageError

from tests.support.storage import DATA_FILE, FILES, Backend, Events, FakeSleep

N_FILES = len(FILES)


@pytest.mark.parametrize("k", range(N_FILES + 1))
def test_commit_killed_after_k_files_is_never_read(backend: Backend, k: int) -> None:
    store = backend.store()
    backend.commit(store, 10)
    crashing = backend.store(store.url, faults={"stop_after_files": k})
    with pytest.raises(SimulatedCrash):
        backend.commit(crashing, 20)  # k data files land; k == N_FILES: only the manifest is lost
    assert crashing.fs.stats["files_written"] == k

    expected = [(10, Status.OK)] + ([(20, Status.UNCOMMITTED)] if k > 0 else [])
    assert [(i.global_step, i.status) for i in store.list()] == expected
    assert [(i.global_step, i.status) for i in store.verify()] == expected
    assert store.latest_manifest().global_step == 10
    manifest, _ = store.restore_latest(backend.tmp_path / "cache")
    assert manifest.global_step == 10
    assert backend.events.named("checkpoint_rejected") == []  # uncommitted is not a checkpoint
    assert backend.events.named("storage_retry") == []  # a crash is never retried

    assert store.collect_garbage() == []  # newer than the newest commit: maybe in flight
    backend.commit(store, 30)
    assert store.collect_garbage() == ([f"{store.url}/ckpt-000000000020"] if k > 0 else [])
    assert [(i.global_step, i.status) for i in store.list()] == [(10, Status.OK), (30, Status.OK)]


def test_flipped_byte_falls_back_and_is_reported(backend: Backend) -> None:
    store = backend.store()
    for gs in (10, 20, 30):
        backend.commit(store, gs)
    fs, root = backend.raw_fs(store)
    victim = f"{root}/ckpt-000000000030/{DATA_FILE}"
    data = bytearray(fs.cat_file(victim))
    data[1234] ^= 0x01
    fs.pipe_file(victim, bytes(data))

    assert [(i.global_step, i.status) for i in store.list()] == [(10, Status.OK), (20, Status.OK), (30, Status.OK)]
    manifest, path = store.restore_latest(backend.tmp_path / "cache")
    assert manifest.global_step == 20
    assert sorted(p.name for p in (backend.tmp_path / "cache").iterdir()) == [path.name]
    rejected = backend.events.named("checkpoint_rejected")
    assert rejected == [{
        "event": "checkpoint_rejected", "group": True, "path": f"{store.url}/ckpt-000000000030",
        "reason": f"sha256 mismatch in {DATA_FILE}", "global_step": 30,
    }]
    verified = store.verify()
    assert [(i.global_step, i.status, i.detail) for i in verified] == [
        (10, Status.OK, ""), (20, Status.OK, ""), (30, Status.CORRUPT, f"sha256 mismatch in {DATA_FILE}")]
    assert fs.exists(victim)  # reported, never deleted

    out, err = io.StringIO(), io.StringIO()
    code = verify_command(store.url, backend.options, as_json=False, hash=True, out=out, err=err)
    assert code == EXIT_FAILURE
    assert f"corrupt: sha256 mismatch in {DATA_FILE}" in out.getvalue()
    assert f"newest restorable: global_step 20 ({store.url}/ckpt-000000000020)" in out.getvalue()
    assert err.getvalue() == ""


def test_truncated_and_missing_files_are_rejected(backend: Backend) -> None:
    store = backend.store()
    for gs in (1, 2, 3):
        backend.commit(store, gs)
    fs, root = backend.raw_fs(store)
    fs.pipe_file(f"{root}/ckpt-000000000003/ckpt.index", b"short")
    fs.rm_file(f"{root}/ckpt-000000000002/assets/vocab.txt")
    infos = store.list()
    assert [(i.global_step, i.status, i.detail) for i in infos] == [
        (1, Status.OK, ""),
        (2, Status.TORN, "missing file assets/vocab.txt"),
        (3, Status.CORRUPT, f"size mismatch in ckpt.index (manifest {FILES['ckpt.index']} bytes, found 5)"),
    ]
    assert store.latest_manifest().global_step == 1
    manifest, _ = store.restore_latest(backend.tmp_path / "cache")
    assert manifest.global_step == 1
    assert [(r["global_step"], r["reason"]) for r in backend.events.named("checkpoint_rejected")] == [
        (3, infos[2].detail), (2, "missing file assets/vocab.txt")]


def test_transient_faults_are_retried_until_every_commit_lands(backend: Backend) -> None:
    sleep = FakeSleep()
    policy = RetryPolicy(attempts=10, sleep=sleep)
    store = backend.store(faults={"seed": 7, "transient_rate": 0.2}, retry=policy)
    for gs in range(1, 11):
        backend.commit(store, gs)
    reader = backend.store(store.url)
    assert [(i.global_step, i.status) for i in reader.verify()] == [(gs, Status.OK) for gs in range(1, 11)]
    retries = backend.events.named("storage_retry")
    assert len(retries) >= 5  # ~50 operations at rate 0.2 (seeded: the same run every time)
    assert len(retries) == len(sleep.calls)
    assert {r["try_number"] for r in retries} >= {1}
    assert all(1 <= r["try_number"] < policy.attempts for r in retries)
    assert all(r["error"].startswith("ConnectionResetError: injected transient fault") for r in retries)
    assert [r["wait_s"] for r in retries] == [round(s, 3) for s in sleep.calls]


def test_one_transient_write_failure_costs_one_retry(backend: Backend) -> None:
    store = backend.store(faults={"fail_write_k": 2})
    backend.commit(store, 1)
    retries = backend.events.named("storage_retry")
    assert [(r["op"], r["try_number"]) for r in retries] == [("upload", 1)]
    assert retries[0]["path"] == f"{store.url}/ckpt-000000000001/{DATA_FILE}"  # files go in sorted order
    assert [(i.global_step, i.status) for i in backend.store(store.url).verify()] == [(1, Status.OK)]


def test_permanent_write_failure_is_not_retried(backend: Backend) -> None:
    store = backend.store(faults={"fail_write_k": 1, "fail_kind": "permanent"})
    with pytest.raises(StorageError) as raised:
        store.check()
    assert store.url in str(raised.value)
    assert "PermissionError" in str(raised.value)
    assert backend.events.named("storage_retry") == []


def test_a_full_disk_mid_upload_removes_the_partial_checkpoint(backend: Backend) -> None:
    store = backend.store()
    backend.commit(store, 1)
    full = backend.store(store.url, faults={"fail_write_k": 2, "fail_kind": "nospace"})
    with pytest.raises(StorageError) as raised:
        backend.commit(full, 2)
    message = str(raised.value)
    assert message.startswith(f"cannot commit checkpoint ckpt-000000000002 to {store.url}")
    assert "No space left on device" in message and message.endswith("(the partial upload was removed)")
    assert backend.events.named("storage_retry") == []  # ENOSPC is permanent
    # no file of step 2 is left (an uncommitted leftover would be listed as step 2)
    assert [(i.global_step, i.status) for i in backend.store(store.url).verify()] == [(1, Status.OK)]


@pytest.mark.parametrize("url, cause", [
    ("nope://x", "Protocol not known: nope"),
    ("s3://", "the URL names no bucket or directory"),
    ("memory://", "the URL names no bucket or directory"),
])
def test_bad_url_fails_fast(url: str, cause: str) -> None:
    events = Events()
    with pytest.raises(StorageError) as raised:
        CheckpointStore(url, emit=events).check()
    assert str(raised.value).startswith(f"cannot use checkpoint storage {url}: ")
    assert cause in str(raised.value)
    assert "\n" not in str(raised.value)
    assert events.records == []


def test_local_path_under_a_file_fails_fast(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    events = Events()
    url = str(tmp_path / "a-file" / "ckpts")
    with pytest.raises(StorageError) as raised:
        CheckpointStore(url, emit=events, retry=RetryPolicy(sleep=FakeSleep())).check()
    assert url in str(raised.value)
    assert "\n" not in str(raised.value)
    assert events.named("storage_retry") == []


@pytest.mark.s3
def test_missing_bucket_fails_fast(s3_server) -> None:
    events, sleep = Events(), FakeSleep()
    url = "s3://rt-no-such-bucket/run"
    with pytest.raises(StorageError) as raised:
        CheckpointStore(url, s3_server.storage_options, emit=events, retry=RetryPolicy(sleep=sleep)).check()
    assert url in str(raised.value)
    assert "bucket does not exist" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert events.named("storage_retry") == [] and sleep.calls == []


@pytest.mark.s3
def test_wrong_credentials_fail_fast(s3_server) -> None:
    events, sleep = Events(), FakeSleep()
    options = {**s3_server.storage_options, "secret": "wrong"}
    with pytest.raises(StorageError) as raised:
        CheckpointStore(f"{s3_server.url_prefix}/creds", options, emit=events,
                        retry=RetryPolicy(sleep=sleep)).check()
    assert f"{s3_server.url_prefix}/creds" in str(raised.value)
    assert "PermissionError" in str(raised.value)
    assert events.named("storage_retry") == [] and sleep.calls == []


@pytest.mark.s3
def test_listing_a_missing_bucket_is_a_storage_error(s3_server) -> None:
    store = CheckpointStore("s3://rt-no-such-bucket/run", s3_server.storage_options, emit=Events(),
                            retry=RetryPolicy(sleep=FakeSleep()))
    with pytest.raises(StorageError, match="s3://rt-no-such-bucket/run"):
        store.list()
