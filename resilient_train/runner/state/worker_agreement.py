"""Do every worker's snapshots hold the same values? (the memory tier's rescue by a non-chief)

The run's state is the chief's: every ordinary commit is the chief's. Under
MultiWorkerMirroredStrategy the weights and the optimizer's slots are equal on every worker
(all-reduced gradients), but a variable each worker updates from its own batches is not:
BatchNormalization's moving_mean / moving_variance are updated per worker (they are not
sync-on-read under Keras 3). A non-chief's snapshot of such a model is not the run's
state, and committing it as a rescue ends the run with other weights than the
uninterrupted run's. So after a snapshot every worker took at the same call, the workers
compare exact fingerprints of the snapshot's variables, in one small all-reduce.

# Implementation:
#   fingerprint (per variable, on its twin: what a rescue would commit)
#     the value's bits as integers (float16/32/64 bitcast to int16/32/64, integers and
#     bools cast), widened to int64, times (position + 1) * an odd constant, summed: int64
#     arithmetic wraps mod 2**64 and is associative, so the sum does not depend on the
#     reduction's order; kept mod 2**52. Equal values always give equal fingerprints;
#     different values equal ones with a chance of about 2**-52 per variable.
#   comparison with the SUM all-reduce the loop already has (no MAX there)
#     each fingerprint is cut into LIMBS limbs of LIMB_BITS bits; a worker contributes, per
#     limb, [l, l*l]; summed over W workers: S1 = sum l, S2 = sum l*l, all exact in
#     float64 (l*l < 2**40, W < 2**12). By Cauchy-Schwarz W*S2 == S1*S1 iff every worker's
#     l is the same: compared in Python integers, exactly.
#   which variables
#     the first comparison of an attempt covers every saved variable; later ones (every
#     snapshot after, a model may diverge later) only those outside the trainable weights
#     and the optimizer (which MWMS keeps equal by construction): the per-snapshot cost is
#     then that of the small non-trainable variables and one all-reduce of 6 numbers each.
#     Every worker derives both lists from the same graph, so the all-reduces pair up.
#   the later comparisons ride the training call (no collective of their own)
#     a separate all-reduce cost 3-9 ms per snapshot on this machine, more than the rest of a
#     snapshot (~2 ms) and so most of what decides auto's interval. So the may-differ
#     variables (not sync-on-read: their snapshot is already the all-workers' value) are
#     fingerprinted in the last training step of a call that ends at a snapshot (a variant
#     of the loop's training call; no other step carries them), after the optimizer's update, and their
#     CALL_LIMBS limbs of CALL_LIMB_BITS bits, [l, l*l], join the step's packed float32
#     all-reduce (exact: l*l * replicas < 2**24 for up to MAX_CALL_REPLICAS replicas).
#     That step's sums describe the live variables at the call's end, which is exactly
#     what the snapshot right after the call copies: compare_in_call reads them. The runner's
#     counters (global_step, step_in_epoch), advanced after that all-reduce, are agreed by
#     construction and left out. A save (which may follow callbacks or an evaluation, not
#     only a call) still compares with its own all-reduce.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

__all__ = ["WorkerAgreement", "fingerprint", "limb_columns", "differing", "divergence_reason", "LIMB_BITS", "LIMBS",
           "FINGERPRINT_BITS", "CALL_LIMB_BITS", "CALL_LIMBS", "MAX_CALL_REPLICAS"]

FINGERPRINT_BITS = 52
LIMB_BITS = 20
LIMBS = 3  # 3 * 20 >= 52
CALL_LIMB_BITS = 8  # in the training call's float32 all-reduce: l*l < 2**16
CALL_LIMBS = 7  # 7 * 8 >= 52
MAX_CALL_REPLICAS = ((1 << 24) - 1) // (255 * 255)  # 258: sums of l*l stay exact in float32
_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # odd, as an int64: spreads positions over the bits
_BITS_OF = {2: tf.int16, 4: tf.int32, 8: tf.int64}
MAX_NAMED = 4  # variables named in the reason (the event lists them all)


def limb_columns(fingerprints: Sequence[int], *, limbs: int = LIMBS, limb_bits: int = LIMB_BITS) -> np.ndarray:
    """This worker's row of the all-reduce: per fingerprint, per limb, [l, l*l] (float64, exact)."""
    out = np.zeros((len(fingerprints), limbs, 2), dtype=np.float64)
    mask = (1 << limb_bits) - 1
    for i, value in enumerate(fingerprints):
        value = int(value)
        if not 0 <= value < (1 << FINGERPRINT_BITS):
            raise ValueError(f"Received fingerprint {value!r}; expected an integer in [0, 2**{FINGERPRINT_BITS})")
        for k in range(limbs):
            limb = (value >> (k * limb_bits)) & mask
            out[i, k] = (limb, limb * limb)
    return out.reshape(-1)


