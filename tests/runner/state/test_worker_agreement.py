"""The memory tier's comparison of every worker's snapshot (runner/state/worker_agreement.py):
exact fingerprints, and an exact equality test through a SUM all-reduce."""

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.runner.state.worker_agreement import (FINGERPRINT_BITS, WorkerAgreement, differing,
                                                           divergence_reason, limb_columns)

TOP = (1 << FINGERPRINT_BITS) - 1


def summed(*rows):
    return np.sum([limb_columns(r) for r in rows], axis=0)


def test_equal_fingerprints_on_every_worker_agree():
    rows = [[0, TOP, 123456789]] * 3
    assert differing(summed(*rows), workers=3, names=["a", "b", "c"]) == []


@pytest.mark.parametrize("other", [1, 1 << 20, 1 << 40, TOP - 1])
def test_a_fingerprint_differing_in_any_limb_is_named(other):
    assert differing(summed([0, 5], [other, 5], [0, 5]), workers=3, names=["a", "b"]) == ["a"]


def test_differences_that_cancel_in_the_sum_are_still_found():
    # 1 + 3 == 2 + 2: a plain SUM of fingerprints cannot tell; the squares can.
    assert differing(summed([1], [3]), workers=2, names=["a"]) == ["a"]
    assert differing(summed([2], [2]), workers=2, names=["a"]) == []


def test_bad_fingerprints_and_worker_counts_are_refused():
    with pytest.raises(ValueError, match=r"Received fingerprint -1; expected an integer in \[0, 2\*\*52\)"):
        limb_columns([-1])
    with pytest.raises(ValueError, match=r"Received workers=0; expected 1 <= workers < 8192"):
        differing(summed([1]), workers=0, names=["a"])


def test_the_reason_names_the_variables():
    assert divergence_reason(["bn/moving_mean", "bn/moving_variance"]) == (
        "this model's variables differ between workers (bn/moving_mean, bn/moving_variance): "
        "only the chief's state is the run's")
    assert divergence_reason([f"v{i}" for i in range(6)]) == (
        "this model's variables differ between workers (v0, v1, v2, v3, ... (6 in all)): "
        "only the chief's state is the run's")


def agreement(values, *, trainable=False, path="/model/v", sum_over_workers=lambda t: t):
    pairs = [(f"{path}{i}", tf.Variable(v, trainable=trainable), tf.Variable(v)) for i, v in enumerate(values)]
    return WorkerAgreement(pairs, workers=2, sum_over_workers=sum_over_workers)


def two_workers(mine, theirs):
    """``mine``'s comparison, with a peer holding ``theirs`` (its row added by the fake all-reduce)."""
    peer = agreement(theirs)
    return agreement(mine, sum_over_workers=lambda t: t + tf.constant(peer.row()[1])).compare()


VALUES = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3, -7], dtype=np.int64),
          np.array([True, False]), np.array([0.5, -0.0], dtype=np.float16), np.float64(2.5)]


def test_equal_values_of_every_dtype_agree():
    assert two_workers(VALUES, [v.copy() if hasattr(v, "copy") else v for v in VALUES]) == []


@pytest.mark.parametrize("index, changed", [
    (0, np.nextafter(np.arange(6, dtype=np.float32), np.float32(9)).reshape(2, 3)),  # one ulp each
    (0, np.arange(6, dtype=np.float32)[::-1].reshape(2, 3)),  # the same values, permuted
    (1, np.array([3, -6], dtype=np.int64)),
    (2, np.array([False, True])),
    (3, np.array([0.5, 0.0], dtype=np.float16)),  # -0.0 and 0.0: other bits
    (4, np.float64(2.5000000000000004)),
])
def test_any_difference_is_named(index, changed):
    theirs = list(VALUES)
    theirs[index] = changed
    assert two_workers(VALUES, theirs) == [f"/model/v{index}"]


