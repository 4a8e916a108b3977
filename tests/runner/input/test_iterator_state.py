"""The iterator-state path's pure pieces: the state blob and the plain iterator's shapes."""

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.runner.input.data import _with_dynamic_batch
from resilient_train.runner.input.iterator_state import restore_iterator, serialize_iterator


def _pipeline():
    return tf.data.Dataset.range(100).map(lambda i: (tf.fill([4, 2], tf.cast(i, tf.float32)), i)).prefetch(2)


def test_a_restored_iterator_continues_where_the_saved_one_was():
    saved = iter(_pipeline())
    for _ in range(7):
        next(saved)
    blob = serialize_iterator(saved)
    restored = iter(_pipeline())
    restore_iterator(restored, blob)
    assert [int(next(restored)[1]) for _ in range(3)] == [7, 8, 9]


def test_a_blob_without_the_magic_is_refused():
    with pytest.raises(ValueError, match="does not start with"):
        restore_iterator(iter(_pipeline()), b"not a state")


def test_dynamic_batch_relaxes_the_first_dimension_and_keeps_the_values():
    dataset = _pipeline()
    relaxed = _with_dynamic_batch(dataset)
    features, index = relaxed.element_spec
    assert (features.shape.as_list(), index.shape.as_list()) == ([None, 2], [])  # a scalar has no batch dimension
    for (a, i), (b, j) in zip(dataset.take(3), relaxed.take(3)):
        assert np.array_equal(a.numpy(), b.numpy()) and int(i) == int(j)
