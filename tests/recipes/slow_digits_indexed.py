"""recipes/digits_indexed.py paced: the example at each global batch's first position waits
0.3 s before its augmentation.

Position ``P`` is the second half of ``augment``'s seed (runner/input/indexed.py), so exactly one
example of every global step waits, on whichever worker holds it, at any worker count; the
others wait for it at the step's all-reduce. The wait changes no value, so this recipe's
weights and per-step index digests equal digits_indexed's; it only gives tests that resize
or signal a running job time to aim.
"""

import importlib.util
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

_spec = importlib.util.spec_from_file_location(
    "_digits_indexed", Path(__file__).resolve().parents[2] / "recipes" / "digits_indexed.py")
_indexed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_indexed)

DEFAULTS = _indexed.DEFAULTS
PARAMS = _indexed.PARAMS
build_model = _indexed.build_model
build_optimizer = _indexed.build_optimizer
loss = _indexed.loss
metrics = _indexed.metrics
eval_dataset = _indexed.eval_dataset
num_examples = _indexed.num_examples
example = _indexed.example

_DELAY_S = 0.3
_GLOBAL_BATCH = 32  # the elastic test's --global-batch-size: one wait per global step


def augment(example, seed):
    def wait(position):
        if int(position) % _GLOBAL_BATCH == 0:
            time.sleep(_DELAY_S)
        return np.float32(0.0)

    zero = tf.ensure_shape(tf.numpy_function(wait, [seed[1]], tf.float32, stateful=True), [])
    image, label = _indexed.augment(example, seed)
    return image + zero, label  # + 0.0 leaves every (non-negative) pixel unchanged
