# The seed notes' "Multi-worker training with Keras" tutorial as one script, unchanged except
# for the data source: scikit-learn's digits (8x8, shipped offline) in place of the MNIST
# download, so the input shape is (8, 8) instead of (28, 28). Left out: the tutorial's
# single-worker demo (a second fit() call) and its os.environ['TF_CONFIG'] = ... block
# (resilient-train sets TF_CONFIG for every worker).
#
#   resilient-train run examples/keras_tutorial.py --workers 2 --run-dir runs/tutorial
import tensorflow as tf
import numpy as np
from sklearn.datasets import load_digits

def mnist_dataset(batch_size):
  digits = load_digits()  # was: (x_train, y_train), _ = tf.keras.datasets.mnist.load_data()
  x_train, y_train = (digits.images * (255 / 16)).astype(np.uint8), digits.target
  # The `x` arrays are in uint8 and have values in the range [0, 255].
  # We need to convert them to float32 with values in the range [0, 1]
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
  return train_dataset

def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(8, 8)),
      tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model


per_worker_batch_size = 64

strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()

num_workers = 4

# Here the batch size scales up by number of workers since 
# `tf.data.Dataset.batch` expects the global batch size. Previously we used 64, 
# and now this becomes 128.
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = build_and_compile_cnn_model()

# Keras' `model.fit()` trains the model with specified number of epochs and
# number of steps per epoch. Note that the numbers here are for demonstration
# purposes only and may not sufficiently produce a model with good quality.
multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
