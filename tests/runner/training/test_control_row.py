"""The packed row's control columns (runner/training/control_row.py): one table, encoded on the host,
summed in the step, decoded after the call. Run under a real 2-replica MirroredStrategy on
two logical CPUs, so the first-replica rule is exercised as in a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from resilient_train.runner.training import control_row
from resilient_train.runner.training.control_row import CONTROL, Votes


_TWO_REPLICAS = """
import json
import tensorflow as tf
from resilient_train.runner.training import control_row
from resilient_train.runner.training.control_row import Votes

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
flags = control_row.encode(Votes(stop=1.0, save=0.0, next_call=12.0, snapshot_every=252.0, capture_every=742.0))

@tf.function
def step():
    def replica():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        nonfinite = tf.cast(tf.equal(replica, 1), tf.float32)  # the second replica saw a NaN
        packed = tf.concat([tf.constant([0.5]), control_row.in_replica(tf.constant(flags), nonfinite)], axis=0)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, packed)
    return strategy.experimental_local_results(strategy.run(replica))[0]

values, summed = control_row.split(step().numpy(), control_row.layout(["loss"]))
print(json.dumps([values, list(summed.__dict__.values())]))
"""


def test_every_worker_columns_count_each_replica_and_chief_columns_only_the_first():
    # A process of its own: logical devices must be set before TensorFlow initializes.
    out = subprocess.run([sys.executable, "-c", _TWO_REPLICAS], capture_output=True, text=True, check=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout
    values, summed = json.loads(out.strip().splitlines()[-1])
    assert values == {"loss": 1.0}  # 0.5 from each replica
    # stop counted per replica, the step's non-finite flag of the one replica, the chief's numbers once
    assert summed == [2.0, 0.0, 1.0, 12.0, 252.0, 742.0]


def test_the_layout_is_the_values_then_the_control_table():
    assert control_row.layout(["loss"]) == ["loss", *(column.name for column in CONTROL)]


def test_split_ignores_the_columns_after_the_named_ones():
    names = control_row.layout(["loss", "accuracy"])
    row = np.array([0.25, 0.75, 0.0, 1.0, 0.0, 7.0, 0.0, 0.0, 123.0, 456.0], dtype=np.float32)  # + 2 comparison columns
    values, summed = control_row.split(row, names)
    assert values == {"loss": 0.25, "accuracy": 0.75}
    assert summed == Votes(stop=0.0, save=1.0, next_call=7.0)


def test_with_several_workers_the_timing_block_follows_the_control_columns_and_sums_per_rank():
    names = control_row.layout(["loss"], workers=2)
    assert names == ["loss", *(column.name for column in CONTROL), "__host_s_rank0__", "__host_s_rank1__",
                     "__stall_s_rank0__", "__stall_s_rank1__"]
    assert control_row.layout(["loss"], workers=1) == control_row.layout(["loss"])  # one worker: no block
    # two steps; + 1 comparison column after the named ones in the last
    rows = np.array([[0.5, 0, 0, 0, 3, 0, 0, 0.001, 0.004, 0.0, 0.02, 0.0],
                     [0.25, 0, 1, 0, 3, 0, 0, 0.001, 0.004, 0.0, 0.03, 9.0]], dtype=np.float32)
    values, summed = control_row.split(rows[1], names)
    assert (values, summed) == ({"loss": 0.25}, Votes(save=1.0, next_call=3.0))
    assert control_row.host_seconds(rows, names) == pytest.approx((0.002, 0.008))
    assert control_row.stall_seconds(rows, names) == pytest.approx((0.0, 0.05))
    assert control_row.stall_seconds(rows, control_row.layout(["loss"])) == ()
    assert control_row.host_seconds(rows, control_row.layout(["loss"])) == ()
