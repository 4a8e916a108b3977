"""A compiled model as a recipe: what compile() supplies, per example, and what is refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import from_compiled, is_compiled

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
        (lambda: model(optimizer="sgd", loss="mse", metrics=[keras.metrics.F1Score(name="f1")]),
         r"metric 'f1', whose result is not one number"),
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


# ------------------------------------------------- the same values as Keras' own compile
# Fixed tensors (seeded): each case compiles a model the way a user would and compares the
# mean of our per-example values with Keras' own compiled loss (``model.compute_loss``) or
# metric (``model.compute_metrics``) on the same tensors. Tolerance: float32 relative 1e-6,
# because Keras reduces by sum / count and the loop by a sum over the global batch; the
# element-wise values are the same ops. docs/keras.md lists these names.
RNG = np.random.default_rng(36)  # seeded: the cases below are the same on every run
N, CLASSES, STEPS = 8, 3, 5


def _sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype("float32")


def _softmax(x):
    e = np.exp(x)
    return (e / e.sum(-1, keepdims=True)).astype("float32")


SHAPES = {  # name: (labels, predictions, output units)
    "binary_labels_N": (RNG.integers(0, 2, N).astype("float32"), _sigmoid(RNG.normal(size=(N, 1))), 1),
    "binary_labels_N1": (RNG.integers(0, 2, (N, 1)).astype("float32"), _sigmoid(RNG.normal(size=(N, 1))), 1),
    "regression_N": (RNG.uniform(0.5, 2, N).astype("float32"), RNG.uniform(0.5, 2, (N, 1)).astype("float32"), 1),
    "sparse_N": (RNG.integers(0, CLASSES, N), _softmax(RNG.normal(size=(N, CLASSES))), CLASSES),
    "sparse_N1": (RNG.integers(0, CLASSES, (N, 1)), _softmax(RNG.normal(size=(N, CLASSES))), CLASSES),
    "one_hot": (np.eye(CLASSES, dtype="float32")[RNG.integers(0, CLASSES, N)],
                _softmax(RNG.normal(size=(N, CLASSES))), CLASSES),
    "sequence_sparse": (RNG.integers(0, CLASSES, (N, STEPS)), _softmax(RNG.normal(size=(N, STEPS, CLASSES))), CLASSES),
}
_BINARY_OR_REGRESSION = ("binary_labels_N", "binary_labels_N1", "regression_N")
_CATEGORICAL = ("one_hot",)
_SPARSE = ("sparse_N", "sparse_N1", "sequence_sparse")

LOSS_CASES = {
    **{name: _BINARY_OR_REGRESSION for name in (
        "binary_crossentropy", "bce", "binary_focal_crossentropy", "hinge", "squared_hinge",
        "mean_squared_error", "mse", "mean_absolute_error", "mae", "mean_absolute_percentage_error", "mape",
        "mean_squared_logarithmic_error", "msle", "huber", "log_cosh", "poisson")},
    **{name: _CATEGORICAL for name in (
        "categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge", "cosine_similarity",
        "kl_divergence", "kld", "dice", "tversky")},
    "sparse_categorical_crossentropy": _SPARSE,
    "crossentropy": ("binary_labels_N", "sparse_N", "one_hot"),
    "ce": ("binary_labels_N", "sparse_N", "one_hot"),
}
METRIC_CASES = {
    "accuracy": ("binary_labels_N", "binary_labels_N1", "sparse_N", "sparse_N1", "one_hot", "sequence_sparse"),
    "acc": ("binary_labels_N", "sparse_N", "one_hot"),
    "binary_accuracy": ("binary_labels_N", "binary_labels_N1"),
    "categorical_accuracy": _CATEGORICAL,
    "sparse_categorical_accuracy": _SPARSE,
    "top_k_categorical_accuracy": _CATEGORICAL,
    "sparse_top_k_categorical_accuracy": ("sparse_N", "sparse_N1"),
    **{name: _BINARY_OR_REGRESSION for name in (
        "mse", "mean_squared_error", "mae", "mean_absolute_error", "mape", "mean_absolute_percentage_error", "msle",
        "mean_squared_logarithmic_error", "log_cosh_error", "hinge", "squared_hinge", "poisson")},
    "binary_crossentropy": ("binary_labels_N1",),  # with labels (N,) Keras' metric fails too: below
    **{name: _CATEGORICAL for name in ("categorical_crossentropy", "categorical_hinge", "cosine_similarity",
                                       "kl_divergence")},
    "sparse_categorical_crossentropy": _SPARSE,
}


def _compiled(units, **compile_args):
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    m.compile(optimizer="sgd", **compile_args)
    return m


def _tensors(shape):
    labels, predictions, units = SHAPES[shape]
    return tf.constant(labels), tf.constant(predictions), units


def _keras_loss(m, labels, predictions):
    return float(m.compute_loss(x=None, y=labels, y_pred=predictions))


def _keras_metric(m, name, labels, predictions):
    m.reset_metrics()
    return float(m.compute_metrics(None, labels, predictions, None)[name])


def _mean(values):
    assert values.shape.rank == 1  # one value per example, whatever the label rank
    return float(tf.reduce_mean(tf.cast(values, tf.float32)))


@pytest.mark.parametrize(("name", "shape"), [(n, s) for n, shapes in LOSS_CASES.items() for s in shapes])
def test_a_loss_named_in_compile_gives_keras_own_value(name, shape):
    labels, predictions, units = _tensors(shape)
    m = _compiled(units, loss=name)
    ours = _mean(from_compiled(recipe(), m).loss(labels, predictions))
    assert ours == pytest.approx(_keras_loss(m, labels, predictions), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize(("name", "shape"), [(n, s) for n, shapes in METRIC_CASES.items() for s in shapes])
def test_a_metric_named_in_compile_gives_keras_own_value(name, shape):
    labels, predictions, units = _tensors(shape)
    m = _compiled(units, loss="mse", metrics=[name])
    values = from_compiled(recipe(), m).metrics(labels, predictions)
    assert list(values) == [name]  # named as written, as Keras names it
    assert _mean(values[name]) == pytest.approx(_keras_metric(m, name, labels, predictions), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize(
    ("loss", "metric", "shape"),
    [
        (keras.losses.BinaryCrossentropy(), keras.metrics.BinaryAccuracy(), "binary_labels_N"),
        (keras.losses.binary_crossentropy, keras.metrics.binary_accuracy, "binary_labels_N"),
        (keras.losses.MeanSquaredError(), keras.metrics.MeanAbsoluteError(), "regression_N"),
        (keras.losses.mean_squared_error, keras.metrics.mean_absolute_error, "regression_N"),
        (keras.losses.SparseCategoricalCrossentropy(), keras.metrics.SparseCategoricalAccuracy(), "sparse_N1"),
        (keras.losses.SparseCategoricalCrossentropy(), keras.metrics.SparseCategoricalAccuracy(), "sequence_sparse"),
        (keras.losses.CategoricalCrossentropy(label_smoothing=0.1), keras.metrics.CategoricalAccuracy(), "one_hot"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", type(v).__name__),
)
def test_loss_and_metric_objects_and_functions_give_keras_own_values(loss, metric, shape):
    labels, predictions, units = _tensors(shape)
    m = _compiled(units, loss=loss, metrics=[metric])
    derived = from_compiled(recipe(), m)
    (name, values), = derived.metrics(labels, predictions).items()
    assert _mean(derived.loss(labels, predictions)) == pytest.approx(_keras_loss(m, labels, predictions), rel=1e-6)
    assert _mean(values) == pytest.approx(_keras_metric(m, name, labels, predictions), rel=1e-6)


def test_binary_crossentropy_with_rank_1_labels_and_a_dense_1_output_trains_as_in_keras():
    """Issue 36: labels (N,), a sigmoid Dense(1) output (N, 1): Keras aligns the ranks."""
    labels, predictions, units = _tensors("binary_labels_N")
    m = _compiled(units, loss="binary_crossentropy")
    per_example = from_compiled(recipe(), m).loss(labels, predictions)
    assert per_example.shape == (N,)
    expected = -(labels * np.log(predictions[:, 0]) + (1 - labels) * np.log(1 - predictions[:, 0]))
    np.testing.assert_allclose(per_example.numpy(), expected.numpy(), rtol=1e-6)


def test_a_metric_that_fails_in_keras_fails_the_same_way_here():
    """Keras aligns no ranks for metrics: binary_crossentropy as a METRIC with labels (N,) and
    output (N, 1) fails in plain Keras' compile; the runner does not make it pass either."""
    labels, predictions, units = _tensors("binary_labels_N")
    m = _compiled(units, loss="binary_crossentropy", metrics=["binary_crossentropy"])
    with pytest.raises(ValueError, match=r"must have the same rank"):
        _keras_metric(m, "binary_crossentropy", labels, predictions)
    with pytest.raises(ValueError, match=r"must have the same rank"):
        from_compiled(recipe(), m).metrics(labels, predictions)


