"""recipes/digits_keras.py with each batch of epoch ``slow_from_epoch`` and later delayed.

The delay (``step_delay_s``, default 3 s: a 30 s window for a signal under load) changes no value (the same batches, bit for bit),
so this recipe's weights, CSV log and callback decisions equal digits_keras's; it only
gives a test that signals the job after an epoch end time to land inside the next epoch.
The epochs before ``slow_from_epoch`` run at full speed.
"""

import importlib.util
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_keras", Path(__file__).resolve().parents[2] / "recipes" / "digits_keras.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = {**_digits.PARAMS, "step_delay_s": 3.0, "slow_from_epoch": 3}
build_model = _digits.build_model
callbacks = _digits.callbacks
eval_dataset = _digits.eval_dataset


def dataset(input_context, epoch, seed):
    batches = _digits.dataset(input_context, epoch, seed)
    delay = float(input_context.params["step_delay_s"])
    if epoch < int(input_context.params["slow_from_epoch"]) or delay <= 0:
        return batches

    def wait():
        time.sleep(delay)
        return np.float32(0.0)

    def delayed(images, labels):
        zero = tf.ensure_shape(tf.numpy_function(wait, [], tf.float32, stateful=True), [])
        return images + zero, labels  # + 0.0 leaves every (non-negative) pixel unchanged

    return batches.map(delayed)
