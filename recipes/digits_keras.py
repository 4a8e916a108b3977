"""The digits CNN as a Keras user writes it: a compiled model and ``model.fit`` callbacks.

No ``build_optimizer``, ``loss`` or ``metrics``: they come from ``compile``
(runner/keras_recipes/compiled.py). ``callbacks`` returns what a ``fit`` call would get; the runner
calls them where ``fit`` would and keeps their state with every checkpoint
(runner/keras_recipes/callbacks.py), so a killed and resumed run logs the same CSV rows, lowers the
learning rate at the same epochs and stops early at the same epoch as an uninterrupted run.

The callbacks are tuned so that both happen within a short run: ``ReduceLROnPlateau`` halves
the learning rate whenever the training loss fails to drop by ``plateau_delta``;
``EarlyStopping`` stops once ``val_loss`` has failed to improve by ``stop_delta`` for
``patience`` epochs, and puts back the best epoch's weights. ``CSVLogger`` writes
``training_log.csv`` and ``ModelCheckpoint(save_best_only=True)`` the weights of the best
epoch by ``val_accuracy``, ``best.weights.h5``, into the run directory (relative paths land
there; both run on the chief only).
"""

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits  # with the module: a warm standby imports it ahead of a restart

# Small enough for the integration test (tests/integration/test_keras.py): with these values,
# on 2 workers, the rate is halved after epoch 1 and EarlyStopping ends the run after epoch 3
# of 5, putting back epoch 2's weights; ModelCheckpoint (val_accuracy) saves after epochs 0,
# 1 and 2 and not after epoch 3, which is worse than epoch 2.
DEFAULTS = {"epochs": 5, "steps_per_epoch": 10, "global_batch_size": 32, "save_every_steps": 4}
PARAMS = {"learning_rate": 0.05, "plateau_delta": 0.35, "stop_delta": 0.15, "patience": 1,
          "csv_log": "training_log.csv", "best_weights": "best.weights.h5"}

TRAIN_IMAGES = 1500  # the rest (297 of 1797) is the held-out split

_DATA = None


def _digits():
    global _DATA
    if _DATA is None:
        digits = load_digits()
        _DATA = ((digits.images / 16.0).astype(np.float32)[..., None], digits.target.astype(np.int64))
    return _DATA


def build_model(params, api=keras):
    """``api``: the Keras module; benchmarks/keras_fit.py passes legacy ``tf_keras`` to build
    the same model for ``model.fit``."""
    model = api.Sequential(
        [
            api.Input(shape=(8, 8, 1)),
            api.layers.Conv2D(8, 3, activation="relu"),
            api.layers.Flatten(),
            api.layers.Dense(32, activation="relu"),
            api.layers.Dropout(0.25, seed=7),
            api.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=api.optimizers.SGD(learning_rate=params["learning_rate"], momentum=0.9),
        loss=api.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def callbacks(params):
    return [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=params["plateau_delta"]),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=params["patience"], min_delta=params["stop_delta"],
                                      restore_best_weights=True),
        keras.callbacks.CSVLogger(params["csv_log"]),
        keras.callbacks.ModelCheckpoint(params["best_weights"], monitor="val_accuracy", mode="max",
                                        save_best_only=True, save_weights_only=True),
    ]


def dataset(input_context, epoch, seed):
    images, labels = _digits()
    ds = tf.data.Dataset.from_tensor_slices((images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES]))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(TRAIN_IMAGES, seed=seed * 1000 + epoch).repeat()
    return ds.batch(input_context.per_replica_batch_size, drop_remainder=True)


def eval_dataset(input_context, seed):
    images, labels = _digits()
    ds = tf.data.Dataset.from_tensor_slices((images[TRAIN_IMAGES:], labels[TRAIN_IMAGES:]))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.per_replica_batch_size)
