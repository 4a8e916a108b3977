"""Read-once restore: each worker downloads its own shares of a sharded checkpoint, and the
group completes the rest over the collective it already has.

A sharded save (runner/state/sharded_save.py) leaves one standard TF checkpoint in N data
files; restoring it the plain way, every worker of a restarting group downloads all of
them, so a restart of N workers reads the checkpoint N times from the store. Here the
data file of share k is downloaded by rank ``k % workers`` alone (checkpoint/shares.py's
``plan_read_once``); the index and the small files (callbacks.json, the input's state) by
every rank; and every data file reaches the ranks that did not download it over the SUM
all-reduce the workers already share (runner/training/collectives.py): its owner puts the
file's bytes in, every other rank zeros, so the sum is the owner's bits exactly (four bytes
to an int32, as ``Collectives.gather_bytes``), in chunks of ``CHUNK_BYTES`` so a large
share never sits in memory whole. Every rank walks the same plan in the same order (shares
by index, then chunks), so the collectives pair up.

Why bytes and not restored values: TensorFlow's bundle reader opens a data file only when a
tensor in it is read (a key of a missing data file fails with NotFoundError naming that
file, the others read fine: checked with TF 2.x, see docs/storage.md), but
``tf.train.Checkpoint.restore`` reads every tensor of the object graph, so a worker missing
a data file cannot restore at all. Sending the files keeps the restore TensorFlow's own
(the same call on the same files as before) and makes exactness checkable: every file a
peer sent is compared with the manifest's sha256 before TensorFlow sees it.

Agreement, each step one all-reduce (``gather``) every rank makes:
1. the newest checkpoint by listing (no data read): read once only when every rank names
   the same step and its manifest is a sharded save's (the same manifest everywhere, so
   the same plan); otherwise the restore is the one before read-once (every rank fetches
   the whole newest checkpoint that verifies, the chief's choice wins), with the reason in
   ``restore_read``;
2. each rank's own part (its cache or the host cache may hold it whole: then it reads
   nothing from the store and, if every rank does, nothing is sent), with a failed one
   (a share corrupt on the store) turning the whole group to the plain restore, which
   rejects that checkpoint (``checkpoint_rejected``) and takes the previous one;
3. after the exchange, whether every rank's files verified (same fallback).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.checkpoint.read_path import PartialFetch
from resilient_train.checkpoint.shares import ReadOncePlan, plan_read_once
from resilient_train.errors import CheckpointCorruptError

__all__ = ["CHUNK_BYTES", "ReadOnce", "ReadOnceResult", "exchange_files"]

CHUNK_BYTES = 32 * 2**20
"""Bytes per all-reduce of the exchange: each rank holds a few chunks at a time (the owner's
bytes as int32, the sum), not a share."""

_FAILED, _PART, _WHOLE = 0, 1, 2  # a rank's part after its fetch (step 2's gather)


def exchange_files(part_dir: Path, plan: ReadOncePlan, sizes: dict[str, int], *, rank: int, keep: frozenset[str],
                   sum_over_workers: Callable[[tf.Tensor], tf.Tensor], chunk_bytes: int = CHUNK_BYTES) -> int:
    """Send each data file of ``plan`` from its owner to every rank (one all-reduce per
    chunk); write into ``part_dir`` the ones in ``keep`` (this rank's missing files).
    Returns the bytes written. Every rank calls it with the same plan and sizes."""
    if chunk_bytes <= 0 or chunk_bytes % 4:
        raise ValueError(f"Received chunk_bytes={chunk_bytes}; expected a positive multiple of 4")
    received = 0
    for name, owner in plan.owners:
        size = sizes[name]
        source = open(part_dir / name, "rb") if owner == rank else None
        sink = open(part_dir / name, "wb") if name in keep else None
        try:
            for start in range(0, size, chunk_bytes):
                length = min(chunk_bytes, size - start)
                words = np.zeros(-(-length // 4), dtype=np.int32)
                if source is not None:
                    chunk = source.read(length)
                    if len(chunk) != length:
                        raise CheckpointCorruptError(f"{part_dir / name}: {len(chunk)} bytes at {start}, expected {length}")
                    words.view(np.uint8)[:length] = np.frombuffer(chunk, dtype=np.uint8)
                summed = sum_over_workers(tf.constant(words))
                if sink is not None:
                    sink.write(np.ascontiguousarray(summed.numpy()).view(np.uint8)[:length].tobytes())
                    received += length
        finally:
            for handle in (source, sink):
                if handle is not None:
                    handle.close()
    return received


@dataclass(frozen=True)
class ReadOnceResult:
    """What a read-once restore did on this rank: ``found`` (manifest, local copy), None when
    the group restores the plain way for ``reason``; ``peer_bytes`` received over the
    collective in ``exchange_s``."""

    found: tuple[Manifest, Path] | None
    reason: str
    peer_bytes: int = 0
    exchange_s: float = 0.0


@dataclass(frozen=True)
class ReadOnce:
    """One worker's read-once restore (see the module docstring): the store, its rank among
    ``workers``, ``gather`` (every rank's int, one all-reduce) and ``sum_over_workers``.
    ``unable``: why read-once cannot run here whatever the checkpoint (None: it can)."""

    store: CheckpointStore
    rank: int
    workers: int
    gather: Callable[[int], list[int]]
    sum_over_workers: Callable[[tf.Tensor], tf.Tensor]
    unable: str | None = None
    chunk_bytes: int = CHUNK_BYTES

    def restore(self, cache_dir: Path) -> ReadOnceResult:
        """The newest checkpoint read once by the group, or why not (then restore the plain
        way: ``found`` None). Collective: every rank calls it at the same point."""
        latest = self.store.latest_manifest()
        plan, reason = None, self.unable or "no checkpoint"
        if latest is not None and self.unable is None:
            plan, reason = plan_read_once(latest.extra, {n: e.size for n, e in latest.files.items()},
                                          workers=self.workers)
        votes = self.gather(latest.global_step if latest is not None and plan is not None else -1)
        if plan is None or latest is None:
            return ReadOnceResult(None, reason)
        if len(set(votes)) != 1:
            return ReadOnceResult(None, f"the workers' newest sharded checkpoints differ (global steps {votes} by rank)")
        part: PartialFetch | None = None
        failure = ""
        try:
            part = self.store.fetch_part(latest, cache_dir, skip=plan.others(self.rank))
        except CheckpointCorruptError as exc:
            failure = f" ({exc})"
        states = self.gather(_FAILED if part is None else _WHOLE if part.whole else _PART)
        if part is None or _FAILED in states:
            if part is not None:
                self.store.discard(part)
            return ReadOnceResult(None, f"rank {states.index(_FAILED)} could not read its share{failure}")
        sizes = {name: latest.files[name].size for name, _ in plan.owners}
        started = time.perf_counter()
        received = 0
        if _PART in states:  # someone lacks files: every rank takes part, the owners send
            received = exchange_files(part.path, plan, sizes, rank=self.rank, keep=part.missing,
                                      sum_over_workers=self.sum_over_workers, chunk_bytes=self.chunk_bytes)
        exchange_s = round(time.perf_counter() - started, 4)
        found: tuple[Manifest, Path] | None = None
        try:
            found = self.store.complete(part)
        except CheckpointCorruptError as exc:
            failure = f" ({exc})"
        verified = self.gather(int(found is not None))
        if 0 in verified:
            return ReadOnceResult(None, f"rank {verified.index(0)}'s files from its peers did not verify{failure}",
                                  received, exchange_s)
        if _PART not in states:
            reason = "every rank's cache held the checkpoint whole: nothing read, nothing sent"
        return ReadOnceResult(found, reason, received, exchange_s)
