"""recipes/digits_cnn.py whose input pipeline takes ``teardown_delay_s`` to tear down.

Every epoch's batches are zipped with a ``from_generator`` stream of ticks whose
generator, once it has fed the whole epoch (``steps_per_epoch`` ticks), sleeps
``teardown_delay_s`` when it is closed. TensorFlow closes it while it tears the iterator
down, in the thread that drops the iterator: a deterministic stand-in for the tens of
seconds a long epoch's pipeline took to tear down on the digits demo (runner/input/teardown.py).
A pipeline read only briefly (the resume check's first batch) closes at once. The values
trained on are digits_cnn's, bit for bit.
"""

import importlib.util
import time
from pathlib import Path

import tensorflow as tf

_spec = importlib.util.spec_from_file_location("_digits_cnn", Path(__file__).resolve().parents[2] / "recipes" / "digits_cnn.py")
_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digits)

DEFAULTS = {**_digits.DEFAULTS, "steps_per_epoch": 5}
PARAMS = {**_digits.PARAMS, "teardown_delay_s": 12.0, "slow_after_ticks": 5}
build_model = _digits.build_model
build_optimizer = _digits.build_optimizer
loss = _digits.loss
metrics = _digits.metrics
eval_dataset = _digits.eval_dataset


def dataset(input_context, epoch, seed):
    delay = float(input_context.params["teardown_delay_s"])
    slow_after = int(input_context.params["slow_after_ticks"])

    def ticks():
        fed = 0
        try:
            while True:
                fed += 1
                yield fed
        finally:  # GeneratorExit: the iterator is being torn down
            if fed >= slow_after:
                time.sleep(delay)

    stream = tf.data.Dataset.from_generator(ticks, output_signature=tf.TensorSpec((), tf.int64))
    batches = _digits.dataset(input_context, epoch, seed)
    return tf.data.Dataset.zip((batches, stream)).map(lambda batch, tick: batch)
