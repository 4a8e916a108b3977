"""recipes/digits_cnn.py whose input on rank 1 blocks forever on attempt 1 only.

What a stuck network-filesystem read or a hung data loader looks like: every batch passes
through a ``tf.py_function``; on attempt 1, rank 1's call number ``hang_after_batches``
never returns (it sleeps in a loop), so rank 1 stops feeding its replica, the chief waits
in the all-reduce, and every process stays alive. The function returns 0.0, added to the
(non-negative) pixels, so no value changes: the weights equal digits_cnn's bit for bit.
"""

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_cnn", Path(__file__).resolve().parents[2] / "recipes" / "digits_cnn.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = {**_digits.PARAMS, "hang_after_batches": 12}
build_model = _digits.build_model
build_optimizer = _digits.build_optimizer
loss = _digits.loss
metrics = _digits.metrics

_calls = [0]


def _read(block: bool, after: int):
    _calls[0] += 1
    while block and _calls[0] > after:
        time.sleep(0.5)  # never returns: the stuck read
    return np.float32(0.0)


def dataset(input_context, epoch, seed):
    block = input_context.input_pipeline_id == 1 and os.environ.get("RT_ATTEMPT") == "1"
    after = int(input_context.params["hang_after_batches"])

    def read(images, labels):
        zero = tf.py_function(lambda: _read(block, after), [], tf.float32)
        return images + tf.ensure_shape(zero, []), labels

    return _digits.dataset(input_context, epoch, seed).map(read)
