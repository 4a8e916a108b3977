"""tests/recipes/input_bound.py on the indexed input contract.

Each example is a synthetic 256x256 RGB image (stateless random, a pure function of the
example's index), blurred and resized to 16x16 before the same small model sees it:
producing a batch costs far more than training on it. The runner builds the pipeline
(runner/input/indexed.py) and starts it at the re-entry step, so re-entering at step k of an
epoch costs one batch, not k, without the recipe writing ``start_step``.
"""

import importlib.util
from pathlib import Path

import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_input_bound", Path(__file__).resolve().parent / "input_bound.py")
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

DEFAULTS = _base.DEFAULTS
PARAMS = {"learning_rate": 0.05, "image_size": 256, "examples": 1 << 20}
build_model = _base.build_model
build_optimizer = _base.build_optimizer
loss = _base.loss


def num_examples(params):
    return int(params["examples"])


def example(index, params):
    size = int(params["image_size"])
    key = tf.stack([tf.constant(7, tf.int64), index])
    image = tf.random.stateless_uniform((1, size, size, 3), seed=key)
    blurred = tf.nn.avg_pool2d(image, ksize=5, strides=1, padding="SAME")
    small = tf.image.resize(blurred, (_base.SIDE, _base.SIDE))[0]
    label = tf.random.stateless_uniform((), seed=key + 1, maxval=_base.CLASSES, dtype=tf.int64)
    return small, label
