"""Do every replica's trainable weights still hold the same values? (silent data corruption)

Under MultiWorkerMirroredStrategy every replica applies the same all-reduced gradients to its
own copy of the weights, so the copies are equal bit for bit. A flipped bit in one copy (a
faulty core or memory, a bad DMA) breaks that silently: the all-reduce goes on, and the run
ends with other weights than an uninterrupted one (or with the flip committed). So the copies
are compared, exactly, riding the training call's packed all-reduce (no collective of their
own), in the last step of a call that ends at a check: every ``--replica-check-every`` K
global steps, at every step-count save point, every memory-tier snapshot and every epoch end,
so that nothing is saved or snapshotted that was not compared at that step. A save that does
not follow such a call (a time-based or preemption save) compares first, with one all-reduce.

# Implementation:
#   hash (per replica, after the step's update)
#     each trainable variable's exact fingerprint (runner/state/worker_agreement.py: the value's
#     bits times their position, summed in wrapping int64 arithmetic, so independent of the
#     reduction's order), times an odd constant per variable, summed (wrapping), then folded
#     to two slots of 21 bits: bits 0-20 XOR bits 42-62, and bits 21-41.
#     Equal weights always give equal hashes; a flipped bit almost never does (about 2**-42).
#   in the packed float32 all-reduce
#     every replica writes its hash's SLOTS slots of SLOT_BITS bits (exact in float32) into its
#     own row of a [replicas, SLOTS] block, zero elsewhere: the SUM is every replica's hash on
#     every worker. The odd ones out are those that differ from a strict majority (two
#     replicas that differ: both named).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from resilient_train.runner.state.worker_agreement import fingerprint as variable_fingerprint

__all__ = ["ReplicaCheck", "tf_variable_of", "odd_replicas", "SLOTS", "SLOT_BITS"]

SLOT_BITS = 21  # a replica's slot: an exact float32 integer, also when SUMmed with zeros
SLOTS = 2  # 42 bits of hash per replica
_MASK = (1 << SLOT_BITS) - 1
_VARIABLE_MULTIPLIER = 0xC2B2AE3D27D4EB4F  # odd: variable k is weighted by (2k + 1) times it, mod 2**64


def _weight(k: int) -> int:
    """Variable ``k``'s odd weight, as an int64."""
    weight = ((2 * k + 1) * _VARIABLE_MULTIPLIER) % (1 << 64)
    return weight - (1 << 64) if weight >= 1 << 63 else weight


def tf_variable_of(variable: Any) -> Any:
    """A Keras variable's TensorFlow variable (under a strategy: the mirrored one); others as they are."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _fold(total: tf.Tensor) -> tf.Tensor:
    """A wrapping int64 sum folded into SLOTS slots of SLOT_BITS bits (int64 [SLOTS])."""
    mask = tf.constant(_MASK, tf.int64)
    words = [tf.bitwise.bitwise_and(tf.bitwise.right_shift(total, k * SLOT_BITS), mask)
             for k in range(64 // SLOT_BITS)]  # 3 windows of 21 bits (bit 63 left out)
    return tf.stack([tf.bitwise.bitwise_xor(words[0], words[2]), words[1]])


def weights_hash(variables: Sequence[Any]) -> tf.Tensor:
    """In-graph: this replica's hash of ``variables`` (their current values), int64 [SLOTS]."""
    total = tf.constant(0, tf.int64)
    for k, variable in enumerate(variables):
        total += variable_fingerprint(tf_variable_of(variable).read_value(), bits=64) * tf.constant(_weight(k), tf.int64)
    return _fold(total)


def odd_replicas(hashes: Sequence[tuple[int, ...]]) -> list[int]:
    """The replicas whose hash differs from a strict majority's (all of them when no hash has
    a strict majority); empty when every replica's hash is the same."""
    counts = Counter(hashes)
    if len(counts) <= 1:
        return []
    common, count = counts.most_common(1)[0]
    if 2 * count <= len(hashes):
        return list(range(len(hashes)))
    return [replica for replica, value in enumerate(hashes) if value != common]


@dataclass(frozen=True)
class Mismatch:
    """Replicas whose trainable weights differ at a global step."""

    replicas: tuple[int, ...]  # the odd ones out (global replica ids)
    ranks: tuple[int, ...]  # their workers


