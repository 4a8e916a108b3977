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
  (tests/runner/keras_recipes/test_compiled.py).

* several outputs: losses, ``loss_weights`` and metrics per output (multi_output.py).
* Keras' metrics whose state is a sum, not a mean (``AUC``, ``Precision``, ``F1Score``,
  ``MeanIoU``...): ``Recipe.metric_states`` (metric_states.py), summed over the workers in the
  step's all-reduce; ``weighted_metrics`` (one output) the same way, updated with the
  batch's sample weights.

Refused, with one line (``RecipeError``; the supervisor refuses the literal cases before
workers start, job/recipe.py): ``weighted_metrics`` with several outputs, ``loss_weights``
for one output, a metric with one result per class or threshold, a ``Metric`` class of the
user's own (its state may not be a sum), a model class that overrides ``test_step`` /
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
from resilient_train.runner.keras_recipes.metric_states import ADDITIVE, MetricStates, StatefulMetric, built_for

__all__ = ["is_compiled", "from_compiled", "same_rank", "per_sample", "per_example_loss", "resolved_metrics", "split_stateful", "refusal",
           "from_fit_script", "TRAINER_OVERRIDES"]

TRAINER_OVERRIDES = ("train_step", "test_step", "compute_loss", "compute_metrics")


def is_compiled(model: Any) -> bool:
    return bool(getattr(model, "compiled", False))


def refusal(recipe: Recipe, what: str) -> RecipeRefused:
    """The refusal of what ``compile`` was given, in the user's terms (script or recipe)."""
    return _refuse(recipe, what)


def _refuse(recipe: Recipe, what: str) -> RecipeRefused:
    """One line in the user's terms: a fit script has no build_model(), it compiled a model."""
    if from_fit_script(recipe):
        return RecipeRefused(f"Script {Path(recipe.source).name}: its model was compiled with {what}")
    return RecipeRefused(f"recipe {recipe.name}: build_model() returned a compiled model with {what}")


