# A keras.io-style script on NumPy arrays (issue 46 items 1-2): fit(x, y, batch_size=64,
# shuffle=True, validation_data=(x_val, y_val)) with EarlyStopping on val_loss and a CSVLogger.
# FIT_ARRAYS_SPLIT=1: fit(x, y, validation_split=0.2) for one epoch instead, then evaluate() on
# the last 20% (the examples Keras holds out), so the test compares it with the epoch's val_loss.
# FIT_SCRIPT_OUT: where the code after fit() appends one line per worker.
# FIT_STEP_DELAY_S: seconds each batch sleeps (a batch-end callback, only when set): time for a
# SIGTERM to land inside an epoch; the arithmetic is the same.
import json
import os
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

digits = load_digits()
x = (digits.images / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(8, 8)),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), metrics=['accuracy'])

split = os.environ.get("FIT_ARRAYS_SPLIT") == "1"
callbacks = [tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=0.1),
             tf.keras.callbacks.CSVLogger("training_log.csv")]
delay = float(os.environ.get("FIT_STEP_DELAY_S", "0"))
if delay:
  callbacks.append(tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(delay)))
history = model.fit(x if split else x[:1500], y if split else y[:1500], batch_size=64, epochs=1 if split else 8,
                    shuffle=True, validation_data=None if split else (x[1500:], y[1500:]),
                    validation_split=0.2 if split else 0.0, callbacks=[] if split else callbacks)

record = {"task": strategy.cluster_resolver.task_id, "epochs": history.epoch, "history": history.history}
if split:  # the examples Keras holds out: the last 20%, before any shuffle
  split_at = int(np.floor(len(x) * 0.8))
  held_out = tf.data.Dataset.from_tensor_slices((x[split_at:], y[split_at:])).batch(64)
  first = tf.data.Dataset.from_tensor_slices((x[:len(x) - split_at], y[:len(x) - split_at])).batch(64)
  record["evaluate_held_out"] = model.evaluate(held_out, return_dict=True)
  record["evaluate_first"] = model.evaluate(first, return_dict=True)
with open(os.path.join(os.environ["FIT_SCRIPT_OUT"], "after_fit.jsonl"), "a") as handle:
  handle.write(json.dumps(record) + "\n")
