# A keras.io-style functional model with two inputs and two outputs (issue 46 item 3), on
# scikit-learn's breast cancer set: inputs {"clinical": 20 features, "lab": 10}, outputs
# {"risk": malignant or not (sigmoid), "prog": the standardized mean radius (linear)}, compiled
# with a loss dict, loss_weights and per-output metrics (an AUC among them: a summed state, not a
# mean), fit on arrays with validation_data.
# FIT_PLAIN=1: run as plain Keras (`python fit_twohead.py`, the default strategy), the reference.
# FIT_HEADS=1: the risk head alone, with Precision, Recall and weighted_metrics=["accuracy"], fit with
# class_weight={0: 2.0, 1: 0.5}.
# FIT_SHUFFLE=0: shuffle=False (plain Keras' permutation is not the runner's: compare unshuffled).
# FIT_STEP_DELAY_S: seconds each batch sleeps (a batch-end callback, there in every run).
# FIT_SCRIPT_OUT: where the code after fit() appends one line per worker (History, task).
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer

data = load_breast_cancer()
features = ((data.data - data.data.mean(axis=0)) / data.data.std(axis=0)).astype(np.float32)
x = {"clinical": features[:, :20], "lab": features[:, 20:]}
y = {"risk": data.target.astype(np.float32), "prog": features[:, :1].copy()}
train, held_out = slice(0, 512), slice(512, None)  # 512 = 8 batches of 64: no partial batch to drop


def part(arrays, where):
  return {name: array[where] for name, array in arrays.items()}


two_heads = os.environ.get("FIT_HEADS", "2") == "2"
plain = os.environ.get("FIT_PLAIN") == "1"
keras.utils.set_random_seed(3)
strategy = tf.distribute.get_strategy() if plain else tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
  clinical = keras.Input((20,), name="clinical")
  lab = keras.Input((10,), name="lab")
  hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([clinical, lab]))
  risk = keras.layers.Dense(1, activation="sigmoid", name="risk")(hidden)
  prog = keras.layers.Dense(1, name="prog")(hidden)
  if two_heads:
    model = keras.Model({"clinical": clinical, "lab": lab}, {"risk": risk, "prog": prog})
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
                  loss={"risk": "binary_crossentropy", "prog": "mse"}, loss_weights={"risk": 1.0, "prog": 0.5},
                  metrics={"risk": ["accuracy", keras.metrics.AUC(name="auc")], "prog": ["mae"]})
  else:
    model = keras.Model({"clinical": clinical, "lab": lab}, risk)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall", thresholds=0.7)],
                  weighted_metrics=["accuracy"])

delay = float(os.environ.get("FIT_STEP_DELAY_S", "0"))  # time for a SIGTERM to land mid-epoch
labels = part(y, train) if two_heads else y["risk"][train]
val_labels = part(y, held_out) if two_heads else y["risk"][held_out]
history = model.fit(part(x, train), labels, batch_size=64, epochs=4, verbose=0,
                    shuffle=os.environ.get("FIT_SHUFFLE", "1") == "1",
                    class_weight=None if two_heads else {0: 2.0, 1: 0.5},
                    validation_data=(part(x, held_out), val_labels),
                    callbacks=[keras.callbacks.CSVLogger("training_log.csv"),
                               keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(delay))])

task = 0 if plain else strategy.cluster_resolver.task_id
with open(os.path.join(os.environ["FIT_SCRIPT_OUT"], "after_fit.jsonl"), "a") as handle:
  handle.write(json.dumps({"task": task, "history": history.history}) + "\n")
