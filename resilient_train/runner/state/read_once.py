"""Read-once restore: each worker downloads its own shares of a sharded checkpoint, and the
group completes the rest over the collective it already has.

A sharded save (runner/state/sharded_save.py) leaves one standard TF checkpoint in N data
files; restoring it the plain way, every worker of a restarting group downloads all of
them, so a restart of N workers reads the checkpoint N times from the store. Here the
data file of share k is downloaded by rank ``k % workers`` alone (checkpoint/shares.py's
``plan_read_once``); the index and the small files (callbacks.json, the input's state) by
every rank; and every data file reaches the ranks that did not download it over the group's collective
(runner/training/collectives.py): in rounds, every rank puts the next ``CHUNK_BYTES`` of its
own files in (four bytes to an int32) and one all-gather hands every rank everyone's, so a
large share never sits in memory whole and each byte crosses to each peer once (a SUM
all-reduce with zeros elsewhere, the first version, moves about twice that). Every rank walks the same plan in the same order (its files in share
order, rounds in turn), so the collectives pair up.

Why bytes and not restored values: TensorFlow's bundle reader opens a data file only when a
tensor in it is read (a key of a missing data file fails with NotFoundError naming that
file, the others read fine: checked with TF 2.21.0, docs/storage.md), but
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
from typing import BinaryIO, Callable

import numpy as np
import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.checkpoint.read_path import PartialFetch
from resilient_train.checkpoint.shares import ReadOncePlan, plan_read_once
from resilient_train.errors import CheckpointCorruptError

__all__ = ["CHUNK_BYTES", "ReadOnce", "ReadOnceResult", "exchange_files"]

CHUNK_BYTES = 8 * 2**20
"""Bytes per all-reduce of the exchange: each rank holds a few chunks at a time (the owner's
bytes as int32, the sum), not a share."""

_FAILED, _PART, _WHOLE = 0, 1, 2  # a rank's part after its fetch (step 2's gather)


class _Stream:
    """A rank's owned data files as one byte stream, in plan order: read (the owner) or
    split back into the files (a receiver; only the files in ``keep`` are written)."""

    def __init__(self, folder: Path, files: list[tuple[str, int]], *, write: bool, keep: frozenset[str]) -> None:
        self._folder, self._files, self._write, self._keep = folder, files, write, keep
        self._index, self._done = 0, 0  # the current file and the bytes of it done
        self._handle: BinaryIO | None = None

    def _current(self) -> tuple[str, int, BinaryIO | None]:
        while self._index < len(self._files) and self._done == self._files[self._index][1]:
            self._close()
            self._index, self._done = self._index + 1, 0
        name, size = self._files[self._index]
        if self._handle is None and (not self._write or name in self._keep):
            self._handle = open(self._folder / name, "wb" if self._write else "rb")
        return name, size, self._handle

    def read(self, length: int) -> bytes:
        parts = []
        while length > 0:
            name, size, handle = self._current()
            assert handle is not None  # the owner opens every one of its files
            part = handle.read(min(length, size - self._done))
            if not part:
                raise CheckpointCorruptError(f"{self._folder / name}: shorter than its {size} bytes")
            parts.append(part)
            self._done += len(part)
            length -= len(part)
        return b"".join(parts)

    def write(self, data: memoryview) -> int:
        """Write ``data`` on into the files; the bytes kept (written to a file in ``keep``)."""
        kept, at = 0, 0
        while at < len(data):
            _, size, handle = self._current()
            take = min(len(data) - at, size - self._done)
            if handle is not None:
                handle.write(data[at:at + take])
                kept += take
            self._done += take
            at += take
        return kept

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        self._close()


def exchange_files(part_dir: Path, plan: ReadOncePlan, sizes: dict[str, int], *, rank: int, workers: int,
                   keep: frozenset[str], concat_over_workers: Callable[[tf.Tensor], tf.Tensor],
                   chunk_bytes: int = CHUNK_BYTES) -> int:
    """Send every rank's data files of ``plan`` to every other rank: each round, every rank
    puts the next ``chunk_bytes`` of its own files (in plan order, one stream) in, and one
    all-gather hands every rank everyone's. Writes into ``part_dir`` the files in ``keep``
    (this rank's missing ones); returns the bytes written. Every rank calls it with the same
    plan and sizes, so the rounds pair up."""
    if chunk_bytes <= 0 or chunk_bytes % 4:
        raise ValueError(f"Received chunk_bytes={chunk_bytes}; expected a positive multiple of 4")
    owned = [[(name, sizes[name]) for name, owner in plan.owners if owner == r] for r in range(workers)]
    totals = [sum(size for _, size in files) for files in owned]
    streams = [_Stream(part_dir, files, write=r != rank, keep=keep) for r, files in enumerate(owned)]
    received = 0
    for name in keep:  # an empty data file gets no bytes below, yet must exist
        (part_dir / name).write_bytes(b"")
    if not max(totals):
        return 0
    try:
        # Every round the same shape, the last one padded: one trace of the collective, not
        # two (tracing an all-gather under MultiWorkerMirroredStrategy is not free).
        width = min(chunk_bytes, -(-max(totals) // 4) * 4)
        for start in range(0, max(totals), width):
            words = np.zeros(width // 4, dtype=np.int32)
            mine = max(0, min(width, totals[rank] - start))
            if mine:
                words.view(np.uint8)[:mine] = np.frombuffer(streams[rank].read(mine), dtype=np.uint8)
            rows = np.ascontiguousarray(concat_over_workers(tf.constant(words)).numpy()).reshape(workers, -1)
            for r in range(workers):
                theirs = max(0, min(width, totals[r] - start))
                if r != rank and theirs:
                    received += streams[r].write(memoryview(rows[r].view(np.uint8))[:theirs])
    finally:
        for stream in streams:
            stream.close()
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
    ``workers``, ``gather`` (every rank's int, one all-reduce) and ``concat_over_workers``
    (every rank's tensor, concatenated by rank: one all-gather).
    ``unable``: why read-once cannot run here whatever the checkpoint (None: it can)."""

    store: CheckpointStore
    rank: int
    workers: int
    gather: Callable[[int], list[int]]
    concat_over_workers: Callable[[tf.Tensor], tf.Tensor]
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
            received = exchange_files(part.path, plan, sizes, rank=self.rank, workers=self.workers,
                                      keep=part.missing, concat_over_workers=self.concat_over_workers,
                                      chunk_bytes=self.chunk_bytes)
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
