# A fit script as keras.io writes one: keras.utils.set_random_seed first, then a dataset shuffled
# with its own seed (`.shuffle(2048, seed=7)`, reshuffled each iteration, TF's default), repeated
# and batched at the global batch, trained 3 epochs of 5 steps. The reference of
# tests/integration/test_fit_shuffle.py is this script under plain Keras (tests/recipes/plain_keras.py).
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

keras.utils.set_random_seed(3)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
digits = load_digits()
x = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
y = digits.target.astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=7).repeat().batch(64)
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(dataset, epochs=3, steps_per_epoch=5)
