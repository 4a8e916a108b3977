"""A compiled Keras model as a recipe: optimizer, per-example loss and metrics from ``compile``.

When ``build_model(params)`` returns a model on which ``compile`` was called, the recipe
may leave out ``build_optimizer``, ``loss`` and ``metrics``; :func:`from_compiled` derives
them from what ``compile`` recorded, and the training loop runs unchanged (its own step,
its own ``tf.function``, the packed all-reduce).

What is honoured and why only this:

* ``optimizer``: ``model.optimizer`` (an instance or a name such as ``"adam"``), built and
  checkpointed like a recipe's own (its ``learning_rate`` variable included, which is
  what ``ReduceLROnPlateau`` / ``LearningRateScheduler`` change).
* ``loss``: one loss, as a name, a function or a ``keras.losses.Loss``. The loop needs
  PER-EXAMPLE values (it divides by the global batch size across replicas), so a Loss
  object's unreduced ``call`` is used. A name or a function is what Keras' compile wraps
  in a ``LossFunctionWrapper``, whose ``call`` first aligns the ranks of labels and
  predictions (labels ``(N,)`` against a ``Dense(1)`` output ``(N, 1)``): done here the
  same way (:func:`same_rank`, Keras' ``squeeze_or_expand_to_same_rank``), or
  ``binary_crossentropy`` refuses the ranks that plain Keras trains with.
* ``metrics=[...]``: names (``"accuracy"`` resolved from the shapes as Keras does) and
  metric objects that are per-example means (``MeanMetricWrapper``:
  ``SparseCategoricalAccuracy``, ``MeanAbsoluteError``, ...), called exactly as their
  ``update_state`` calls them (Keras aligns no ranks for metrics: each built-in metric
  function does its own). Their epoch values are sums of per-step means kept with each
  checkpoint, so they repeat exactly after a resume.
* Values with more than one axis (a sequence's ``(N, T)``) are reduced to one per example
  by their mean over the other axes, which is what Keras' ``sum_over_batch_size`` loss
  reduction and its ``Mean`` metrics amount to; a scalar counts as every example's value.
  docs/keras.md lists the losses and metrics tested against plain Keras
  (tests/runner/test_compiled.py).

Refused, with one line (``RecipeError``; the supervisor refuses the literal cases before
workers start, job/recipe.py): several outputs / a list or dict of losses,
``loss_weights``, ``weighted_metrics``, metrics whose state is not a mean of per-example
values (``AUC``, ``Precision``, ``F1Score``...), a model class that overrides ``test_step`` /
``compute_loss`` / ``compute_metrics`` without ``train_step`` (the runner's step would
silently ignore it; one that overrides ``train_step`` never gets here: its own step runs,
runner/keras_recipes/own_step.py), ``run_eagerly=True``, ``jit_compile=True`` and
``steps_per_execution`` other than 1 (the runner's ``--steps-per-execution`` does that).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import keras
import tensorflow as tf

from resilient_train.errors import RecipeError, RecipeRefused
from resilient_train.job.recipe import Recipe, is_fit_script

__all__ = ["is_compiled", "from_compiled", "same_rank", "TRAINER_OVERRIDES"]

TRAINER_OVERRIDES = ("train_step", "test_step", "compute_loss", "compute_metrics")


def is_compiled(model: Any) -> bool:
    return bool(getattr(model, "compiled", False))


def _refuse(recipe: Recipe, what: str) -> RecipeRefused:
    """One line in the user's terms: a fit script has no build_model(), it compiled a model."""
    if _from_fit_script(recipe):
        return RecipeRefused(f"Script {Path(recipe.source).name}: its model was compiled with {what}")
    return RecipeRefused(f"recipe {recipe.name}: build_model() returned a compiled model with {what}")


def _from_fit_script(recipe: Recipe) -> bool:
    try:
        return bool(recipe.source) and is_fit_script(recipe.source)
    except (RecipeError, OSError):  # not a readable file: a recipe module
        return False