def differing(summed: np.ndarray, *, workers: int, names: Sequence[str], limbs: int = LIMBS,
              limb_bits: int = LIMB_BITS) -> list[str]:
    """The names whose fingerprints are not the same on every worker, from the summed columns."""
    if workers < 1 or workers >= (1 << (53 - 2 * limb_bits)):
        raise ValueError(f"Received workers={workers!r}; expected 1 <= workers < {1 << (53 - 2 * limb_bits)}")
    sums = np.asarray(summed, dtype=np.float64).reshape(len(names), limbs, 2)
    out = []
    for name, limbs in zip(names, sums):
        if any(workers * int(s2) != int(s1) * int(s1) for s1, s2 in limbs):
            out.append(name)
    return out


def divergence_reason(names: Sequence[str]) -> str:
    """The rescue_skipped reason of a non-chief whose snapshots differ from the chief's."""
    shown = ", ".join(names[:MAX_NAMED]) + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMED else "")
    return f"this model's variables differ between workers ({shown}): only the chief's state is the run's"


def call_limbs(fingerprint: tf.Tensor) -> tf.Tensor:
    """In-graph: a fingerprint's CALL_LIMBS limbs as float32 [l, l*l] pairs (limb_columns' layout)."""
    mask = tf.constant((1 << CALL_LIMB_BITS) - 1, tf.int64)
    limbs = tf.cast(tf.stack([tf.bitwise.bitwise_and(tf.bitwise.right_shift(fingerprint, k * CALL_LIMB_BITS), mask)
                              for k in range(CALL_LIMBS)]), tf.float32)
    return tf.reshape(tf.stack([limbs, limbs * limbs], axis=1), [-1])


def fingerprint(value: tf.Tensor, *, bits: int = FINGERPRINT_BITS) -> tf.Tensor:
    """In-graph: ``value``'s exact fingerprint, an int64 kept mod 2**bits (64: all of the
    wrapping sum; runner/health/replicas.py folds it itself)."""
    dtype = value.dtype
    if dtype.is_floating and dtype.size in _BITS_OF:
        as_int = tf.bitcast(value, _BITS_OF[dtype.size])
    elif dtype.is_integer or dtype.is_bool:
        as_int = value
    else:
        return tf.constant(0, tf.int64)  # (strings, resources: never compared)
    as_int = tf.cast(tf.reshape(as_int, [-1]), tf.int64)
    positions = tf.range(1, tf.size(as_int, out_type=tf.int64) + 1, dtype=tf.int64)
    total = tf.reduce_sum(as_int * (positions * tf.constant(_MULTIPLIER, tf.int64)))
    return total if bits >= 64 else tf.bitwise.bitwise_and(total, tf.constant((1 << bits) - 1, tf.int64))