@pytest.mark.parametrize("name", ["auc", "precision", "recall", "true_positives", "r2_score",
                                  "root_mean_squared_error"])
def test_a_named_metric_whose_state_is_not_a_mean_is_summed_under_its_name(name):
    """Its state is summed (runner/keras_recipes/metric_states.py; tests/runner/keras_recipes/test_metric_states.py)."""
    derived = from_compiled(recipe(), _compiled(1, loss="mse", metrics=["mae", name]))
    assert [entry.name for entry in derived.metric_states.metrics] == [name]
    assert sorted(derived.metrics(tf.zeros([2, 1]), tf.zeros([2, 1]))) == ["mae"]


def test_a_named_f1_score_has_one_result_per_class_and_is_refused():
    with pytest.raises(RecipeError, match=r"metric 'f1_score', whose result is not one number"):
        from_compiled(recipe(), _compiled(1, loss="mse", metrics=["f1_score"]))


def test_docs_keras_lists_exactly_the_names_tested_here():
    """docs/keras.md's list of compile losses and metrics tested against plain Keras is this file's."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "keras.md").read_text()
    listed = {kind: re.search(rf"^\* {kind}: (.*?)(?=^\* )", text, re.MULTILINE | re.DOTALL).group(1)
              for kind in ("losses", "metrics")}
    assert sorted(re.findall(r"`(\w+)`", listed["losses"])) == sorted(LOSS_CASES)
    assert sorted(re.findall(r"`(\w+)`", listed["metrics"])) == sorted(METRIC_CASES)


def test_a_fit_scripts_refusal_names_the_script_not_a_build_model(tmp_path):
    """A model.fit script has no build_model(): its refusal says what the script did."""
    script = tmp_path / "fit_twohead.py"
    script.write_text("import keras\nmodel = keras.Sequential()\nmodel.fit(None, steps_per_epoch=1)\n")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, [keras.layers.Dense(1)(inputs), keras.layers.Dense(1)(inputs)])
    model.compile(optimizer="sgd", loss="mse", weighted_metrics=["mae"])
    with pytest.raises(RecipeError) as raised:
        from_compiled(recipe(name="fit_twohead.py", source=str(script), loss=None), model)
    assert str(raised.value) == ("Script fit_twohead.py: its model was compiled with weighted_metrics and several "
                                 "outputs; not supported yet (sample weights with several outputs are not either)")


def test_the_metrics_refused_before_workers_start_are_kerass_stateful_ones():
    """job/recipe.py refuses these by name in the source (it imports no Keras): the list is every
    keras.metrics class, and every name keras.metrics.get() takes, whose state is not a mean."""
    from keras.src.metrics import ALL_OBJECTS_DICT

    from resilient_train.job.recipe import STATEFUL_METRIC_NAMES, STATEFUL_METRICS

    wrapper = keras.metrics.MeanMetricWrapper

    def stateful(obj):
        return (isinstance(obj, type) and issubclass(obj, keras.metrics.Metric) and obj is not keras.metrics.Metric
                and not (issubclass(obj, wrapper) and obj.update_state is wrapper.update_state))

    assert sorted(STATEFUL_METRICS) == sorted(name for name, obj in vars(keras.metrics).items() if stateful(obj))
    assert sorted(STATEFUL_METRIC_NAMES) == sorted(name for name, obj in ALL_OBJECTS_DICT.items()
                                                   if name[0].islower() and name != "metric" and stateful(obj))
