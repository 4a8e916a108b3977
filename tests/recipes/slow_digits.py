"""recipes/digits_cnn.py with each batch delayed by ``step_delay_s`` (default 0.15 s).

The delay changes no value (the same batches, bit for bit), so this recipe's final
weights equal digits_cnn's; it only gives tests that signal a running job time to aim.
"""

import importlib.util
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_cnn", Path(__file__).resolve().parents[2] / "recipes" / "digits_cnn.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = {**_digits.PARAMS, "step_delay_s": 0.15}
build_model = _digits.build_model
build_optimizer = _digits.build_optimizer
loss = _digits.loss
metrics = _digits.metrics


def dataset(input_context, epoch, seed):
    delay = float(input_context.params["step_delay_s"])

    def wait():
        time.sleep(delay)
        return np.float32(0.0)

    def delayed(images, labels):
        zero = tf.ensure_shape(tf.numpy_function(wait, [], tf.float32, stateful=True), [])
        return images + zero, labels  # + 0.0 leaves every (non-negative) pixel unchanged

    return _digits.dataset(input_context, epoch, seed).map(delayed)