class WorkerAgreement:
    """Compares one worker's snapshot with every other worker's.

    ``pairs``: the twin's ``(checkpoint path, live variable, twin variable)`` (TwinState.pairs).
    ``sum_over_workers``: the loop's SUM all-reduce of a float64 tensor.
    ``label(path, live)``: a variable's name in what ``compare`` returns (default: its path).
    ``compare()`` after each snapshot every worker took at the same call: the names of the
    variables that differ (empty: all equal). The first call compares every variable, the
    later ones only those that MWMS does not keep equal (module docstring).
    """

    def __init__(self, pairs: Sequence[tuple[str, Any, Any]], *, workers: int,
                 sum_over_workers: Callable[[tf.Tensor], tf.Tensor],
                 label: Callable[[str, Any], str] = lambda path, live: path,
                 counters: Sequence[Any] = (), replicas: int | None = None) -> None:
        self._workers = workers
        self._sum = sum_over_workers
        every = [(label(path, live), twin) for path, live, twin in pairs]
        may_differ = [(path, live, twin) for path, live, twin in pairs
                      if not path.startswith("/optimizer/") and not getattr(live, "trainable", False)]
        self._every = self._compiled(every)
        self._may_differ = self._compiled([(label(path, live), twin) for path, live, twin in may_differ])
        # Compared in the training call (module docstring): live reads, so not the sync-on-read
        # ones (a replica's own part) nor the runner's counters (advanced after the all-reduce).
        skip = {id(c) for c in counters}
        self._replicas = workers if replicas is None else replicas
        in_call = [(label(path, live), live) for path, live, _ in may_differ
                   if id(live) not in skip
                   and getattr(live, "synchronization", None) != tf.VariableSynchronization.ON_READ]
        self.in_call = self._replicas <= MAX_CALL_REPLICAS
        self._in_call_names = [name for name, _ in in_call] if self.in_call else []
        self._in_call_live = [live for _, live in in_call] if self.in_call else []
        self.compared = 0

    @property
    def call_width(self) -> int:
        """How many columns :meth:`call_columns` returns."""
        return len(self._in_call_live) * CALL_LIMBS * 2

    def call_columns(self) -> tf.Tensor:
        """In the training step (replica context, after the optimizer's update): this replica's
        float32 columns for the call's packed all-reduce (empty when nothing is compared there)."""
        if not self._in_call_live:
            return tf.zeros([0], tf.float32)
        return tf.concat([call_limbs(fingerprint(v.read_value())) for v in self._in_call_live], axis=0)

    def compare_in_call(self, summed: np.ndarray) -> list[str]:
        """After a snapshot taken right after a call (not the attempt's first comparison,
        which covers every variable with its own all-reduce: :meth:`compare`): the names
        that differ, from the call's last summed ``call_columns``."""
        if self.compared == 0 or not self.in_call:
            raise RuntimeError("compare_in_call: the first comparison (and replicas over "
                               f"{MAX_CALL_REPLICAS}) needs compare()")
        self.compared += 1
        if not self._in_call_names:
            return []
        return differing(summed, workers=self._replicas, names=self._in_call_names, limbs=CALL_LIMBS,
                         limb_bits=CALL_LIMB_BITS)

    @staticmethod
    def _compiled(named: list[tuple[str, Any]]) -> tuple[list[str], Callable[[], tf.Tensor] | None]:
        names, variables = [name for name, _ in named], [v for _, v in named]
        if not variables:
            return names, None

        @tf.function(autograph=False)
        def fingerprints() -> tf.Tensor:
            with tf.device(variables[0].device):
                return tf.stack([fingerprint(v.read_value()) for v in variables])

        return names, fingerprints

    def row(self) -> tuple[list[str], np.ndarray]:
        """The next comparison's variable names and this worker's columns (nothing sent)."""
        names, fingerprints = self._every if self.compared == 0 else self._may_differ
        if fingerprints is None:
            return names, np.zeros(0, dtype=np.float64)
        return names, limb_columns(fingerprints().numpy().tolist())

    def compare(self) -> list[str]:
        names, mine = self.row()
        if self.compared == 0 and self._may_differ[1] is not None and not self.in_call:
            self._may_differ[1]()  # traced now: no later snapshot (which auto times) pays for it
        self.compared += 1
        if not names:  # (the same on every worker: none of them all-reduces)
            return []
        summed = self._sum(tf.constant(mine)).numpy()
        return differing(summed, workers=self._workers, names=names)
