"""The host-side collectives one worker makes between calls: a SUM, a gather, a vote.

Everything the workers agree on between training calls (a restore's step, the input's
verdict, an iterator state, a callback's stop, the replicas' check before a save) is one
all-reduce through :attr:`Collectives.sum`. Every worker makes them at the same points in the
same order, so they pair up; each is one collective, never more. The one other is
:attr:`Collectives.concat`, an all-gather: a read-once restore's exchange of checkpoint
files (runner/state/read_once.py), bytes a SUM would move twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["Collectives"]


class Collectives:
    """One worker's SUM all-reduce over every worker, and what is built on it."""

    def __init__(self, strategy: Any, *, rank: int, workers: int) -> None:
        self._rank, self._workers = rank, workers
        self.sum = _sum_over_workers(strategy)
        self.concat = _concat_over_workers(strategy)

    def gather(self, value: int) -> list[int]:
        """Every worker's ``value``, indexed by rank (one all-reduce)."""
        vector = np.zeros(self._workers, dtype=np.float64)
        vector[self._rank] = value
        summed = self.sum(tf.constant(vector))
        return [int(v) for v in summed.numpy()]

    def gather_bytes(self, mine: bytes, sizes: list[int]) -> list[bytes]:
        """Every worker's ``mine`` (of the given sizes), indexed by rank (one all-reduce)."""
        # Four bytes to an int32: each row is one worker's and zero elsewhere, so the SUM is
        # that worker's bits exactly (a byte to an int32 moved 4x the data: 20-35 ms of every
        # capture of digits_cnn's ~580 KB states, against ~8 ms).
        width = -(-max(sizes) // 4)
        rows = np.zeros((self._workers, width * 4), dtype=np.uint8)
        rows[self._rank, :len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        summed = self.sum(tf.constant(rows.view(np.int32)))
        packed = np.ascontiguousarray(summed.numpy()).view(np.uint8)
        return [packed[rank, :size].tobytes() for rank, size in enumerate(sizes)]

    def any(self, flag: bool) -> bool:
        """True on every worker when ``flag`` is true on any (one all-reduce)."""
        return any(self.gather(int(flag)))


def _concat_over_workers(strategy: Any) -> Any:
    """``concat(value)``: every worker's ``value`` (each the same shape), concatenated by rank
    on axis 0 (one all-gather). It moves each worker's bytes once to every other, where a SUM
    with zeros elsewhere moves about twice that: a read-once restore's exchange of data files
    (runner/state/read_once.py). Traced like ``sum_over_workers``."""

    @tf.function(reduce_retracing=True, autograph=False)
    def concat_over_workers(value: tf.Tensor) -> tf.Tensor:
        return strategy.gather(strategy.run(tf.identity, args=(value,)), axis=0)

    return concat_over_workers


def _sum_over_workers(strategy: Any) -> Any:
    """``sum(value)`` over every worker (one all-reduce), as a tf.function.

    Called eagerly, ``strategy.run`` costs a per-call retrace and TensorFlow logs "Using
    CollectiveAllReduceStrategy eagerly has significant overhead" (up to 5 times a process:
    it crowded the root cause's log tail). Traced once per dtype; ``reduce_retracing`` lets
    the iterator-state rows (their width varies with the states' size) share one trace.
    Every worker calls it at the same points in the same order, as it did eagerly, so the
    collectives still pair up.
    """

    @tf.function(reduce_retracing=True, autograph=False)  # nothing to convert: ~20 ms less of the agree phase
    def sum_over_workers(value: tf.Tensor) -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(value,)), axis=None)

    return sum_over_workers
