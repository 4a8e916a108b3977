"""recipes/digits_keras.py's compiled model and input, without its callbacks or evaluation.

What benchmarks/keras_fit.py trains both ways: with ``resilient-train run`` (this file is
the recipe) and with legacy ``tf_keras`` ``model.fit`` (benchmarks/_tf_keras_fit.py calls
``build_model(params, api=tf_keras)`` and ``dataset`` from here), so the model, optimizer,
loss, metric, input and batch are the same on both sides and neither runs callbacks of
its own beyond what the comparison names.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_digits_keras", Path(__file__).resolve().parents[1] / "recipes" / "digits_keras.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = _digits.DEFAULTS
PARAMS = _digits.PARAMS
build_model = _digits.build_model
dataset = _digits.dataset