class ReplicaCheck:
    """The comparison of every replica's trainable weights, for one Trainer.

    ``every``: a check at every multiple of this many global steps (0: only where something is
    saved or snapshotted); ``rank``: this worker's; ``replicas``: the strategy's replicas in sync, ``local_replicas``
    this worker's (a replica's worker is its id // local_replicas). ``sum_over_workers``: the
    loop's SUM all-reduce, for the check before a save that follows no checked call.
    """

    def __init__(self, variables: Sequence[Any], *, every: int, rank: int, replicas: int, local_replicas: int,
                 sum_over_workers: Callable[[tf.Tensor], tf.Tensor], strategy: tf.distribute.Strategy) -> None:
        if every < 0:
            raise ValueError(f"Received every={every!r}; expected an integer >= 0")
        if replicas < 1 or local_replicas < 1 or replicas % local_replicas:
            raise ValueError(f"Received replicas={replicas!r}, local_replicas={local_replicas!r}; expected "
                             "replicas >= 1, a multiple of local_replicas >= 1")
        # Only what MWMS keeps equal by construction: mirrored trainable variables (a
        # sync-on-read one is each replica's own part).
        # (A Keras variable's TensorFlow variable: the strategy's mirrored one.)
        self._variables = [tf_variable for tf_variable in (tf_variable_of(v) for v in variables)
                           if getattr(tf_variable, "synchronization", None) != tf.VariableSynchronization.ON_READ]
        self.every = every
        self._rank, self._replicas, self._local = rank, replicas, local_replicas
        self._sum = sum_over_workers
        self._strategy = strategy
        self.checked_at: int | None = None  # the newest global step found equal
        self._local_hashes: Callable[[], tf.Tensor] | None = None

    @property
    def width(self) -> int:
        """Columns :meth:`columns` adds to the packed row."""
        return self._replicas * SLOTS

    def call_length(self, *, global_step: int, max_steps: int) -> int:
        """A call also ends at the next multiple of ``every``."""
        if not self.every:
            return max_steps
        return min(max_steps, self.every - global_step % self.every)

    def due(self, call_ends: int) -> bool:
        """Is a multiple of ``every`` the coming call's end? (Saves, snapshots and epoch ends
        are the caller's: TrainCall.run.)"""
        return bool(self.every) and call_ends % self.every == 0

    def columns(self) -> tf.Tensor:
        """In the step (replica context, after the optimizer's update): this replica's hash in
        its own row of the [replicas, SLOTS] block, flattened (float32, exact)."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        mine = tf.cast(weights_hash(self._variables), tf.float32)
        block = tf.one_hot(replica, self._replicas, dtype=tf.float32)[:, None] * mine[None, :]
        return tf.reshape(block, [-1])

    def read(self, summed: np.ndarray, global_step: int) -> Mismatch | None:
        """The call's summed :meth:`columns`: None when every replica agrees (then
        ``checked_at`` is ``global_step``), else who differs."""
        hashes = [tuple(int(round(v)) for v in row) for row in np.asarray(summed).reshape(self._replicas, SLOTS)]
        return self._judge(hashes, global_step)

    def compare_now(self, global_step: int) -> Mismatch | None:
        """Before a save that follows no checked call: the same comparison with one all-reduce
        of its own (every worker calls it, at the same save). Nothing when the newest check
        was at this step already."""
        if self.checked_at == global_step:
            return None
        if self._local_hashes is None:
            local_variables = [self._strategy.experimental_local_results(v) for v in self._variables]

            @tf.function(autograph=False)
            def local_hashes() -> tf.Tensor:  # [local replicas, SLOTS]
                return tf.stack([weights_hash([copies[k] for copies in local_variables])
                                 for k in range(self._local)])

            self._local_hashes = local_hashes
        mine = self._local_hashes().numpy().astype(np.float64)
        first = self._rank * self._local
        block = np.zeros((self._replicas, SLOTS), dtype=np.float64)
        block[first:first + self._local] = mine
        summed = self._sum(tf.constant(block)).numpy()
        hashes = [tuple(int(v) for v in row) for row in summed]
        return self._judge(hashes, global_step)

    def _judge(self, hashes: list[tuple[int, ...]], global_step: int) -> Mismatch | None:
        odd = odd_replicas(hashes)
        if not odd:
            self.checked_at = global_step
            return None
        return Mismatch(replicas=tuple(odd), ranks=tuple(sorted({r // self._local for r in odd})))
