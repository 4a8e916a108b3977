"""recipes/digits_cnn.py on the indexed input contract: the runner builds the input.

Same model, optimizer, loss, metrics, held-out evaluation and training images as
digits_cnn; only the input differs. Instead of ``dataset``, the recipe says how many
training examples there are (``num_examples``) and how to make example ``i``
(``example``); the runner shuffles them with a stateless permutation per pass, gives
global step ``s`` the examples at positions ``[s*GB, (s+1)*GB)`` and each worker its
contiguous share (runner/input/indexed.py). So every global step trains on the same examples,
in the same order, at any worker count, and re-entering a checkpoint mid-epoch costs
the same at any step. ``augment`` shows the per-example stateless seed: a random shift
of at most one pixel, different each time an example comes round again.

Run it with ``--record-indices`` to get a digest of each step's example indices
(docs/recipes.md).
"""

import importlib.util
from pathlib import Path

import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_cnn", Path(__file__).resolve().parent / "digits_cnn.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = _digits.PARAMS
TRAIN_IMAGES = _digits.TRAIN_IMAGES
build_model = _digits.build_model
build_optimizer = _digits.build_optimizer
loss = _digits.loss
metrics = _digits.metrics
eval_dataset = _digits.eval_dataset


def num_examples(params):
    _digits._digits()  # load the images here, eagerly, not while example() is traced
    return TRAIN_IMAGES


def example(index, params):
    images, labels = _digits._digits()
    return tf.gather(images[:TRAIN_IMAGES], index), tf.gather(labels[:TRAIN_IMAGES], index)


def augment(example, seed):
    """Shift the image by -1, 0 or 1 pixel on each axis (a pure function of ``seed``)."""
    image, label = example
    shift = tf.random.stateless_uniform([2], seed=seed, minval=-1, maxval=2, dtype=tf.int32)
    padded = tf.pad(image, [[1, 1], [1, 1], [0, 0]])
    return tf.slice(padded, tf.concat([1 + shift, [0]], 0), [8, 8, 1]), label
