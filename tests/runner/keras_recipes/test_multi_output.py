"""A compiled several-output model's loss and metrics against Keras' own compile (issue 46 item 3).

Each case compiles a two-input, two-output functional model the way a keras.io script does and
compares, on the same fixed tensors, the mean of our per-example loss with Keras'
``compute_loss`` and our per-example metrics with ``compute_metrics``, names included
(``<output>_loss``, ``<output>_<metric>``). Tolerance: float32 relative 1e-6 (the runner sums
the weighted losses per example, then averages; Keras averages each, then sums).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import from_compiled

RNG = np.random.default_rng(46)
FEATURES = {"clinical": RNG.normal(size=(6, 5)).astype(np.float32), "lab": RNG.normal(size=(6, 3)).astype(np.float32)}
LABELS = {"risk": np.array([0, 1, 1, 0, 1, 0], np.float32), "prog": RNG.normal(size=(6, 1)).astype(np.float32)}


def recipe():
    return Recipe(name="r", source="r.py", build_model=None, build_optimizer=None, loss=None, dataset=None)


def two_heads(as_dict, **compile_args):
    clinical, lab = keras.Input((5,), name="clinical"), keras.Input((3,), name="lab")
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([clinical, lab]))
    risk = keras.layers.Dense(1, activation="sigmoid", name="risk")(hidden)
    prog = keras.layers.Dense(1, name="prog")(hidden)
    outputs = {"risk": risk, "prog": prog} if as_dict else [risk, prog]
    m = keras.Model({"clinical": clinical, "lab": lab}, outputs)
    m.compile(optimizer="sgd", **compile_args)
    return m


CASES = {
    "dict outputs, loss and metric dicts, loss_weights": (True, dict(
        loss={"risk": "binary_crossentropy", "prog": "mse"}, loss_weights={"risk": 1.0, "prog": 0.3},
        metrics={"risk": ["accuracy", keras.metrics.BinaryAccuracy(name="acc2")], "prog": ["mae"]})),
    "list outputs, loss list, metric list": (False, dict(
        loss=[keras.losses.BinaryCrossentropy(), "mae"], loss_weights=[0.5, 2.0], metrics=[["acc"], "mse"])),
    "list outputs, loss dict, labels as a list": (False, dict(
        loss={"risk": "bce", "prog": keras.losses.Huber()}, metrics={"prog": "mae"})),
    "one loss for both outputs": (True, dict(loss="mse", metrics={"risk": "mae"})),
}


@pytest.mark.parametrize("case", CASES)
def test_several_outputs_give_keras_own_loss_and_metrics(case):
    as_dict, compile_args = CASES[case]
    m = two_heads(as_dict, **compile_args)
    predictions = m(FEATURES)
    labels = LABELS if as_dict or "labels as a list" not in case else [LABELS["risk"], LABELS["prog"]]
    derived = from_compiled(recipe(), m)
    ours = float(tf.reduce_mean(derived.loss(labels, predictions)))
    m.reset_metrics()  # compute_loss updates the <output>_loss trackers that compute_metrics reads
    assert ours == pytest.approx(float(m.compute_loss(x=None, y=labels, y_pred=predictions)), rel=1e-6)
    keras_metrics = m.compute_metrics(None, labels, predictions, None)
    keras_metrics = {name: float(value) for name, value in keras_metrics.items() if name != "loss"}
    ours_metrics = {name: float(tf.reduce_mean(values)) for name, values in derived.metrics(labels, predictions).items()}
    assert sorted(ours_metrics) == sorted(keras_metrics)
    for name, value in keras_metrics.items():
        assert ours_metrics[name] == pytest.approx(value, rel=1e-6), name


def test_the_keras_names_of_a_two_head_model():
    m = two_heads(True, **CASES["dict outputs, loss and metric dicts, loss_weights"][1])
    values = from_compiled(recipe(), m).metrics(LABELS, m(FEATURES))
    assert sorted(values) == ["prog_loss", "prog_mae", "risk_acc2", "risk_accuracy", "risk_loss"]


@pytest.mark.parametrize(
    ("compile_args", "message"),
    [
        (dict(loss={"risk": "bce", "other": "mse"}), r"loss=\{\.\.\.\} with keys \['other', 'risk'\]; the model's "
                                                     r"outputs are \['risk', 'prog'\]"),
        (dict(loss=["bce"]), r"a list of 1 loss for 2 outputs"),
        (dict(loss=["bce", "mse"], loss_weights={"risk": 1.0}), r"loss_weights=\{\.\.\.\} with keys \['risk'\]"),
        (dict(loss=["bce", "mse"], metrics=["mae"]), r"metrics=\['mae'\] for 2 outputs"),
        (dict(loss=["bce", "mse"], weighted_metrics=["mae"]), r"weighted_metrics and several outputs; not supported yet"),
    ],
)
def test_what_several_outputs_cannot_be_given_is_refused_in_one_line(compile_args, message):
    with pytest.raises(RecipeError, match=r"^recipe r: build_model\(\) returned a compiled model with " + message):
        from_compiled(recipe(), two_heads(False, **compile_args))
