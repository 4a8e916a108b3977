# The seed tutorial's script (examples/keras_tutorial.py) made short for the integration tests,
# with what fit scripts also have: callbacks (ReduceLROnPlateau, EarlyStopping, CSVLogger) and code after fit()
# (model.evaluate on a held-out split, reading weights, writing a file).
# FIT_SCRIPT_OUT: where the code after fit() appends one line per worker (the tests count them);
# FIT_SCRIPT_STEP_DELAY_S: seconds each batch sleeps (time for a SIGTERM to land mid-epoch).
# Its print() and CSVLogger("training_log.csv"): the console and the working directory
# (tests/integration/test_fit_script.py runs it from FIT_SCRIPT_OUT).
import json
import os
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

print("hello from the script")


def digits_dataset(batch_size):
  digits = load_digits()
  x_train = (digits.images / 16.0).astype(np.float32)
  y_train = digits.target.astype(np.int64)
  return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2000).repeat().batch(batch_size)


def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(8, 8)),
      tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
      metrics=['accuracy'])
  return model


strategy = tf.distribute.MultiWorkerMirroredStrategy()
dataset = digits_dataset(64)
with strategy.scope():
  model = build_and_compile_cnn_model()

delay = float(os.environ.get("FIT_SCRIPT_STEP_DELAY_S", "0"))
callbacks = [
    # Halves the rate whenever the loss drops by less than 0.3 in an epoch (after epochs 1-5).
    tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=0.3),
    # Stops once the training loss fails to drop by 0.15 in an epoch (after epoch 5 of 0-7).
    tf.keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=0.15),
    tf.keras.callbacks.CSVLogger("training_log.csv"),  # after ReduceLROnPlateau: logs learning_rate
    tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(delay)),
]
history = model.fit(dataset, epochs=8, steps_per_epoch=10, callbacks=callbacks)

# After fit: runs once, on every worker, when training completed.
digits = load_digits()
held_out = tf.data.Dataset.from_tensor_slices(
    ((digits.images[1500:] / 16.0).astype(np.float32), digits.target[1500:].astype(np.int64))).batch(64)
record = {"task": strategy.cluster_resolver.task_id, "epochs": history.epoch,
          "loss": history.history["loss"], "last_bias": model.trainable_weights[-1].numpy().tolist(),
          "evaluate": model.evaluate(held_out, return_dict=True)}
with open(os.path.join(os.environ["FIT_SCRIPT_OUT"], "after_fit.jsonl"), "a") as handle:
  handle.write(json.dumps(record) + "\n")
