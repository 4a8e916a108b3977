"""An input-bound recipe whose dataset positions itself (``start_step``), for re-entry.

Each example is a synthetic 256x256 RGB image (stateless random, a pure function of
(seed, epoch, shard, batch index)), blurred and resized to 16x16 before a small model sees
it: producing a batch costs far more than training on it. ``dataset`` accepts
``start_step`` and starts its index range there, BEFORE the expensive ``map``, so resuming
at batch k of an epoch costs one batch, not k (runner/input/data.py). tests/recipes/input_bound_skip.py is the same recipe without
``start_step``: the runner ``skip()``s instead (the same batches, the old cost).
``start_log``: a file each dataset() call appends "<epoch> <start_step>" to (tests check
which path ran).
"""

import keras
import tensorflow as tf

DEFAULTS = {"epochs": 2, "steps_per_epoch": 12, "global_batch_size": 8, "save_every_steps": 4}
PARAMS = {"learning_rate": 0.05, "image_size": 256, "start_log": ""}

CLASSES = 4
SIDE = 16


def build_model(params):
    return keras.Sequential([
        keras.Input(shape=(SIDE, SIDE, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES),
    ])


def build_optimizer(params):
    return keras.optimizers.SGD(learning_rate=params["learning_rate"])


def loss(labels, predictions):
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def batches(input_context, epoch, seed, first):
    """Batches ``first, first + 1, ...`` of the epoch (batch k is the same from any first)."""
    size = int(input_context.params["image_size"])
    batch = input_context.per_replica_batch_size
    shard_seed = (seed * 1000 + epoch) * 1000 + input_context.input_pipeline_id

    def make(index):
        key = tf.stack([tf.cast(shard_seed, tf.int64), index])
        images = tf.random.stateless_uniform((batch, size, size, 3), seed=key)
        blurred = tf.nn.avg_pool2d(images, ksize=5, strides=1, padding="SAME")
        small = tf.image.resize(blurred, (SIDE, SIDE))
        labels = tf.random.stateless_uniform((batch,), seed=key + 1, maxval=CLASSES, dtype=tf.int64)
        return small, labels

    return tf.data.Dataset.range(first, 1 << 31).map(make)


def log_start(input_context, epoch, start_step):
    if input_context.params["start_log"]:
        with open(input_context.params["start_log"], "a") as handle:
            handle.write(f"{epoch} {start_step}\n")


def dataset(input_context, epoch, seed, start_step=0):
    log_start(input_context, epoch, start_step)
    return batches(input_context, epoch, seed, start_step)
