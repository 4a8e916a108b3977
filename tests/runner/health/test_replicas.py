"""The replicas' comparison (runner/health/replicas.py) and the bit flip that tests it
(runner/health/injection.py ``BitFlip``): pure logic and single-process TensorFlow. The real
workers' end to end: tests/integration/test_numerical_health.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import ConfigError
from resilient_train.job.config import JobConfig
from resilient_train.runner.failures.faults import FaultPlan
from resilient_train.runner.health.detector import REPLICAS, Anomaly
from resilient_train.runner.health.injection import BitFlip
from resilient_train.runner.health.replicas import SLOT_BITS, SLOTS, Mismatch, ReplicaCheck, odd_replicas, weights_hash


def hash_of(*arrays: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in weights_hash([tf.Variable(a) for a in arrays]).numpy())


def flipped(array: np.ndarray, index: int, bit: int) -> np.ndarray:
    out = np.array(array, dtype=np.float32)
    out.reshape(-1).view(np.uint32)[index] ^= np.uint32(1 << bit)
    return out


WEIGHTS = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
BIAS = np.random.default_rng(1).standard_normal(64).astype(np.float32)


def test_equal_weights_hash_equal_and_every_single_flip_tried_changes_the_hash():
    base = hash_of(WEIGHTS, BIAS)
    assert base == hash_of(WEIGHTS.copy(), BIAS.copy())
    assert all(0 <= slot < (1 << SLOT_BITS) for slot in base) and len(base) == SLOTS
    for index in (0, 1, 63, 1023, 4095):
        for bit in (0, 22, 23, 30, 31):  # mantissa, the exponent's lowest and highest bits, the sign
            assert hash_of(flipped(WEIGHTS, index, bit), BIAS) != base, (index, bit)
    assert hash_of(WEIGHTS, flipped(BIAS, 5, 23)) != base
    assert hash_of(BIAS, WEIGHTS) != hash_of(WEIGHTS, BIAS)  # the variables' order counts
    swapped = WEIGHTS.copy()
    swapped[0, 0], swapped[0, 1] = WEIGHTS[0, 1], WEIGHTS[0, 0]
    assert hash_of(swapped, BIAS) != base  # so do the positions


@pytest.mark.parametrize("hashes, odd", [
    ([(1, 2), (1, 2)], []),
    ([(1, 2)], []),
    ([(1, 2), (1, 3)], [0, 1]),  # two replicas: no majority, both named
    ([(1, 2), (1, 2), (9, 2)], [2]),
    ([(1, 2), (5, 5), (1, 2), (1, 2)], [1]),
    ([(1, 2), (1, 2), (3, 3), (3, 3)], [0, 1, 2, 3]),  # a tie: every replica
])
def test_the_odd_replicas_are_those_outside_a_strict_majority(hashes, odd):
    assert odd_replicas(hashes) == odd


def check(every: int = 100, *, replicas: int = 4, local: int = 2) -> ReplicaCheck:
    return ReplicaCheck([], every=every, rank=0, replicas=replicas, local_replicas=local,
                        sum_over_workers=lambda t: t, strategy=tf.distribute.get_strategy())


def test_calls_end_at_every_multiple_of_k_and_0_checks_only_at_saves():
    assert check(100).call_length(global_step=95, max_steps=20) == 5
    assert check(100).call_length(global_step=100, max_steps=20) == 20
    assert [s for s in range(1, 301) if check(100).due(s)] == [100, 200, 300]
    assert check(0).call_length(global_step=95, max_steps=20) == 20
    assert not any(check(0).due(s) for s in range(1, 301))


def test_reading_the_summed_block_names_the_replicas_and_their_workers():
    rows = np.array([[7, 8], [7, 8], [7, 8], [7, 9]], dtype=np.float32)  # replica 3 = rank 1's second
    checker = check(replicas=4, local=2)
    assert checker.width == 8
    assert checker.read(rows.reshape(-1), 40) == Mismatch(replicas=(3,), ranks=(1,))
    assert checker.checked_at is None
    assert checker.read(np.full(8, 7, dtype=np.float32), 50) is None
    assert checker.checked_at == 50


def test_a_bad_interval_or_replica_count_is_refused():
    with pytest.raises(ValueError, match=r"Received every=-1; expected an integer >= 0"):
        check(-1)
    with pytest.raises(ValueError, match=r"Received replicas=3, local_replicas=2"):
        check(replicas=3, local=2)


def test_the_option_takes_k_0_or_off_and_refuses_anything_else():
    assert JobConfig(recipe="r.py", replica_check_every="off").replica_check_every == "off"
    assert JobConfig(recipe="r.py", replica_check_every=0).replica_check_every == 0
    assert JobConfig(recipe="r.py").replica_check_every == 100
    with pytest.raises(ConfigError, match=r"^Received replica_check_every=-2; expected an integer >= 0 or 'off'$"):
        JobConfig(recipe="r.py", replica_check_every=-2)


def test_the_flip_halves_element_0_of_the_first_variable_once_after_the_armed_step_of_this_rank():
    faults = json.dumps([{"point": "bitflip", "global_step": 8, "rank": 1},
                         {"point": "bitflip", "global_step": 3, "rank": 0}])
    flip = BitFlip.from_plan(FaultPlan.from_env({"RT_FAULTS": faults}, rank=1, attempt=1))
    first, second = tf.Variable([1.0, 2.0]), tf.Variable([4.0])
    strategy = tf.distribute.get_strategy()
    flip.before_call(4, [first, second], strategy)  # not yet
    assert first.numpy().tolist() == [1.0, 2.0]
    flip.before_call(10, [first, second], strategy)  # the first call to start at or after step 8
    assert first.numpy().tolist() == [0.5, 2.0] and second.numpy().tolist() == [4.0]  # exponent bit 23: halved
    flip.before_call(12, [first, second], strategy)  # once
    assert first.numpy().tolist() == [0.5, 2.0]


def test_a_replicas_anomaly_describes_who_differs():
    anomaly = Anomaly(global_step=10, epoch=0, step_in_epoch=9, replicas=2, values={}, kind=REPLICAS, ranks=(0, 1))
    assert anomaly.describe() == (
        "the replicas' trainable weights differ at global step 10 (epoch 0, batch 9 of the epoch): 2 replica(s) on "
        "rank(s) 0, 1 differ from the others (silent data corruption, or a model whose copies are not kept equal)")