def from_compiled(recipe: Recipe, model: keras.Model) -> Recipe:
    """``recipe`` with ``build_optimizer`` / ``loss`` / ``metrics`` taken from ``compile``."""
    config = dict(model._compile_config.config)  # what compile() was given, as given
    for method in TRAINER_OVERRIDES:
        owner = next(k for k in type(model).__mro__ if method in vars(k))
        if not owner.__module__.startswith("keras."):
            raise _refuse(recipe, f"{owner.__name__}.{method} overridden; the runner runs its own step "
                                  "(define loss()/metrics() in the recipe instead)")
    if config.get("run_eagerly"):
        raise _refuse(recipe, "run_eagerly=True; the runner compiles its step (leave run_eagerly unset)")
    if config.get("jit_compile") is True:
        raise _refuse(recipe, "jit_compile=True; the runner's step is not XLA-compiled (leave it unset)")
    if config.get("steps_per_execution", 1) != 1:
        raise _refuse(recipe, f"steps_per_execution={config['steps_per_execution']}; use the runner's "
                              "--steps-per-execution instead")
    if config.get("loss_weights") is not None:
        raise _refuse(recipe, "loss_weights; one output with one loss is supported")
    if config.get("weighted_metrics"):
        raise _refuse(recipe, "weighted_metrics; only metrics=[...] is supported")
    if len(model.outputs or []) > 1:
        raise _refuse(recipe, f"{len(model.outputs)} outputs; one output with one loss is supported")
    if model.optimizer is None:
        raise _refuse(recipe, "no optimizer; pass optimizer=... to compile()")
    present = [name for name in ("build_optimizer", "loss", "metrics") if getattr(recipe, name) is not None]
    if present:
        raise _refuse(recipe, f"the recipe also defining {', '.join(present)}; take them from compile() "
                              "or from the recipe, not both")
    loss = _per_example_loss(recipe, config.get("loss"))
    metrics = _metrics(recipe, config.get("metrics"))
    optimizer = model.optimizer
    return dataclasses.replace(
        recipe, build_optimizer=lambda params: optimizer, loss=loss, metrics=metrics,
    )


def same_rank(labels: Any, predictions: Any) -> tuple[Any, Any]:
    """Labels and predictions whose ranks differ by one, on a last axis of size 1, brought to
    the same rank: Keras' ``squeeze_or_expand_to_same_rank`` (keras/src/losses/loss.py),
    which its compile applies before a loss given as a name or a function. A rank-1 side is
    expanded (``(N,)`` against ``(N, 1)`` becomes ``(N, 1)``), a higher one squeezed."""
    labels_rank, predictions_rank = labels.shape.rank, predictions.shape.rank
    if labels_rank == predictions_rank + 1 and labels.shape[-1] == 1:
        if predictions_rank == 1:
            predictions = tf.expand_dims(predictions, -1)
        else:
            labels = tf.squeeze(labels, -1)
    if predictions_rank == labels_rank + 1 and predictions.shape[-1] == 1:
        if labels_rank == 1:
            labels = tf.expand_dims(labels, -1)
        else:
            predictions = tf.squeeze(predictions, -1)
    return labels, predictions


def per_sample(values: Any, predictions: Any) -> tf.Tensor:
    """One value per example: the mean over the other axes (Keras' ``sum_over_batch_size``
    and ``Mean`` both weigh an example's elements equally); a scalar, for every example."""
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        return tf.fill(tf.shape(predictions)[:1], values)
    if values.shape.rank > 1:
        return tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values


def _shape_kind(labels: Any, predictions: Any) -> str:
    """Keras' ``is_binary_or_sparse_categorical`` (trainers/compile_utils.py), which picks
    the loss for ``"crossentropy"`` and the metric for ``"accuracy"`` from static shapes."""
    if predictions.shape[-1] == 1:
        return "binary"
    if labels.shape.rank < predictions.shape.rank or (labels.shape[-1] == 1 and predictions.shape[-1] > 1):
        return "sparse"
    return "categorical"


_CROSSENTROPY = {"binary": "binary_crossentropy", "sparse": "sparse_categorical_crossentropy",
                 "categorical": "categorical_crossentropy"}


