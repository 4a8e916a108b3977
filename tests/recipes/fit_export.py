# A model.fit script whose checkpoints `resilient-train export` turns into a model (issue 46
# item 6): a functional model with a seeded Dropout, compiled, trained on NumPy arrays. After
# fit() the chief writes the trained model's outputs on the probe inputs to
# FIT_SCRIPT_OUT/predictions.npy, the reference an export's predictions must equal.
import os

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(3)
x = rng.normal(size=(256, 6)).astype("float32")
y = (x @ rng.normal(size=6) > 0).astype("int64")
probe = rng.normal(size=(40, 6)).astype("float32")
print("building the model")  # export runs the script up to fit(): its prints go to stderr there

with strategy.scope():
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(12, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.25, seed=5)(hidden)
    outputs = keras.layers.Dense(2, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

model.fit(x, y, batch_size=32, epochs=2, verbose=0)

if strategy.cluster_resolver.task_id == 0:
    np.save(os.path.join(os.environ["FIT_SCRIPT_OUT"], "predictions.npy"), model(probe, training=False).numpy())
