"""The default demo: the seeds' CNN on scikit-learn's handwritten digits (8x8, 1797 images).

Model: the seed notes' shape ``Conv2D -> Flatten -> Dense -> Dense(10)`` plus a seeded
``Dropout``, whose RNG state the runner checkpoints (so a killed and resumed run still
ends with bit-identical weights). The data ships inside scikit-learn: no download.

Training uses the first ``TRAIN_IMAGES`` (1500) images; the remaining 297 are held out and
evaluated at every epoch end (``eval_dataset``). Accuracy is reported per epoch (``metrics``,
and ``val_accuracy`` on the held-out part); on 2 workers it passes 0.9 within a few epochs,
against 0.1 for chance.
"""

import keras
import numpy as np
import tensorflow as tf

# Imported with the module, not in dataset(): a warm standby imports the recipe ahead of a
# restart, so the restart does not pay this import (0.2 s of every restart's input phase).
try:
    from sklearn.datasets import load_digits
except ImportError:
    load_digits = None

DEFAULTS = {"epochs": 5, "steps_per_epoch": 40, "global_batch_size": 64, "save_every_steps": 20}
PARAMS = {"learning_rate": 0.05, "dropout": 0.25}

TRAIN_IMAGES = 1500  # the rest (297 of 1797) is the fixed held-out split

_DATA = None


def _digits():
    global _DATA
    if _DATA is None:
        if load_digits is None:
            raise ImportError("recipes/digits_cnn.py needs scikit-learn: pip install 'resilient-train[examples]'")
        digits = load_digits()
        images = (digits.images / 16.0).astype(np.float32)[..., None]
        _DATA = (images, digits.target.astype(np.int64))
    return _DATA


def build_model(params):
    return keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dropout(params["dropout"], seed=7),
            keras.layers.Dense(10),
        ]
    )


def build_optimizer(params):
    return keras.optimizers.SGD(learning_rate=params["learning_rate"], momentum=0.9)


def loss(labels, predictions):
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def metrics(labels, predictions):
    return {"accuracy": tf.cast(tf.equal(tf.argmax(predictions, axis=-1), labels), tf.float32)}


def dataset(input_context, epoch, seed):
    images, labels = _digits()
    images, labels = images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES]
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(len(images), seed=seed * 1000 + epoch).repeat()
    return ds.batch(input_context.per_replica_batch_size, drop_remainder=True)


def eval_dataset(input_context, seed):
    """The held-out images (index TRAIN_IMAGES onwards), unshuffled; finite."""
    images, labels = _digits()
    ds = tf.data.Dataset.from_tensor_slices((images[TRAIN_IMAGES:], labels[TRAIN_IMAGES:]))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.per_replica_batch_size)
