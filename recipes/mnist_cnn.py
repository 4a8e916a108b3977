"""The seeds' MNIST CNN, exactly: Reshape -> Conv2D(32, 3) -> Flatten -> Dense(128) -> Dense(10),
SGD(0.001), sparse categorical cross-entropy from logits.

MNIST is read from a local ``mnist.npz`` (the file ``keras.datasets.mnist.load_data()``
downloads): ``--set mnist_path=/path/to/mnist.npz``, else ``~/.keras/datasets/mnist.npz``.
Nothing is downloaded; a missing file stops the run with a message saying where it looked.
"""

import os

import keras
import numpy as np
import tensorflow as tf

DEFAULTS = {"epochs": 3, "steps_per_epoch": 70, "global_batch_size": 128, "save_every_steps": 35}
PARAMS = {"mnist_path": "", "learning_rate": 0.001}


def _find(path_param):
    candidates = [path_param] if path_param else []
    candidates.append(os.path.join(os.environ.get("KERAS_HOME", os.path.expanduser("~/.keras")), "datasets", "mnist.npz"))
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"MNIST not found; looked at {', '.join(candidates)}. This machine cannot download it: copy mnist.npz "
        "(from keras.datasets.mnist.load_data() on a connected machine) there, or pass --set mnist_path=/path/to/mnist.npz"
    )


def _load(path_param, split="train"):
    with np.load(_find(path_param)) as data:
        return data[f"x_{split}"], data[f"y_{split}"]


def build_model(params):
    _find(params["mnist_path"])  # fail before training starts, with the message above
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28)),
            keras.layers.Reshape(target_shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def build_optimizer(params):
    return keras.optimizers.SGD(learning_rate=params["learning_rate"])


def loss(labels, predictions):
    return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)


def metrics(labels, predictions):
    return {"accuracy": tf.cast(tf.equal(tf.argmax(predictions, axis=-1), labels), tf.float32)}


def dataset(input_context, epoch, seed):
    x_train, y_train = _load(input_context.params["mnist_path"])
    x_train = (x_train / np.float32(255)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train.astype(np.int64)))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(60000, seed=seed * 1000 + epoch).repeat()
    return ds.batch(input_context.per_replica_batch_size, drop_remainder=True)


def eval_dataset(input_context, seed):
    """MNIST's own 10,000 test images, unshuffled (held out from training)."""
    x_test, y_test = _load(input_context.params["mnist_path"], "test")
    x_test = (x_test / np.float32(255)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x_test, y_test.astype(np.int64)))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(input_context.per_replica_batch_size)
