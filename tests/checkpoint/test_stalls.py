"""Stalled storage: the deadline on storage calls (checkpoint/deadline.py), the retry policy
around it, and the commit protocol when an upload or the manifest write goes quiet.

Stalls are real waits (the deadline gives up on a call from another thread), kept to
fractions of a second; every assertion is on an exact outcome, never on elapsed time.
"""

from __future__ import annotations

import threading
import time

import pytest

from resilient_train.checkpoint import RetryPolicy, Status
from resilient_train.checkpoint import deadline
from resilient_train.checkpoint.deadline import call_with_deadline, progress
from resilient_train.checkpoint.options import with_backend_timeouts
from resilient_train.chaos.faultfs import FaultSpec, SimulatedCrash
from resilient_train.errors import StorageUnavailableError

from tests.support.storage import FILES, Backend, Events, FakeSleep

STALL_S = 0.3  # the deadline in these tests: long enough for a loaded 2-core machine to
# start a thread and run a small upload, short enough to keep the suite fast
MANIFEST_WRITE = len(FILES) + 1  # a fresh store's write attempts: the files, then the manifest


# -- the deadline ----------------------------------------------------------------------


def test_a_call_that_returns_or_raises_is_passed_through() -> None:
    assert call_with_deadline(lambda: 42, 5.0, what="read x") == 42

    def missing() -> None:
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError, match="gone"):
        call_with_deadline(missing, 5.0, what="read x")

    def crash() -> None:
        raise SimulatedCrash("killed")

    with pytest.raises(SimulatedCrash):  # not an Exception: must still reach the caller
        call_with_deadline(crash, 5.0, what="write x")


def test_a_silent_call_is_given_up_with_a_timeout_naming_it() -> None:
    release = threading.Event()
    with pytest.raises(TimeoutError) as raised:
        call_with_deadline(lambda: release.wait(), STALL_S, what="upload s3://b/ckpt-000000000010/ckpt.index")
    release.set()  # lets the abandoned call thread end
    assert str(raised.value) == "upload s3://b/ckpt-000000000010/ckpt.index made no progress for 0.3 s (storage stalled)"


def test_calls_reuse_their_threads_and_an_abandoned_one_rejoins_when_its_call_returns() -> None:
    def callers() -> set[int]:
        return {call_with_deadline(threading.get_ident, 5.0, what="read x") for _ in range(20)}

    assert len(callers()) == 1  # one thread for 20 sequential calls, not 20
    release, stuck = threading.Event(), []
    with pytest.raises(TimeoutError):
        call_with_deadline(lambda: stuck.append(threading.get_ident()) or release.wait(), STALL_S, what="read y")
    assert stuck[0] not in callers()  # still stuck: never handed another call
    assert stuck[0] not in {worker.ident for worker in deadline._idle}
    release.set()  # the stuck call returns on its own thread, which is idle again
    for _ in range(500):
        if stuck[0] in {worker.ident for worker in deadline._idle}:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the abandoned call thread never rejoined the idle ones")


def test_a_call_that_keeps_moving_is_never_cut_however_long_it_takes() -> None:
    beats = 12

    def slow_but_moving() -> int:
        for _ in range(beats):  # 12 x 0.1 s: four times the deadline in all
            time.sleep(0.1)
            progress()
        return beats

    assert call_with_deadline(slow_but_moving, 0.6, what="upload x") == beats


def test_progress_outside_a_deadline_is_a_no_op() -> None:
    progress()  # no call running on this thread: nothing to tell, nothing raised


def test_a_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"Received timeout_s=0; expected a number of seconds > 0"):
        call_with_deadline(lambda: 1, 0, what="x")


@pytest.mark.parametrize("bad", [0, -1, True, "30"])
def test_the_retry_policy_validates_its_stall_timeout(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"Received stall_timeout_s={bad!r}; expected a number of seconds > 0 or None"):
        RetryPolicy(stall_timeout_s=bad)  # type: ignore[arg-type]


def test_a_stalled_try_is_retried_and_the_retry_is_an_event() -> None:
    events, sleep = Events(), FakeSleep()
    release, tries = threading.Event(), []

    def first_try_stalls() -> str:
        tries.append(1)
        if len(tries) == 1:
            release.wait()
        return "ok"

    policy = RetryPolicy(sleep=sleep, stall_timeout_s=STALL_S)
    assert policy.call(first_try_stalls, op="write", path="memory://b/x", emit=events) == "ok"
    release.set()
    (retry,) = events.named("storage_retry")
    assert (retry["op"], retry["path"], retry["try_number"]) == ("write", "memory://b/x", 1)
    assert retry["error"] == "TimeoutError: write memory://b/x made no progress for 0.3 s (storage stalled)"
    assert len(sleep.calls) == 1


def test_a_store_that_stays_stalled_ends_as_storage_unavailable() -> None:
    release = threading.Event()
    policy = RetryPolicy(attempts=3, sleep=FakeSleep(), stall_timeout_s=STALL_S)
    with pytest.raises(StorageUnavailableError) as raised:
        policy.call(release.wait, op="upload", path="memory://b/x", emit=Events())
    release.set()
    assert str(raised.value) == (
        "upload memory://b/x failed 3 times; last error: "
        "TimeoutError: upload memory://b/x made no progress for 0.3 s (storage stalled)"
    )


