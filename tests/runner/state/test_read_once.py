"""Read-once restore's protocol in one process: two ranks on threads, their collective a
barrier that sums what each puts in (runner/state/read_once.py).

The store's side (partial fetch, completion, its checks) is tests/checkpoint/test_shares.py;
the real 2-worker run, tests/integration/test_sharded_save.py.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.checkpoint.shares import SHARDED_EXTRA_KEY, data_file_name  # noqa: E402
from resilient_train.runner.state.read_once import ReadOnce, ReadOnceResult  # noqa: E402

SHARES = [data_file_name("ckpt", k, 2) for k in range(2)]
# Sizes that are no multiple of 4 (the exchange packs four bytes to an int32) or of the chunk.
FILES = {"ckpt.index": b"index" * 21, "callbacks.json": b"{}",
         SHARES[0]: bytes(range(256)) * 7 + b"x", SHARES[1]: bytes(reversed(range(256))) * 9 + b"yz"}


class Group:
    """The ranks' collectives: each puts its value in, every one gets the sum (``gather``'s
    all-reduce) or the values concatenated by rank (the exchange's all-gather)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)  # a rank that never comes breaks it, not the test run
        self.slots: list[Any] = [None] * size
        self.calls = 0

    def _meet(self, rank: int, value: Any, combine: Callable[[list[Any]], Any]) -> Any:
        self.slots[rank] = value.numpy()
        self.barrier.wait()
        result = combine(self.slots)
        if rank == 0:
            self.calls += 1
        self.barrier.wait()
        return tf.constant(result)

    def sum(self, rank: int) -> Callable[[Any], Any]:
        return lambda value: self._meet(rank, value, lambda slots: sum(slots[1:], slots[0]))

    def concat(self, rank: int) -> Callable[[Any], Any]:
        return lambda value: self._meet(rank, value, np.concatenate)

    def gather(self, rank: int) -> Callable[[int], list[int]]:
        def gather(value: int) -> list[int]:
            vector = np.zeros(self.size, dtype=np.float64)
            vector[rank] = value
            return [int(v) for v in self.sum(rank)(tf.constant(vector)).numpy()]
        return gather


def _commit(url: str, tmp_path: Path, step: int, *, sharded: bool = True, files: dict[str, bytes] = FILES,
            host_cache: Path | None = None, shards: int = 2) -> None:
    staging = tmp_path / "staging" / str(step)
    staging.mkdir(parents=True)
    for rel, data in files.items():
        (staging / rel).write_bytes(data)
    CheckpointStore(url, host_cache=host_cache).commit(staging, run_id="r", epoch=0, step_in_epoch=step, global_step=step, world_size=2,
                                weights_sha256="0" * 64, tf_version="x",
                                extra={SHARDED_EXTRA_KEY: {"shards": shards}} if sharded else {})


def _restore(url: str, tmp_path: Path, *, host_caches: tuple[Path | None, ...] = (None, None),
             chunk_bytes: int = 12) -> tuple[list[ReadOnceResult], list[CheckpointStore], Group]:
    workers = len(host_caches)
    group = Group(workers)
    stores = [CheckpointStore(url, host_cache=host_cache) for host_cache in host_caches]

    def rank(r: int) -> ReadOnceResult:
        once = ReadOnce(store=stores[r], rank=r, workers=workers, gather=group.gather(r),
                        concat_over_workers=group.concat(r), chunk_bytes=chunk_bytes)
        return once.restore(tmp_path / f"rank-{r}" / "cache")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(rank, range(workers)))
    return results, stores, group


@pytest.fixture
def url(tmp_path):
    return f"faulty://{tmp_path / 'shared'}"  # not the staging disk: copies, as from S3


