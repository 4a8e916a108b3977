# Run a model.fit script as plain Keras would, the reference of a 1-worker comparison:
#   python tests/recipes/plain_keras.py SCRIPT OUT.json
# MultiWorkerMirroredStrategy() is the default strategy (Keras 3's fit does not run under
# MWMS on TF 2.21), op determinism is on as under the runner, and fit()'s History is written
# to OUT.json with the trained weights' digest (the runner's weights_sha256). Nothing else of
# the script changes.
import json
import runpy
import sys

import keras
import tensorflow as tf

from resilient_train.runner.state.model_state import weights_digest

script, out = sys.argv[1], sys.argv[2]
tf.config.experimental.enable_op_determinism()


class DefaultStrategy(tf.distribute.MultiWorkerMirroredStrategy):  # a class: Keras tests isinstance() with it
    def __new__(cls, *args, **kwargs):
        return tf.distribute.get_strategy()


tf.distribute.MultiWorkerMirroredStrategy = DefaultStrategy
real_fit = keras.Model.fit


def fit(model, *args, **kwargs):
    history = real_fit(model, *args, **{"verbose": 0, **kwargs})
    with open(out, "w") as handle:
        json.dump({"history": {key: [float(v) for v in values] for key, values in history.history.items()},
                   "weights_sha256": weights_digest(model)}, handle)
    return history


keras.Model.fit = fit
runpy.run_path(script, run_name="__main__")
