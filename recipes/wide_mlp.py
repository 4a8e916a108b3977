"""A wide MLP with ~100 MB of model + optimizer state, for the checkpoint benchmark.

``1024 -> 2048 -> 2048 -> 1024 -> 10`` Dense layers: 8.41 M parameters (33.6 MB of
float32 weights) plus Adam's two slots = ~101 MB of checkpointed state. The data is
synthetic and offline: each epoch's batches are a pure function of (seed, epoch, shard),
so the recipe also resumes exactly. Compute per step is small for the state size, which
makes it a hard case for checkpoint overhead (the ratio of bytes saved to work done is high).
"""

import keras
import tensorflow as tf

DEFAULTS = {"epochs": 1, "steps_per_epoch": 200, "global_batch_size": 32, "save_every_steps": 50}
PARAMS = {"learning_rate": 0.001, "width": 2048, "features": 1024}

CLASSES = 10


def build_model(params):
    width, features = int(params["width"]), int(params["features"])
    return keras.Sequential(
        [
            keras.Input(shape=(features,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(features, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


def build_optimizer(params):
    return keras.optimizers.Adam(learning_rate=params["learning_rate"])


def loss(labels, predictions):
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def dataset(input_context, epoch, seed):
    features = int(input_context.params["features"])
    batch = input_context.per_replica_batch_size
    shard_seed = (seed * 1000 + epoch) * 1000 + input_context.input_pipeline_id

    def make(index):
        key = tf.stack([tf.cast(shard_seed, tf.int64), index])
        x = tf.random.stateless_normal((batch, features), seed=key)
        y = tf.random.stateless_uniform((batch,), seed=key + 1, maxval=CLASSES, dtype=tf.int64)
        return x, y

    return tf.data.Dataset.range(1 << 31).map(make)