def test_each_rank_reads_its_share_once_and_gets_the_others_bytes_exactly(url, tmp_path):
    _commit(url, tmp_path, 10)
    results, stores, group = _restore(url, tmp_path)
    for r, result in enumerate(results):
        assert result.found is not None, result.reason
        manifest, local = result.found
        assert manifest.global_step == 10 and result.reason == "2 shares read once by 2 of 2 workers"
        assert {rel: (local / rel).read_bytes() for rel in FILES} == FILES
        assert result.peer_bytes == len(FILES[SHARES[1 - r]])
    small = len(FILES["ckpt.index"]) + len(FILES["callbacks.json"])
    assert [s.bytes_downloaded for s in stores] == [small + len(FILES[SHARES[r]]) for r in range(2)]
    # 3 votes, then one all-gather per 12-byte round of the longest rank's files.
    assert group.calls == 3 + -(-max(len(FILES[name]) for name in SHARES) // 12)


def test_four_shares_on_three_workers_cross_file_boundaries_exactly(url, tmp_path):
    names = [data_file_name("ckpt", k, 4) for k in range(4)]
    files = {"ckpt.index": b"i" * 7, **{name: bytes([k + 1]) * (30 + 7 * k) + bytes(range(k)) for k, name in enumerate(names)}}
    _commit(url, tmp_path, 10, files=files, shards=4)
    results, stores, group = _restore(url, tmp_path, host_caches=(None, None, None))
    for result in results:
        assert result.found is not None and result.reason == "4 shares read once by 3 of 3 workers"
        assert {rel: (result.found[1] / rel).read_bytes() for rel in files} == files
    owned = [[0, 3], [1], [2]]  # share k to rank k % 3: rank 0's stream is shares 0 and 3 back to back
    assert [s.bytes_downloaded for s in stores] == [7 + sum(len(files[names[k]]) for k in ks) for ks in owned]
    assert [r.peer_bytes for r in results] == [
        sum(len(files[name]) for name in names) - (s.bytes_downloaded - 7) for r, s in zip(results, stores)]
    assert group.calls == 3 + -(-(len(files[names[0]]) + len(files[names[3]])) // 12)


def test_ranks_whose_caches_hold_it_whole_read_nothing_and_send_nothing(url, tmp_path):
    _commit(url, tmp_path, 10)
    _restore(url, tmp_path)  # each rank's private cache now holds ckpt-10
    results, stores, group = _restore(url, tmp_path)
    assert [(r.found is not None, r.peer_bytes, r.reason) for r in results] == [
        (True, 0, "every rank's cache held the checkpoint whole: nothing read, nothing sent")] * 2
    assert [s.bytes_downloaded for s in stores] == [0, 0] and group.calls == 3


def test_a_rank_with_the_host_cache_still_sends_its_share_to_one_without(url, tmp_path):
    host_cache = tmp_path / "host-cache"
    _commit(url, tmp_path, 10, host_cache=host_cache)  # the chief's commit writes it through
    results, stores, _ = _restore(url, tmp_path, host_caches=(host_cache, None))  # rank 1: another host
    assert all(r.found is not None for r in results)
    assert [s.bytes_downloaded for s in stores] == [0, len(FILES["ckpt.index"]) + 2 + len(FILES[SHARES[1]])]
    assert [r.peer_bytes for r in results] == [0, len(FILES[SHARES[0]])]
    assert (results[1].found[1] / SHARES[0]).read_bytes() == FILES[SHARES[0]]


def test_a_share_corrupt_on_the_store_turns_the_group_to_the_plain_restore(url, tmp_path):
    _commit(url, tmp_path, 10)
    (tmp_path / "shared" / "ckpt-000000000010" / SHARES[1]).write_bytes(b"!" * len(FILES[SHARES[1]]))
    results, _, _ = _restore(url, tmp_path)
    assert [r.found for r in results] == [None, None]
    assert results[0].reason == "rank 1 could not read its share"
    assert results[1].reason == (f"rank 1 could not read its share ({url}/ckpt-000000000010: "
                                 f"sha256 mismatch in {SHARES[1]})")
    assert not any(p.name.startswith(".") for r in range(2) for p in (tmp_path / f"rank-{r}" / "cache").iterdir())


def test_a_checkpoint_that_is_not_sharded_is_restored_the_plain_way(url, tmp_path):
    _commit(url, tmp_path, 10, sharded=False)
    results, stores, group = _restore(url, tmp_path)
    assert [(r.found, r.reason) for r in results] == [(None, "not a sharded checkpoint")] * 2
    assert [s.bytes_downloaded for s in stores] == [0, 0] and group.calls == 1


def test_no_checkpoint_is_one_vote(url, tmp_path):
    CheckpointStore(url).check()
    results, _, group = _restore(url, tmp_path)
    assert [(r.found, r.reason) for r in results] == [(None, "no checkpoint")] * 2 and group.calls == 1
