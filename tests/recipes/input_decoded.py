"""An ordinary input pipeline, ``range -> map -> batch``, with no ``start_step``, for re-entry.

Each example is a synthetic 256x256 RGB image (stateless random, a pure function of
(seed, epoch, example index)), "decoded" (blurred) and resized to 32x32 by a parallel
``map``, then batched: the usual shape of an image pipeline without a shuffle buffer. It
does not take ``start_step``, so a mid-epoch resume restores each worker's tf.data iterator
state; with symbolic checkpointing (runner/input/reentry.py) that state is the positions
(975 bytes per worker), not the prefetched 32x32 batches it held before (348-397 KB, over the
old 256 KiB bound, so it fell back to ``skip()``, which decodes every skipped image again).
``start_log``: a file each dataset() call appends "<epoch>" to (tests count the builds).
"""

import keras
import tensorflow as tf

DEFAULTS = {"epochs": 2, "steps_per_epoch": 12, "global_batch_size": 8, "save_every_steps": 4}
PARAMS = {"learning_rate": 0.05, "image_size": 256, "start_log": ""}

CLASSES = 4
SIDE = 32


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


def dataset(input_context, epoch, seed):
    if input_context.params["start_log"]:
        with open(input_context.params["start_log"], "a") as handle:
            handle.write(f"{epoch}\n")
    size = int(input_context.params["image_size"])
    epoch_seed = tf.constant((seed * 1000 + epoch) * 1000, tf.int64)

    def decode(index):
        key = tf.stack([epoch_seed, index])
        image = tf.random.stateless_uniform((1, size, size, 3), seed=key)
        blurred = tf.nn.avg_pool2d(image, ksize=5, strides=1, padding="SAME")
        small = tf.image.resize(blurred, (SIDE, SIDE))[0]
        label = tf.random.stateless_uniform((), seed=key + 1, maxval=CLASSES, dtype=tf.int64)
        return small, label

    examples = tf.data.Dataset.range(input_context.input_pipeline_id, 1 << 31, input_context.num_input_pipelines)
    return (examples.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(input_context.per_replica_batch_size)
            .prefetch(tf.data.AUTOTUNE))
