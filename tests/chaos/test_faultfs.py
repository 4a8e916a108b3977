"""The fault-injecting filesystem itself: configuration paths and reproducibility."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import resilient_train.checkpoint  # noqa: F401  (registers the "faulty" protocol)
from resilient_train.checkpoint import CheckpointStore, RetryPolicy
from resilient_train.chaos.faultfs import ATTEMPT_ENV_VAR, ENV_VAR, FaultSpec, FaultyFileSystem, SimulatedCrash, env_options

from tests.support.storage import Events, FakeSleep


def outcomes(fs: FaultyFileSystem, root: str, n: int) -> list[str]:
    result = []
    for i in range(n):
        try:
            fs.pipe_file(f"{root}/f{i}", b"x")
            result.append("ok")
        except ConnectionResetError:
            result.append("reset")
    return result


def test_same_seed_same_faults() -> None:
    root = f"/rt-faultfs/{uuid.uuid4().hex[:8]}"
    make = lambda seed: FaultyFileSystem(fs=fsspec.filesystem("memory"), seed=seed, transient_rate=0.3)  # noqa: E731
    first, again, other = outcomes(make(1), root, 40), outcomes(make(1), root, 40), outcomes(make(2), root, 40)
    assert first == again
    assert first != other
    assert 0 < first.count("reset") < 40


def test_url_form_wraps_the_inner_filesystem(tmp_path: Path) -> None:
    fs, path = fsspec.core.url_to_fs(f"faulty://{tmp_path}/x", stop_after_files=0)
    assert isinstance(fs, FaultyFileSystem) and fs.local_file
    assert path == f"{tmp_path}/x"
    fs, path = fsspec.core.url_to_fs("faulty://memory://bucket/run")
    assert path == "/bucket/run"
    assert isinstance(fs.fs, MemoryFileSystem)


def test_options_from_the_environment_and_kwargs_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, json.dumps({"stop_after_files": 1, "seed": 5, "latency_s": 0.25}))
    sleep = FakeSleep()
    fs = FaultyFileSystem(target_protocol="memory", sleep=sleep, seed=9)
    assert (fs.spec.stop_after_files, fs.spec.seed, fs.spec.latency_s) == (1, 9, 0.25)
    root = f"/rt-faultfs/{uuid.uuid4().hex[:8]}"
    fs.pipe_file(f"{root}/a", b"1")
    with pytest.raises(SimulatedCrash, match="1 files written"):
        fs.pipe_file(f"{root}/b", b"2")
    assert sleep.calls == [0.25, 0.25]


def test_store_over_a_faulty_url_crashes_where_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, json.dumps({"stop_after_files": 2}))
    url = f"faulty://memory://rt-faultfs/{uuid.uuid4().hex[:8]}"
    store = CheckpointStore(url, emit=Events(), retry=RetryPolicy(sleep=FakeSleep()))
    local = tmp_path / "stage"
    local.mkdir()
    for name in ("a", "b", "c"):
        (local / name).write_bytes(name.encode())
    with pytest.raises(SimulatedCrash):
        store.commit(local, run_id="r", epoch=0, step_in_epoch=1, global_step=1, world_size=1,
                     weights_sha256="0" * 64, tf_version="2.21.0")
    assert store.fs.stats["files_written"] == 2
    plain = CheckpointStore(url.removeprefix("faulty://"), emit=Events())
    assert [(i.global_step, i.status.value, i.detail) for i in plain.list()] == [(1, "uncommitted", "no manifest")]


@pytest.mark.parametrize("options, message", [
    ({"fail_write_k": 0}, "fail_write_k=0"),
    ({"fail_kind": "sometimes"}, "fail_kind='sometimes'; expected 'transient', 'permanent' or 'nospace'"),
    ({"transient_rate": 1.5}, "transient_rate=1.5"),
    ({"fail_op_k": 0}, "fail_op_k=0; expected >= 1"),
])
def test_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultyFileSystem(target_protocol="memory", **options)


def test_unknown_environment_options_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, json.dumps({"typo_rate": 0.1}))
    with pytest.raises(ValueError, match=f"{ENV_VAR} option\\(s\\) \\['typo_rate'\\]"):
        FaultyFileSystem(target_protocol="memory")


@pytest.mark.s3
def test_other_options_go_to_the_inner_filesystem(s3_server) -> None:
    url = f"faulty://{s3_server.url_prefix}/faulty-s3"
    store = CheckpointStore(url, {**s3_server.storage_options, "seed": 3}, emit=Events(),
                            retry=RetryPolicy(sleep=FakeSleep()))
    store.check()
    assert store.fs.spec.seed == 3
    assert store.fs.fs.protocol[0] == "s3"
    with pytest.raises(ValueError, match="with fs="):
        FaultyFileSystem(fs=store.fs.fs, key="k")


def test_a_stalled_write_goes_on_after_stall_s_or_when_released() -> None:
    import threading

    root = f"/rt-faultfs/{uuid.uuid4().hex[:8]}"
    timed = FaultyFileSystem(fs=fsspec.filesystem("memory"), stall_write_k=1, stall_s=0.1)
    timed.pipe_file(f"{root}/a", b"1")  # blocks 0.1 s, then writes
    timed.pipe_file(f"{root}/b", b"2")  # write #2: stall_count=1, not stalled
    assert (timed.stats["stalls"], timed.fs.cat_file(f"{root}/a"), timed.fs.cat_file(f"{root}/b")) == (1, b"1", b"2")

    held = FaultyFileSystem(fs=fsspec.filesystem("memory"), stall_write_k=1, stall_count=0)  # no stall_s: until released
    writer = threading.Thread(target=held.pipe_file, args=(f"{root}/c", b"3"), daemon=True)
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and not held.fs.exists(f"{root}/c")  # still stalled
    held.release()
    writer.join(30)
    assert not writer.is_alive() and held.fs.cat_file(f"{root}/c") == b"3"
    held.pipe_file(f"{root}/d", b"4")  # released for good: later writes pass
    assert held.stats["stalls"] == 1


def test_fail_op_k_fails_the_kth_operation_of_any_kind_once() -> None:
    root = f"/rt-faultfs/{uuid.uuid4().hex[:8]}"
    fs = FaultyFileSystem(fs=fsspec.filesystem("memory"), fail_op_k=3)
    fs.makedirs(root, exist_ok=True)  # operation 1: not only writes count
    assert outcomes(fs, root, 6) == ["ok", "reset", "ok", "ok", "ok", "ok"]


def test_attempt_scoped_options_are_read_when_the_filesystem_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    # A warm standby gets RT_ATTEMPT only with its assignment, after Python started.
    monkeypatch.setenv(ATTEMPT_ENV_VAR, json.dumps({"1": {"stop_after_files": 4}, "*": {"fail_op_k": 5}}))
    monkeypatch.delenv("RT_ATTEMPT", raising=False)
    assert FaultyFileSystem(target_protocol="memory").spec == FaultSpec()  # the supervisor: no faults
    monkeypatch.setenv("RT_ATTEMPT", "1")
    assert FaultyFileSystem(target_protocol="memory").spec == FaultSpec(stop_after_files=4)
    monkeypatch.setenv("RT_ATTEMPT", "3")
    assert FaultyFileSystem(target_protocol="memory").spec == FaultSpec(fail_op_k=5)
    assert env_options({"RT_FAULTFS": json.dumps({"latency_s": 0.1})}) == {"latency_s": 0.1}