def _per_example_loss(recipe: Recipe, loss: Any) -> Callable[[Any, Any], Any]:
    if loss is None:
        raise _refuse(recipe, "no loss; pass loss=... to compile()")
    if isinstance(loss, (list, tuple, dict)):
        raise _refuse(recipe, f"a {type(loss).__name__} of losses; one output with one loss is supported")
    if isinstance(loss, str) and loss.lower() in ("crossentropy", "ce"):  # chosen by shapes, as Keras does
        def crossentropy(labels, predictions):
            function = keras.losses.get(_CROSSENTROPY[_shape_kind(labels, predictions)])
            return _aligned(function)(labels, predictions)

        return crossentropy
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError as exc:
            raise _refuse(recipe, f"loss={loss!r}, which Keras does not know ({exc})") from None
    if isinstance(loss, type) and issubclass(loss, keras.losses.Loss):
        loss = loss()
    if isinstance(loss, keras.losses.Loss):
        instance = loss

        def unreduced(labels, predictions):
            dtype = instance.dtype or "float32"  # Loss.__call__ converts both to its dtype
            return per_sample(instance.call(tf.cast(labels, dtype), tf.cast(predictions, dtype)), predictions)

        return unreduced
    if callable(loss):
        return _aligned(loss)
    raise _refuse(recipe, f"loss={loss!r}; expected a name, a function or a keras.losses.Loss")


def _aligned(function: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A loss function as Keras' compile calls it: in a ``LossFunctionWrapper`` (labels and
    predictions in the float dtype, ranks aligned), reduced to one value per example."""
    def loss(labels, predictions):
        dtype = keras.backend.floatx()
        labels, predictions = same_rank(tf.cast(labels, dtype), tf.cast(predictions, dtype))
        return per_sample(function(labels, predictions), predictions)

    return loss


def _accuracy() -> Callable[[Any, Any], Any]:
    """``"accuracy"`` as Keras' compile resolves it from the static shapes (trace time)."""
    functions = {"binary": keras.metrics.binary_accuracy, "sparse": keras.metrics.sparse_categorical_accuracy,
                 "categorical": keras.metrics.categorical_accuracy}

    def accuracy(labels, predictions):
        return functions[_shape_kind(labels, predictions)](labels, predictions)

    return accuracy


def _metrics(recipe: Recipe, metrics: Any) -> Callable[[Any, Any], dict] | None:
    if not metrics:
        return None
    if isinstance(metrics, dict) or not isinstance(metrics, (list, tuple)):
        raise _refuse(recipe, f"metrics of type {type(metrics).__name__}; expected a list")
    resolved: dict[str, Callable[[Any, Any], Any]] = {}
    for entry in metrics:
        name, fn = _metric(recipe, entry)
        if name in resolved:
            raise _refuse(recipe, f"two metrics named {name!r}")
        resolved[name] = fn

    def per_example(labels, predictions):
        return {name: per_sample(fn(labels, predictions), predictions) for name, fn in resolved.items()}

    return per_example


def _metric(recipe: Recipe, entry: Any) -> tuple[str, Callable[[Any, Any], Any]]:
    """(name, per-example function) of one ``metrics=[...]`` entry, named as Keras names it."""
    if isinstance(entry, str):
        if entry.lower() in ("accuracy", "acc"):
            return entry, _accuracy()
        try:
            found = keras.metrics.get(entry)
        except ValueError as exc:
            raise _refuse(recipe, f"metric {entry!r}, which Keras does not know ({exc})") from None
        found = found() if isinstance(found, type) else found
        if not isinstance(found, keras.metrics.Metric):
            return entry, found
        name, entry = entry, found  # Keras names it as written ("mse", not "mean_squared_error")
    else:
        name = getattr(entry, "name", None) or getattr(entry, "__name__", "metric")
    mean_wrapper = keras.metrics.MeanMetricWrapper
    if isinstance(entry, mean_wrapper) and type(entry).update_state is mean_wrapper.update_state:
        fn, kwargs = entry._fn, dict(entry._fn_kwargs)
        return name, lambda labels, predictions: fn(labels, predictions, **kwargs)
    if isinstance(entry, keras.metrics.Metric):
        raise _refuse(recipe, f"metric {entry.name!r} ({type(entry).__name__}), whose state is not a mean of "
                              "per-example values; use mean metrics (accuracy, mae, ...) or recipe metrics()")
    if callable(entry):
        return name, entry
    raise _refuse(recipe, f"metric {entry!r}; expected a name, a function or a keras metric")