def test_later_comparisons_skip_the_trainable_weights_and_the_optimizer():
    sent = []

    def record(t):
        sent.append(t.shape[0])
        return t * 2  # the peer holds the same

    pairs = [("/model/kernel", tf.Variable([1.0], trainable=True), tf.Variable([1.0])),
             ("/optimizer/m", tf.Variable([1.0], trainable=False), tf.Variable([1.0])),
             ("/model/moving_mean", tf.Variable([1.0], trainable=False), tf.Variable([1.0]))]
    checks = WorkerAgreement(pairs, workers=2, sum_over_workers=record)
    assert [checks.compare(), checks.compare(), checks.compare()] == [[], [], []]
    assert sent == [3 * 6, 1 * 6, 1 * 6]


def test_variables_are_named_by_the_label():
    pairs = [("/model/_functional/_operations/4/moving_mean", tf.Variable([1.0], trainable=False), tf.Variable([1.0]))]
    checks = WorkerAgreement(pairs, workers=2, sum_over_workers=lambda t: t + tf.constant(limb_columns([7])),
                             label=lambda path, live: "batch_normalization/moving_mean")
    assert checks.compare() == ["batch_normalization/moving_mean"]


# ------------------------------------------------ the comparison in the training call
def test_call_limbs_are_limb_columns_in_float32():
    from resilient_train.runner.state.worker_agreement import CALL_LIMB_BITS, CALL_LIMBS, call_limbs

    for value in (0, 1, 255, 256, 123456789012345, TOP):
        columns = call_limbs(tf.constant(value, tf.int64)).numpy()
        assert columns.dtype == np.float32
        assert columns.tolist() == limb_columns([value], limbs=CALL_LIMBS, limb_bits=CALL_LIMB_BITS).tolist()


def in_call(values, *, counters=(), sync_on_read=()):
    live = [tf.Variable(v, trainable=False) for v in values]
    live += [tf.Variable(v, trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                         aggregation=tf.VariableAggregation.SUM) for v in sync_on_read]
    live += list(counters)
    pairs = [(f"/model/v{i}", v, tf.Variable(v.read_value())) for i, v in enumerate(live)]
    return WorkerAgreement(pairs, workers=2, sum_over_workers=lambda t: t + t, counters=counters)


def test_later_comparisons_read_the_calls_summed_columns():
    counter = tf.Variable(7, dtype=tf.int64, trainable=False)
    mine = in_call([[1.0, 2.0], [3]], counters=[counter], sync_on_read=[[5.0]])
    with pytest.raises(RuntimeError, match="the first comparison"):
        mine.compare_in_call(np.zeros(0))
    assert mine.compare() == []  # the attempt's first comparison: its own all-reduce (every variable)
    # The counter (advanced after the call's all-reduce) and the sync-on-read variable (a
    # replica's own part live) are not in the call's columns: two variables, 7 limbs, [l, l*l].
    assert mine.call_columns().shape == (2 * 7 * 2,) and mine.call_width == 2 * 7 * 2
    peer_equal = in_call([[1.0, 2.0], [3]], counters=[tf.Variable(9, dtype=tf.int64)], sync_on_read=[[6.0]])
    peer_other = in_call([[1.0, 2.5], [3]])
    assert mine.compare_in_call((mine.call_columns() + peer_equal.call_columns()).numpy()) == []
    assert mine.compare_in_call((mine.call_columns() + peer_other.call_columns()).numpy()) == ["/model/v0"]
    assert mine.compared == 3


def test_more_replicas_than_float32_sums_hold_compare_with_their_own_all_reduce():
    from resilient_train.runner.state.worker_agreement import MAX_CALL_REPLICAS

    pairs = [("/model/v0", tf.Variable([1.0], trainable=False), tf.Variable([1.0]))]
    many = WorkerAgreement(pairs, workers=2, sum_over_workers=lambda t: t, replicas=MAX_CALL_REPLICAS + 1)
    assert not many.in_call and many.call_columns().shape == (0,)
    assert WorkerAgreement(pairs, workers=2, sum_over_workers=lambda t: t, replicas=MAX_CALL_REPLICAS).in_call
