# keras.io "Customizing what happens in fit()" (TensorFlow backend), "going lower-level" and
# "providing your own evaluation step": a Model subclass with its own train_step and test_step,
# metric trackers listed by a `metrics` property, compile() with an optimizer only; validated in
# fit (validation_data, a finite dataset) and evaluated after it. scikit-learn's diabetes set
# (shipped offline), standardised. tests/integration/test_own_train_step.py compares it on one
# worker with plain Keras (tests/recipes/plain_keras.py); FIT_SCRIPT_OUT: evaluate()'s dict goes
# to evaluate.json there.
import json
import os

import keras
import tensorflow as tf
from sklearn.datasets import load_diabetes

keras.utils.set_random_seed(5)


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = keras.ops.mean(keras.losses.mean_squared_error(y, y_pred))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(keras.losses.mean_squared_error(y, y_pred))
        self.mae_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


strategy = tf.distribute.MultiWorkerMirroredStrategy()
x, y = load_diabetes(return_X_y=True)
x = ((x - x.mean(0)) / x.std(0)).astype("float32")
y = ((y - y.mean()) / y.std()).astype("float32").reshape(-1, 1)
train = tf.data.Dataset.from_tensor_slices((x[:352], y[:352])).repeat().batch(32)
val = tf.data.Dataset.from_tensor_slices((x[352:], y[352:])).batch(32)  # 90 examples: a short last batch
with strategy.scope():
    inputs = keras.Input(shape=(10,))
    model = CustomModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.05))
model.fit(train, epochs=3, steps_per_epoch=11, validation_data=val)
result = model.evaluate(val, return_dict=True, verbose=0)
if os.environ.get("FIT_SCRIPT_OUT"):
    with open(os.path.join(os.environ["FIT_SCRIPT_OUT"], "evaluate.json"), "w") as handle:
        json.dump({k: float(v) for k, v in result.items()}, handle)
