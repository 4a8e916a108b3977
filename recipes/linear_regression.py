"""The tiny regression from the TF1 -> TF2 multi-worker migration guide (a seed note).

``Dense(1)`` on two features, mean squared error, Adagrad(0.05): the guide's model, used
here for fast tests. The guide's three examples are tiled into a larger table so every
worker's shard has data; batches are drawn by a shuffle seeded from (seed, epoch). The
evaluation set is the guide's three examples once each (uneven shards on 2 workers: 2 and 1).
"""

import keras
import numpy as np
import tensorflow as tf

DEFAULTS = {"epochs": 3, "steps_per_epoch": 10, "global_batch_size": 4, "save_every_steps": 5}
PARAMS = {"learning_rate": 0.05, "fail_at_step": -1}

FEATURES = [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]]
LABELS = [[0.3], [0.5], [0.7]]


def build_model(params):
    return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])


def build_optimizer(params):
    return keras.optimizers.Adagrad(learning_rate=params["learning_rate"])


def loss(labels, predictions):
    return tf.reduce_mean(tf.square(labels - predictions), axis=-1)


def dataset(input_context, epoch, seed):
    features = np.tile(np.asarray(FEATURES, np.float32), (8, 1))
    labels = np.tile(np.asarray(LABELS, np.float32), (8, 1))
    fail_at = input_context.params["fail_at_step"]
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(len(features), seed=seed * 1000 + epoch).repeat()
    ds = ds.batch(input_context.per_replica_batch_size, drop_remainder=True)
    if fail_at >= 0:  # for tests of the crash-loop detector: a recipe bug at a fixed step
        def check(step, batch):
            tf.debugging.assert_less(step, tf.constant(fail_at, tf.int64), message="recipe bug: fail_at_step reached")
            return batch
        ds = ds.enumerate().map(check)
    return ds


def eval_dataset(input_context, seed):
    ds = tf.data.Dataset.from_tensor_slices((np.asarray(FEATURES, np.float32), np.asarray(LABELS, np.float32)))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.per_replica_batch_size)
