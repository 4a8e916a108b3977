"""Summed-state metrics (AUC, Precision, F1Score, MeanIoU...) give Keras' own results (issue 46 item 4).

Each metric is compiled as a user would; the shares of three batches (runner/keras_recipes/
metric_states.py: ``update_state`` from zeros) are added in float32 as the runner's host does,
split over two "replicas" for the middle batch (their shares summed, as the all-reduce does),
and the result must be the Keras metric's own ``result()`` after ``update_state`` on the same
batches: exactly for the confusion counts (sums of whole numbers), float32 relative 1e-6 else.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import from_compiled
from resilient_train.runner.keras_recipes.metric_states import ADDITIVE

RNG = np.random.default_rng(4)
BINARY = [(RNG.integers(0, 2, size=(8, 1)).astype(np.float32), RNG.uniform(size=(8, 1)).astype(np.float32))
          for _ in range(3)]
CLASSES = [(np.eye(3, dtype=np.float32)[RNG.integers(0, 3, size=8)], RNG.dirichlet(np.ones(3), size=8).astype(np.float32))
           for _ in range(3)]
SPARSE = [(np.argmax(y, axis=-1).astype(np.int64), p) for y, p in CLASSES]

CASES = {
    "auc": (lambda: keras.metrics.AUC(), 1, BINARY),
    "auc_pr": (lambda: keras.metrics.AUC(curve="PR", name="pr"), 1, BINARY),
    "precision": (lambda: "precision", 1, BINARY),
    "recall": (lambda: keras.metrics.Recall(thresholds=0.3), 1, BINARY),
    "true_positives": (lambda: "true_positives", 1, BINARY),
    "precision_at_recall": (lambda: keras.metrics.PrecisionAtRecall(0.5), 1, BINARY),
    "f1_score": (lambda: keras.metrics.F1Score(average="macro", threshold=0.4), 3, CLASSES),
    "mean_iou": (lambda: keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False), 3, SPARSE),
    "one_hot_iou": (lambda: keras.metrics.OneHotIoU(num_classes=3, target_class_ids=[0, 2]), 3, CLASSES),
    "rmse": (lambda: keras.metrics.RootMeanSquaredError(), 1, BINARY),
    "r2": (lambda: keras.metrics.R2Score(), 1, BINARY),
}


def recipe():
    return Recipe(name="r", source="r.py", build_model=None, build_optimizer=None, loss=None, dataset=None)


@pytest.mark.parametrize("case", CASES)
def test_summed_shares_give_the_keras_metric_own_result(case):
    make, units, batches = CASES[case]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    model.compile(optimizer="sgd", loss="mse", metrics=[make()])
    derived = from_compiled(recipe(), model)
    assert derived.metrics is None  # no mean metric left
    states = derived.metric_states
    [entry] = states.metrics
    sums = np.zeros(states.width, np.float32)
    for index, (labels, predictions) in enumerate(batches):
        if index == 1:  # two replicas' shares of one batch, summed (the all-reduce)
            share = (states.shares(tf.constant(labels[:4]), tf.constant(predictions[:4])).numpy()
                     + states.shares(tf.constant(labels[4:]), tf.constant(predictions[4:])).numpy())
        else:
            share = states.shares(tf.constant(labels), tf.constant(predictions)).numpy()
        sums = sums + share
    reference = make()
    reference = keras.metrics.get(reference) if isinstance(reference, str) else reference
    reference = reference() if isinstance(reference, type) else reference
    for labels, predictions in batches:
        reference.update_state(labels, predictions)
    ours = states.results(sums)[entry.name]
    assert ours == pytest.approx(float(reference.result()), rel=1e-6)


def test_a_two_head_models_summed_metrics_are_named_per_output():
    clinical = keras.Input((5,), name="clinical")
    risk = keras.layers.Dense(1, activation="sigmoid", name="risk")(clinical)
    prog = keras.layers.Dense(1, name="prog")(clinical)
    model = keras.Model(clinical, {"risk": risk, "prog": prog})
    model.compile(optimizer="sgd", loss={"risk": "bce", "prog": "mse"},
                  metrics={"risk": ["accuracy", keras.metrics.AUC(name="auc")], "prog": ["mae"]})
    derived = from_compiled(recipe(), model)
    assert [entry.name for entry in derived.metric_states.metrics] == ["risk_auc"]
    features = tf.constant(RNG.normal(size=(8, 5)).astype(np.float32))
    labels = {"risk": tf.constant(BINARY[0][0]), "prog": tf.constant(BINARY[0][1])}
    predictions = model(features)
    assert sorted(derived.metrics(labels, predictions)) == ["prog_loss", "prog_mae", "risk_accuracy", "risk_loss"]
    model.reset_metrics()
    model.compute_loss(x=None, y=labels, y_pred=predictions)
    keras_auc = float(model.compute_metrics(None, labels, predictions, None)["risk_auc"])
    states = derived.metric_states
    assert states.results(states.shares(labels, predictions).numpy())["risk_auc"] == keras_auc


def test_a_metric_class_of_your_own_is_refused():
    class Peak(keras.metrics.Metric):
        def __init__(self):
            super().__init__(name="peak")
            self.peak = self.add_variable(shape=(), initializer="zeros", name="peak")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.peak.assign(tf.maximum(self.peak, tf.reduce_max(y_pred)))

        def result(self):
            return self.peak

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=[Peak()])
    with pytest.raises(Exception, match=r"metric 'peak' \(Peak\), whose state is not a mean of per-example values "
                                        r"and not one of Keras' own summed states"):
        from_compiled(recipe(), model)


def test_a_metric_with_several_results_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=[keras.metrics.Recall(thresholds=[0.3, 0.6], name="recall")])
    with pytest.raises(Exception, match=r"metric 'recall', whose result is not one number"):
        from_compiled(recipe(), model)


def test_the_summed_classes_are_the_stateful_ones_refused_by_name_before():
    from resilient_train.job.recipe import STATEFUL_METRICS

    assert sorted(ADDITIVE) == sorted(STATEFUL_METRICS)


def test_weighted_metrics_are_kerass_weighted_means_named_as_keras_names_them():
    """compile(metrics=["accuracy"], weighted_metrics=["accuracy", "mae"]): Keras logs accuracy,
    weighted_accuracy (the name was taken) and mae, the weighted ones sum(w * value) / sum(w)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="bce", metrics=["accuracy"], weighted_metrics=["accuracy", "mae"])
    derived = from_compiled(recipe(), model)
    states = derived.metric_states
    assert [entry.name for entry in states.metrics] == ["weighted_accuracy", "mae"]
    batches = [(labels, predictions, RNG.uniform(0.1, 2.0, size=(8,)).astype(np.float32))
               for labels, predictions in BINARY]
    sums = np.zeros(states.width, np.float32)
    for labels, predictions, weights in batches:
        sums = sums + states.shares(tf.constant(labels), tf.constant(predictions), tf.constant(weights)).numpy()
    ours = states.results(sums)
    model.reset_metrics()
    for labels, predictions, weights in batches:
        model.compute_loss(x=None, y=labels, y_pred=predictions, sample_weight=weights)
        keras_values = model.compute_metrics(None, labels, predictions, weights)
    assert sorted(keras_values) == ["accuracy", "loss", "mae", "weighted_accuracy"]
    assert ours["weighted_accuracy"] == pytest.approx(float(keras_values["weighted_accuracy"]), rel=1e-6)
    assert ours["mae"] == pytest.approx(float(keras_values["mae"]), rel=1e-6)
    assert ours["weighted_accuracy"] != pytest.approx(float(keras_values["accuracy"]), rel=1e-3)  # weights matter
