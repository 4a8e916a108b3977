"""A compiled model as a recipe: what compile() supplies, per example, and what is refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.compiled import from_compiled, is_compiled

LABELS = tf.constant([0, 1, 2, 1], tf.int64)
LOGITS = tf.constant([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 5.0]])


def recipe(**overrides):
    fields = dict(name="r", source="r.py", build_model=None, build_optimizer=None, loss=None, dataset=None)
    return Recipe(**{**fields, **overrides})


def model(outputs=3, **compile_args):
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(outputs)])
    if compile_args:
        m.compile(**compile_args)
    return m


def test_an_uncompiled_model_is_not_taken_for_a_compiled_one():
    assert not is_compiled(model())
    assert is_compiled(model(optimizer="sgd", loss="mse"))


def test_loss_object_gives_per_example_values_equal_to_keras_mean():
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(0.01)
    derived = from_compiled(recipe(), model(optimizer=optimizer, loss=loss, metrics=["accuracy"]))
    per_example = derived.loss(LABELS, LOGITS)
    assert per_example.shape == (4,)
    assert float(tf.reduce_mean(per_example)) == pytest.approx(float(loss(LABELS, LOGITS)), rel=1e-6)
    assert derived.build_optimizer({}) is optimizer


def test_loss_by_name_and_accuracy_resolve_as_keras_does():
    derived = from_compiled(recipe(), model(optimizer="sgd", loss="sparse_categorical_crossentropy",
                                            metrics=["accuracy", keras.metrics.SparseCategoricalAccuracy(name="sca")]))
    probabilities = tf.nn.softmax(LOGITS)
    assert derived.loss(LABELS, probabilities).shape == (4,)
    values = derived.metrics(LABELS, LOGITS)
    assert sorted(values) == ["accuracy", "sca"]
    assert np.asarray(values["accuracy"]).tolist() == [1.0, 1.0, 0.0, 0.0]  # sparse: labels lack the class axis
    assert np.asarray(values["sca"]).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_accuracy_with_one_hot_labels_is_categorical():
    derived = from_compiled(recipe(), model(optimizer="sgd", loss="categorical_crossentropy", metrics=["acc"]))
    one_hot = tf.one_hot(LABELS, 3)
    assert np.asarray(derived.metrics(one_hot, LOGITS)["acc"]).tolist() == [1.0, 1.0, 0.0, 0.0]


class OwnStep(keras.Sequential):
    def train_step(self, data):
        return {}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: model(optimizer="sgd", loss="mse", run_eagerly=True), r"run_eagerly=True"),
        (lambda: model(optimizer="sgd", loss="mse", jit_compile=True), r"jit_compile=True"),
        (lambda: model(optimizer="sgd", loss="mse", steps_per_execution=4),
         r"steps_per_execution=4; use the runner's --steps-per-execution"),
        (lambda: model(optimizer="sgd", loss="mse", loss_weights=[0.5]), r"loss_weights"),
        (lambda: model(optimizer="sgd", loss="mse", metrics=[keras.metrics.AUC()]),
         r"metric 'auc' \(AUC\), whose state is not a mean of per-example values"),
        (lambda: model(optimizer="sgd", loss=["mse", "mae"]), r"a list of losses; one output with one loss"),
    ],
)
def test_what_the_runner_cannot_honour_is_refused_in_one_line(build, message):
    with pytest.raises(RecipeError, match=r"^recipe r: build_model\(\) returned a compiled model with .*" + message):
        from_compiled(recipe(), build())


def test_a_train_step_override_is_refused():
    own = OwnStep([keras.Input((4,)), keras.layers.Dense(3)])
    own.compile(optimizer="sgd", loss="mse")
    with pytest.raises(RecipeError, match=r"OwnStep.train_step overridden; the runner runs its own step"):
        from_compiled(recipe(), own)


def test_compile_and_recipe_functions_together_are_ambiguous():
    with pytest.raises(RecipeError, match=r"the recipe also defining loss; take them from compile\(\) or from the recipe"):
        from_compiled(recipe(loss=lambda y, p: y), model(optimizer="sgd", loss="mse"))