def from_fit_script(recipe: Recipe) -> bool:
    """Is ``recipe`` a model.fit script's (runner/keras_recipes/fitscript.py), not a recipe module?"""
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
    several = len(model.outputs or []) > 1
    if config.get("weighted_metrics") and several:
        raise _refuse(recipe, "weighted_metrics and several outputs; not supported yet (sample weights with several "
                              "outputs are not either)")
    if config.get("loss_weights") is not None and not several:
        raise _refuse(recipe, "loss_weights on a model with one output; give loss_weights with several outputs")
    if model.optimizer is None:
        raise _refuse(recipe, "no optimizer; pass optimizer=... to compile()")
    present = [name for name in ("build_optimizer", "loss", "metrics") if getattr(recipe, name) is not None]
    if present:
        raise _refuse(recipe, f"the recipe also defining {', '.join(present)}; take them from compile() "
                              "or from the recipe, not both")
    if several:
        from resilient_train.runner.keras_recipes.multi_output import several_outputs  # it builds on this module

        loss, metrics, states = several_outputs(recipe, model, config)
    else:
        loss = _per_example_loss(recipe, config.get("loss"))
        metrics, states, names = _metrics(recipe, config.get("metrics"), tuple(model.outputs[0].shape))
        weighted = _weighted_metrics(recipe, config.get("weighted_metrics"), tuple(model.outputs[0].shape),
                                     taken=names)
        if weighted:
            states = MetricStates([*(states.metrics if states is not None else []), *weighted])
    vectors = [] if states is None else states.not_scalar()
    if vectors:
        raise _refuse(recipe, f"metric {vectors[0]!r}, whose result is not one number (several thresholds or "
                              "classes); a log, a CSV column and a callback's monitor need one: give one threshold, "
                              "or an average")
    optimizer = model.optimizer
    return dataclasses.replace(
        recipe, build_optimizer=lambda params: optimizer, loss=loss, metrics=metrics, metric_states=states,
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


def per_example_loss(recipe: Recipe, loss: Any) -> Callable[[Any, Any], Any]:
    """One ``compile`` loss (a name, a function, a ``keras.losses.Loss``) as a per-example function."""
    return _per_example_loss(recipe, loss)


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


def _metrics(recipe: Recipe, metrics: Any, output_shape: tuple) -> tuple[Callable[[Any, Any], dict] | None,
                                                                         MetricStates | None, set[str]]:
    """The per-example metrics function (None: none), the summed-state metrics (None: none)
    and every metric's name."""
    if not metrics:
        return None, None, set()
    if isinstance(metrics, dict) or not isinstance(metrics, (list, tuple)):
        raise _refuse(recipe, f"metrics of type {type(metrics).__name__}; expected a list")
    resolved, stateful = split_stateful(resolved_metrics(recipe, metrics))

    def per_example(labels, predictions):
        return {name: per_sample(fn(labels, predictions), predictions) for name, fn in resolved.items()}

    states = [StatefulMetric(name, built_for(metric, output_shape), _both) for name, metric in stateful.items()]
    return (per_example if resolved else None), (MetricStates(states) if states else None), {*resolved, *stateful}


def _weighted_metrics(recipe: Recipe, entries: Any, output_shape: tuple, taken: set[str]) -> list[StatefulMetric]:
    """``compile(weighted_metrics=[...])`` as Keras' ``CompileMetrics`` builds them: each a
    metric object updated with the batch's sample weights (a mean's state is ``sum(w * value)``
    and ``sum(w)``: summed, metric_states.py), named as in ``metrics`` or, when that name is
    taken, ``weighted_<name>``."""
    if not entries:
        return []
    if isinstance(entries, dict) or not isinstance(entries, (list, tuple)):
        raise _refuse(recipe, f"weighted_metrics of type {type(entries).__name__}; expected a list")
    weighted: list[StatefulMetric] = []
    for entry in entries:
        metric = _metric_object(recipe, entry, output_shape)
        name = metric.name if metric.name not in taken else f"weighted_{metric.name}"
        if name in taken:
            raise _refuse(recipe, f"two metrics named {name!r}")
        taken.add(name)
        weighted.append(StatefulMetric(name, built_for(metric, output_shape), _both, weighted=True))
    return weighted


def _metric_object(recipe: Recipe, entry: Any, output_shape: tuple) -> keras.metrics.Metric:
    """A ``weighted_metrics`` entry as the Metric Keras' ``get_metric`` makes of it (named as given)."""
    if isinstance(entry, str) and entry.lower() in ("accuracy", "acc"):
        if output_shape[-1] != 1:  # Keras picks sparse or categorical from the labels' shape, unknown here
            raise _refuse(recipe, f"weighted_metrics=[{entry!r}] for {output_shape[-1]} output units; name it "
                                  "(sparse_categorical_accuracy or categorical_accuracy)")
        return keras.metrics.BinaryAccuracy(name=entry)
    found = entry
    if isinstance(entry, str):
        try:
            found = keras.metrics.get(entry)
        except ValueError as exc:
            raise _refuse(recipe, f"weighted metric {entry!r}, which Keras does not know ({exc})") from None
    found = found() if isinstance(found, type) else found
    if not isinstance(found, keras.metrics.Metric):
        if not callable(found):
            raise _refuse(recipe, f"weighted metric {entry!r}; expected a name, a function or a keras metric")
        found = keras.metrics.MeanMetricWrapper(found, name=entry if isinstance(entry, str) else found.__name__)
    elif isinstance(entry, str):
        found.name = entry  # Keras names it as written
    mean_wrapper = keras.metrics.MeanMetricWrapper
    summed = type(found).__name__ in ADDITIVE and type(found).__module__.startswith("keras.")
    if not (summed or isinstance(found, mean_wrapper) and type(found).update_state is mean_wrapper.update_state):
        raise _refuse(recipe, f"weighted metric {found.name!r} ({type(found).__name__}), not one of Keras' own "
                              "(a class of your own may keep a state that is not a sum)")
    return found


def _both(labels: Any, predictions: Any) -> tuple[Any, Any]:
    return labels, predictions


def split_stateful(resolved: dict[str, Any]) -> tuple[dict[str, Callable[[Any, Any], Any]], dict[str, Any]]:
    """``resolved_metrics`` split into per-example functions and summed-state metrics."""
    stateful = {name: entry for name, entry in resolved.items() if isinstance(entry, keras.metrics.Metric)}
    return {name: entry for name, entry in resolved.items() if name not in stateful}, stateful


def resolved_metrics(recipe: Recipe, metrics: Any, prefix: str = "") -> dict[str, Callable[[Any, Any], Any]]:
    """``{name: per-example function}`` of a list of metrics (or one), each named as Keras names
    it, ``prefix`` first (``"<output>_"`` for one output of several)."""
    resolved: dict[str, Callable[[Any, Any], Any]] = {}
    for entry in metrics if isinstance(metrics, (list, tuple)) else [metrics]:
        name, fn = _metric(recipe, entry)
        if prefix + name in resolved:
            raise _refuse(recipe, f"two metrics named {prefix + name!r}")
        resolved[prefix + name] = fn
    return resolved


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
        if type(entry).__name__ in ADDITIVE and type(entry).__module__.startswith("keras."):
            return name, entry  # its state is summed instead (metric_states.py)
        raise _refuse(recipe, f"metric {entry.name!r} ({type(entry).__name__}), whose state is not a mean of "
                              "per-example values and not one of Keras' own summed states (a class of your own may "
                              "keep a state that is not a sum); use Keras' metrics or recipe metrics()")
    if callable(entry):
        return name, entry
    raise _refuse(recipe, f"metric {entry!r}; expected a name, a function or a keras metric")
