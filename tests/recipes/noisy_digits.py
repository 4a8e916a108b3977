"""recipes/digits_cnn.py with Gaussian noise added to the training images in ``dataset()``,
drawn from an unseeded generator picked by the ``noise`` param (issue 36):

* ``numpy``: NumPy's global generator (``np.random.normal``);
* ``python``: Python's global generator (``random.gauss``);
* ``entropy``: a fresh ``np.random.default_rng()`` (OS entropy on every call).

The runner reseeds the two global generators from ``(seed, epoch)`` before each
``dataset()`` call, so ``numpy`` and ``python`` resume exactly; ``entropy`` cannot, and the
resume check must say so. The noise is drawn eagerly, when ``dataset()`` is called.
"""

import importlib.util
import random
from pathlib import Path

import numpy as np
import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_cnn", Path(__file__).resolve().parents[2] / "recipes" / "digits_cnn.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = {**_digits.PARAMS, "noise": "numpy", "noise_scale": 0.1}
build_model = _digits.build_model
build_optimizer = _digits.build_optimizer
loss = _digits.loss
metrics = _digits.metrics


def _noise(kind, shape, scale):
    if kind == "numpy":
        return np.random.normal(0.0, scale, size=shape).astype(np.float32)
    if kind == "python":
        count = int(np.prod(shape))
        return np.asarray([random.gauss(0.0, scale) for _ in range(count)], np.float32).reshape(shape)
    if kind == "entropy":
        return np.random.default_rng().normal(0.0, scale, size=shape).astype(np.float32)
    raise ValueError(f"noise={kind!r}; expected numpy, python or entropy")


def dataset(input_context, epoch, seed):
    params = input_context.params
    images, labels = _digits._digits()
    images, labels = images[:_digits.TRAIN_IMAGES], labels[:_digits.TRAIN_IMAGES]
    images = images + _noise(params["noise"], images.shape, float(params["noise_scale"]))
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.shuffle(len(images), seed=seed * 1000 + epoch).repeat()
    return ds.batch(input_context.per_replica_batch_size, drop_remainder=True)