# -- the backends' own timeouts ----------------------------------------------------------


def test_s3_and_gcs_clients_get_socket_timeouts_unless_the_user_set_them() -> None:
    assert with_backend_timeouts("s3://b/p", {"key": "k"}, 30.0) == {
        "key": "k", "config_kwargs": {"connect_timeout": 30.0, "read_timeout": 30.0}}
    assert with_backend_timeouts("s3://b/p", {"config_kwargs": {"read_timeout": 5, "retries": {}}}, 30.0) == {
        "config_kwargs": {"read_timeout": 5, "retries": {}, "connect_timeout": 30.0}}
    assert with_backend_timeouts("gs://b/p", {}, 30.0) == {"requests_timeout": 30.0}
    assert with_backend_timeouts("gs://b/p", {"requests_timeout": 9}, 30.0) == {"requests_timeout": 9}
    assert with_backend_timeouts("memory://b/p", {}, 30.0) == {}
    assert with_backend_timeouts("/tmp/ckpts", {}, 30.0) == {}
    assert with_backend_timeouts("s3://b/p", {}, None) == {}


# -- the fault injector's stall mode -------------------------------------------------------


def test_stall_spec_selects_write_attempts() -> None:
    assert [FaultSpec(stall_write_k=2).stalls_write(k) for k in range(1, 5)] == [False, True, False, False]
    assert [FaultSpec(stall_write_k=2, stall_count=2).stalls_write(k) for k in range(1, 5)] == [False, True, True, False]
    assert [FaultSpec(stall_write_k=2, stall_count=0).stalls_write(k) for k in range(1, 5)] == [False, True, True, True]
    assert not FaultSpec().stalls_write(1)


@pytest.mark.parametrize(("options", "message"), [
    ({"stall_write_k": 0}, r"Received stall_write_k=0; expected an int >= 1 \(1-based\)"),
    ({"stall_count": -1}, r"Received stall_count=-1; expected an int >= 0 \(0: every write from k on\)"),
    ({"stall_s": 0}, r"Received stall_s=0; expected seconds > 0, or None \(until released\)"),
])
def test_stall_spec_rejects_bad_values(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultSpec(**options)


# -- the commit protocol under a stall (every backend) -----------------------------------------


def deadline_for(backend: Backend) -> float:
    """Longer than any healthy call of this backend takes on a loaded machine."""
    return 0.5 if backend.name in ("memory", "local") else 2.0


def stalling(backend: Backend, url: str, **faults: object):
    policy = RetryPolicy(attempts=2, sleep=backend.sleep, stall_timeout_s=deadline_for(backend))
    return backend.store(url, faults=dict(faults), retry=policy)


def test_an_upload_that_stalls_once_is_retried_and_commits(backend: Backend) -> None:
    store = stalling(backend, backend.new_url(), stall_write_k=2)  # the second file's upload
    try:
        manifest = backend.commit(store, 10)
        assert store.fs.stats["stalls"] == 1
        (retry,) = backend.events.named("storage_retry")
        assert retry["op"] == "upload" and retry["try_number"] == 1
        assert retry["error"] == (f"TimeoutError: upload {retry['path']} made no progress for "
                                  f"{deadline_for(backend):g} s (storage stalled)")
        assert [(i.global_step, i.status) for i in store.verify()] == [(10, Status.OK)]
        assert manifest.files == store.latest_manifest().files
    finally:
        store.fs.release()  # (the abandoned upload then rewrites the same bytes: see deadline.py)


def test_a_manifest_write_that_stalls_once_is_retried_and_commits(backend: Backend) -> None:
    store = stalling(backend, backend.new_url(), stall_write_k=MANIFEST_WRITE)
    try:
        backend.commit(store, 10)
        (retry,) = backend.events.named("storage_retry")
        assert retry["op"] == "write" and retry["path"].endswith("/ckpt-000000000010/MANIFEST.json")
        assert [(i.global_step, i.status) for i in store.verify()] == [(10, Status.OK)]
    finally:
        store.fs.release()


@pytest.mark.parametrize("first_stalled", [1, MANIFEST_WRITE], ids=["upload", "manifest"])
def test_a_store_that_goes_quiet_fails_the_save_and_commits_nothing(backend: Backend, first_stalled: int) -> None:
    url = backend.new_url()
    backend.commit(backend.store(url), 10)
    store = stalling(backend, url, stall_write_k=first_stalled, stall_count=0)
    try:
        with pytest.raises(StorageUnavailableError, match=r"failed 2 times; last error: TimeoutError: .* made no "
                           r"progress for [0-9.]+ s \(storage stalled\)"):
            backend.commit(store, 20)
        # Checked while the abandoned calls are still stalled: once the store wakes up, a late
        # manifest PUT may still land, and then commits a complete checkpoint (deadline.py).
        plain = backend.store(url)
        committed = [(i.global_step, i.status) for i in plain.verify() if i.status is not Status.UNCOMMITTED]
        assert committed == [(10, Status.OK)]
        assert plain.latest_manifest().global_step == 10
        assert len(backend.events.named("storage_retry")) == 1
    finally:
        store.fs.release()
