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
  object's unreduced ``call`` is used, a function as is.
* ``metrics=[...]``: names (``"accuracy"`` resolved from the loss and shapes as Keras
  does) and metric objects that are per-example means (``MeanMetricWrapper``:
  ``SparseCategoricalAccuracy``, ``MeanAbsoluteError``, ...). Their epoch values are
  sums of per-step means kept with each checkpoint, so they repeat exactly after a resume.

Refused, with one line (``RecipeError``; the supervisor refuses the literal cases before
workers start, job/recipe.py): several outputs / a list or dict of losses,
``loss_weights``, ``weighted_metrics``, metrics whose state is not a mean of per-example
values (``AUC``, ``Precision``, ``F1Score``...), a model class that overrides
``train_step`` / ``test_step`` / ``compute_loss`` / ``compute_metrics`` (the runner's step would
silently ignore it), ``run_eagerly=True``, ``jit_compile=True`` and
``steps_per_execution`` other than 1 (the runner's ``--steps-per-execution`` does that).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import keras
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe

__all__ = ["is_compiled", "from_compiled", "TRAINER_OVERRIDES"]

TRAINER_OVERRIDES = ("train_step", "test_step", "compute_loss", "compute_metrics")


def is_compiled(model: Any) -> bool:
    return bool(getattr(model, "compiled", False))


def _refuse(recipe: Recipe, what: str) -> RecipeError:
    return RecipeError(f"recipe {recipe.name}: build_model() returned a compiled model with {what}")


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
    metrics = _metrics(recipe, config.get("metrics"), config.get("loss"))
    optimizer = model.optimizer
    return dataclasses.replace(
        recipe, build_optimizer=lambda params: optimizer, loss=loss, metrics=metrics,
    )


def _per_example_loss(recipe: Recipe, loss: Any) -> Callable[[Any, Any], Any]:
    if loss is None:
        raise _refuse(recipe, "no loss; pass loss=... to compile()")
    if isinstance(loss, (list, tuple, dict)):
        raise _refuse(recipe, f"a {type(loss).__name__} of losses; one output with one loss is supported")
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, type) and issubclass(loss, keras.losses.Loss):
        loss = loss()
    if isinstance(loss, keras.losses.Loss):
        instance = loss

        def unreduced(labels, predictions):
            dtype = instance.dtype or "float32"
            return instance.call(tf.cast(labels, dtype), tf.cast(predictions, dtype))

        return unreduced
    if callable(loss):
        return loss
    raise _refuse(recipe, f"loss={loss!r}; expected a name, a function or a keras.losses.Loss")


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return loss
    fn = getattr(loss, "fn", loss)
    return getattr(fn, "__name__", type(loss).__name__).lower()


def _accuracy(loss: Any) -> Callable[[Any, Any], Any]:
    """``"accuracy"`` as Keras resolves it: binary for one unit, sparse when labels lack
    the class axis, categorical otherwise (decided on static shapes at trace time)."""
    def accuracy(labels, predictions):
        if predictions.shape[-1] == 1 or "binary" in _loss_name(loss):
            return keras.metrics.binary_accuracy(labels, predictions)
        if labels.shape.rank < predictions.shape.rank or labels.shape[-1] == 1:
            return keras.metrics.sparse_categorical_accuracy(labels, predictions)
        return keras.metrics.categorical_accuracy(labels, predictions)

    return accuracy


def _metrics(recipe: Recipe, metrics: Any, loss: Any) -> Callable[[Any, Any], dict] | None:
    if not metrics:
        return None
    if isinstance(metrics, dict) or not isinstance(metrics, (list, tuple)):
        raise _refuse(recipe, f"metrics of type {type(metrics).__name__}; expected a list")
    resolved: dict[str, Callable[[Any, Any], Any]] = {}
    for entry in metrics:
        name, fn = _metric(recipe, entry, loss)
        if name in resolved:
            raise _refuse(recipe, f"two metrics named {name!r}")
        resolved[name] = fn

    def per_example(labels, predictions):
        return {name: fn(labels, predictions) for name, fn in resolved.items()}

    return per_example


def _metric(recipe: Recipe, entry: Any, loss: Any) -> tuple[str, Callable[[Any, Any], Any]]:
    if isinstance(entry, str):
        if entry in ("accuracy", "acc"):
            return entry, _accuracy(loss)
        found = keras.metrics.get(entry)
        if isinstance(found, keras.metrics.Metric) or isinstance(found, type):
            entry = found() if isinstance(found, type) else found
        else:
            return entry, found
    mean_wrapper = keras.metrics.MeanMetricWrapper
    if isinstance(entry, mean_wrapper) and type(entry).update_state is mean_wrapper.update_state:
        fn, kwargs = entry._fn, dict(entry._fn_kwargs)
        return entry.name, lambda labels, predictions: fn(labels, predictions, **kwargs)
    if isinstance(entry, keras.metrics.Metric):
        raise _refuse(recipe, f"metric {entry.name!r} ({type(entry).__name__}), whose state is not a mean of "
                              "per-example values; use mean metrics (accuracy, mae, ...) or recipe metrics()")
    if callable(entry):
        return getattr(entry, "__name__", "metric"), entry
    raise _refuse(recipe, f"metric {entry!r}; expected a name, a function or a keras metric")
