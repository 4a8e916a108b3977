"""What the training step takes from a recipe's batch and loss, checked where it is traced.

A recipe's mistakes in these two places used to surface as raw TensorFlow errors deep in
a distributed step (or, for a scalar loss, as a silently wrong average), and the
supervisor retried them as if they were transient. Both are found while ``tf.function``
traces the step, so the checks below cost nothing per step, and they raise
:class:`~resilient_train.errors.RecipeError`: the worker exits fatal (3), never retried.

Accepted batches are Keras' convention: ``(features, labels)`` or
``(features, labels, sample_weight)``. A sample weight scales each example's loss; the
average still divides by the global batch size (``tf.nn.compute_average_loss``), as
Keras' ``sum_over_batch_size`` reduction does.
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable

import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe

__all__ = ["unpack_batch", "per_example_loss", "average_loss", "with_autograph", "preconvert"]

_BATCH_HINT = "batches must be (features, labels) or (features, labels, sample_weight)"


def unpack_batch(batch: Any, recipe_name: str = "recipe") -> tuple[Any, Any, Any | None]:
    """``(features, labels, sample_weight or None)``; RecipeError for any other structure."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        features, labels = batch[0], batch[1]
        return features, labels, batch[2] if len(batch) == 3 else None
    raise RecipeError(f"recipe {recipe_name}: dataset() yielded {_describe(batch)}; {_BATCH_HINT}")


def _describe(batch: Any) -> str:
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of {len(batch)} elements"
    if isinstance(batch, dict):
        return f"a dict with keys {sorted(batch)}"
    return f"a single {type(batch).__name__}"


def with_autograph(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as AutoGraph converts it when called inside a tf.function, even from code that
    is not converted itself (a ``tf.function(autograph=False)``); converted once, at its first
    trace, as ``strategy.run`` converts its replica function. A callable AutoGraph does not
    convert (Keras's own losses) is called as it is."""
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.autograph.impl import api as autograph

    return autograph.tf_convert(fn, ag_ctx.ControlStatusCtx(status=ag_ctx.Status.ENABLED))


def preconvert(*fns: Callable[..., Any] | None) -> None:
    """Convert ``fns`` now as :func:`with_autograph` converts them at their first trace.

    For a warm standby, ahead of a failure: a process's first conversions pay for Python's
    source and module lookups (``inspect`` walks every loaded module once), 0.04-0.06 s of
    each restarted worker's trace for a recipe's loss and metrics; after this the worker's
    own conversion takes ~0.02 s. Pure Python: no op runs, the eager context stays
    uninitialized. A function AutoGraph cannot convert is left to the worker, which
    reports it where it is used.

    AutoGraph writes each converted function to a ``__autograph_generated_file*.py`` in the
    temp dir and removes them at exit; a standby is killed or leaves by ``os._exit``, so the
    files go to a directory of their own, removed here once the functions are loaded
    (rundir/scratch.py has the worker's side of this)."""
    from tensorflow.python.autograph.core import converter
    from tensorflow.python.autograph.impl import api as autograph

    # The options ``with_autograph``'s wrapper passes (tf_convert: recursive, not user-requested).
    options = converter.ConversionOptions(recursive=True, user_requested=False, optional_features=None)
    previous = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="rt-preconvert-") as scratch:
        tempfile.tempdir = scratch
        try:
            for fn in fns:
                if fn is None:
                    continue
                try:
                    autograph._convert_actual(fn, converter.ProgramContext(options=options))
                except Exception:  # noqa: BLE001 - not convertible here (no source, a builtin): the worker will say
                    pass
        finally:
            tempfile.tempdir = previous


def per_example_loss(recipe: Recipe, labels: Any, predictions: Any, *, loss: Callable[..., Any] | None = None) -> tf.Tensor:
    """``recipe.loss(labels, predictions)`` (or ``loss``: the same, converted by
    :func:`with_autograph`), refused unless it has one value per example."""
    values = tf.convert_to_tensor((loss or recipe.loss)(labels, predictions))
    if values.shape.rank == 0:
        raise RecipeError(
            f"recipe {recipe.name}: loss() must return one value per example, got shape (); "
            "return the per-example loss (e.g. tf.reduce_mean(..., axis=-1)), not its mean"
        )
    return values


def average_loss(per_example: tf.Tensor, sample_weight: Any | None, global_batch_size: int) -> tf.Tensor:
    """This replica's share of the global mean loss, weighted per example when given."""
    if sample_weight is None:
        return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
    weights = tf.cast(sample_weight, per_example.dtype)
    if weights.shape.rank is not None and per_example.shape.rank is not None and weights.shape.rank < per_example.shape.rank:
        weights = tf.reshape(weights, tf.concat([tf.shape(weights), tf.ones([per_example.shape.rank - weights.shape.rank], tf.int32)], 0))
    return tf.nn.compute_average_loss(per_example * weights, global_batch_size=global_batch_size)
