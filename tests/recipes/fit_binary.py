# A model.fit script as a newcomer writes it (issue 36): loss="binary_crossentropy", labels of
# shape (N,), a sigmoid Dense(1) output (N, 1). Plain Keras aligns the ranks; so must the runner.
# FIT_PLAIN=1: run as plain Keras (`python fit_binary.py`, the default strategy), the reference.
# FIT_METRICS: compile's metrics, comma-separated (default "accuracy").
# FIT_TENSORBOARD: a keras.callbacks.TensorBoard(log_dir=FIT_TENSORBOARD) and a CSVLogger("train_log.csv").
# FIT_RUN_EAGERLY=1: compile(run_eagerly=...) from the environment, True (refused by the worker: the
# source check cannot read it).
# FIT_SCRIPT_OUT: where the code after fit() writes history.json (the per-epoch loss; one step
# per epoch, so each value is one step's loss).
import json
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=8) > 0).astype("float32")  # shape (256,): no class axis

plain = os.environ.get("FIT_PLAIN") == "1"
strategy = tf.distribute.get_strategy() if plain else tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="binary_crossentropy",
                  metrics=os.environ.get("FIT_METRICS", "accuracy").split(","),
                  run_eagerly=os.environ.get("FIT_RUN_EAGERLY") == "1")

dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
callbacks = []
if os.environ.get("FIT_TENSORBOARD"):
    callbacks += [keras.callbacks.TensorBoard(log_dir=os.environ["FIT_TENSORBOARD"]), keras.callbacks.CSVLogger("train_log.csv")]
history = model.fit(dataset, epochs=8, steps_per_epoch=1, verbose=0, callbacks=callbacks)

with open(os.path.join(os.environ["FIT_SCRIPT_OUT"], "history.json"), "w") as handle:
    json.dump(history.history, handle)
