"""Batch structure, loss shape and sample weights, checked in-process."""

import tempfile

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.batches import average_loss, per_example_loss, preconvert, unpack_batch, with_autograph


def recipe_with_loss(loss):
    return Recipe(name="r", source="r.py", build_model=None, build_optimizer=None, loss=loss, dataset=None)


def test_two_and_three_element_batches_unpack():
    assert unpack_batch(("x", "y")) == ("x", "y", None)
    assert unpack_batch(("x", "y", "w")) == ("x", "y", "w")


@pytest.mark.parametrize("batch, what", [
    (("x", "y", "w", "z"), "a tuple of 4 elements"),
    ({"image": 1, "label": 2}, "a dict with keys ['image', 'label']"),
    ("x", "a single str"),
])
def test_other_structures_name_the_accepted_ones(batch, what):
    with pytest.raises(RecipeError) as raised:
        unpack_batch(batch, "digits")
    assert str(raised.value) == (
        f"recipe digits: dataset() yielded {what}; "
        "batches must be (features, labels) or (features, labels, sample_weight)"
    )


def test_a_scalar_loss_is_refused():
    recipe = recipe_with_loss(lambda y, p: tf.reduce_mean(tf.square(y - p)))
    with pytest.raises(RecipeError, match=r"^recipe r: loss\(\) must return one value per example, got shape \(\)"):
        per_example_loss(recipe, tf.zeros([4, 1]), tf.ones([4, 1]))


def test_sample_weights_scale_each_example_and_divide_by_the_global_batch():
    per_example = tf.constant([1.0, 2.0, 3.0, 4.0])
    assert float(average_loss(per_example, None, 8)) == pytest.approx(10.0 / 8)
    weights = tf.constant([1.0, 0.0, 2.0, 0.5])
    assert float(average_loss(per_example, weights, 8)) == pytest.approx((1 + 0 + 6 + 2) / 8)
    # a [batch, 1] loss with [batch] weights: weights broadcast per example, not across
    column = tf.reshape(per_example, [4, 1])
    assert float(average_loss(column, weights, 8)) == pytest.approx(9.0 / 8)
    assert np.isfinite(float(average_loss(column, tf.constant([1, 1, 1, 1]), 4)))


def _signed_error(labels, predictions):
    # A Python ``if`` on a tensor: only AutoGraph turns it into a tf.cond in a graph.
    if tf.reduce_sum(labels) > 0:
        return labels - predictions
    return predictions - labels


def test_the_recipes_own_code_keeps_autograph_inside_the_runners_unconverted_trace():
    """The training and evaluation calls are tf.function(autograph=False) (their own code is
    written for graph mode); the recipe's loss and metrics still get AutoGraph, through
    with_autograph, as when the whole call was converted."""

    @tf.function(autograph=False)
    def call(labels, predictions, convert: bool):
        return (with_autograph(_signed_error) if convert else _signed_error)(labels, predictions)

    labels, predictions = tf.constant([1.0, 2.0]), tf.constant([0.5, 0.5])
    assert call(labels, predictions, True).numpy().tolist() == [0.5, 1.5]
    assert call(-labels, predictions, True).numpy().tolist() == [1.5, 2.5]
    with pytest.raises(TypeError, match="is not allowed"):  # OperatorNotAllowedInGraphError: not converted
        call(labels, predictions, False)
    recipe = recipe_with_loss(_signed_error)
    loss = with_autograph(recipe.loss)
    traced = tf.function(lambda y, p: per_example_loss(recipe, y, p, loss=loss), autograph=False)
    assert traced(tf.constant([[1.0], [2.0]]), tf.constant([[0.0], [0.0]])).numpy().tolist() == [[1.0], [2.0]]


def _scaled_error(labels, predictions):
    if tf.reduce_sum(labels) > 0:
        return 2.0 * (labels - predictions)
    return predictions - labels


def test_preconvert_fills_autographs_cache_for_the_conversion_with_autograph_makes(tmp_path, monkeypatch):
    """A warm standby converts the recipe's loss and metrics ahead (warm_standby.prewarm):
    the conversion with_autograph's wrapper asks for at its first trace is then cached."""
    from tensorflow.python.autograph.core import converter
    from tensorflow.python.autograph.impl import api

    options = converter.ConversionOptions(recursive=True, user_requested=False, optional_features=None)
    assert not api._TRANSPILER._cache.has(_scaled_error, options)
    # The generated files go to a directory of its own, removed at once (a standby never runs
    # AutoGraph's atexit cleanup): nothing is left in the process's temp dir.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    preconvert(_scaled_error, None, len)  # None (no metrics) and a builtin (no source) are passed over
    assert api._TRANSPILER._cache.has(_scaled_error, options)
    assert sorted(p.name for p in temp.iterdir()) == []
    assert tempfile.tempdir == str(temp)

    @tf.function(autograph=False)
    def call(labels, predictions):
        return with_autograph(_scaled_error)(labels, predictions)

    assert call(tf.constant([1.0, 2.0]), tf.constant([0.5, 0.5])).numpy().tolist() == [1.0, 3.0]
