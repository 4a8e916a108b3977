"""A compiled model with several outputs: Keras' per-output losses, loss weights and metrics.

A functional model with outputs ``[risk, prog]`` or ``{"risk": ..., "prog": ...}`` compiled
with ``loss={"risk": "bce", "prog": "mse"}`` (or a list, or one loss for every output),
``loss_weights={...}`` (or a list) and ``metrics={"risk": ["accuracy"], "prog": "mae"}`` (or
a list with one entry per output) trains in plain Keras on the weighted sum of the outputs'
mean losses and logs ``loss``, ``<output>_loss`` (each output's loss, before its weight)
and ``<output>_<metric>`` (keras/src/trainers/compile_utils.py: ``CompileLoss``,
``CompileMetrics``). The runner's step needs ONE per-example loss (it divides by the global
batch across replicas), so the loss here is, per example, ``sum_i w_i * loss_i``: its mean
is Keras' ``sum_i w_i * mean(loss_i)`` up to float32 rounding (the sum and the means are
taken in the other order). ``<output>_loss`` and the per-output metrics are per-example
values of the runner's metrics (compiled.py), so they are averaged per epoch and kept
with every checkpoint like the others.

The outputs are taken in ``model.output_names`` order; labels come as a dict keyed by
output name or as a list in the order Keras packs one (the outputs' order for a list of
outputs, the sorted names for a dict of outputs: ``tree.pack_sequence_as``). Each output's
loss and metrics are resolved as for one output (compiled.py: names, functions, Loss
objects, ``"accuracy"`` by shape), so what one output refuses, several refuse.

Refused with one line (what Keras itself refuses, or cannot be made exact here): nested
outputs (a dict of lists), a loss dict whose keys are not the outputs' names, a list of
another length than the outputs, ``loss_weights`` that do not name each loss.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import (per_example_loss, per_sample, refusal, resolved_metrics,
                                                           split_stateful)
from resilient_train.runner.keras_recipes.metric_states import MetricStates, StatefulMetric, built_for

__all__ = ["several_outputs"]

PerExample = Callable[[Any, Any], Any]


def several_outputs(recipe: Recipe, model: keras.Model,
                    config: dict[str, Any]) -> tuple[PerExample, PerExample | None, MetricStates | None]:
    """The per-example ``loss`` and ``metrics`` functions of a compiled several-output model, and
    its summed-state metrics (``risk_auc``: metric_states.py)."""
    names = list(model.output_names)
    structure = model.output
    if not isinstance(structure, (list, tuple, dict)) or len(structure) != len(names) or any(
            isinstance(item, (list, tuple, dict)) for item in (structure.values() if isinstance(structure, dict)
                                                               else structure)):
        raise refusal(recipe, f"nested outputs ({len(names)} tensors); a flat list or dict of outputs is supported")
    if len(set(names)) != len(names):
        raise refusal(recipe, f"outputs with the same name {names}; give each output layer its own name")
    # The order in which Keras packs a list of labels onto the outputs.
    packing = sorted(structure) if isinstance(structure, dict) else names
    losses = _per_output(recipe, config.get("loss"), names, "loss", exact_keys=not isinstance(structure, dict))
    if not any(spec is not None for spec in losses.values()):
        raise refusal(recipe, "no loss; pass loss=... to compile()")
    functions = {name: per_example_loss(recipe, spec) for name, spec in losses.items() if spec is not None}
    weights = _loss_weights(recipe, config.get("loss_weights"), names, list(functions))

    def outputs(values: Any, what: str) -> dict[str, Any]:
        if isinstance(values, dict):
            missing = [name for name in functions if name not in values]
            if missing:
                raise RecipeError(f"recipe {recipe.name}: the {what} have no entry for the output(s) {missing}; "
                                  f"expected a dict keyed by {names} or a list in that order")
            return dict(values)
        if isinstance(values, (list, tuple)) and len(values) == len(names):
            return dict(zip(packing, values))
        raise RecipeError(f"recipe {recipe.name}: the model has {len(names)} outputs {names}, the {what} are "
                          f"{type(values).__name__}; expected a dict keyed by output name or a list of {len(names)}")

    def loss(labels: Any, predictions: Any) -> tf.Tensor:
        labels, predictions = outputs(labels, "labels"), outputs(predictions, "predictions")
        total = None
        for name, function in functions.items():
            value = tf.cast(function(labels[name], predictions[name]), tf.float32)
            if weights[name] is not None:
                value = value * weights[name]
            total = value if total is None else total + value
        return total

    metrics = _per_output_metrics(recipe, config.get("metrics"), names, exact_keys=False)
    shapes = dict(zip(names, (tuple(output.shape) for output in model.outputs)))
    stateful = []
    for name in list(metrics):
        metrics[name], summed = split_stateful(metrics[name])
        stateful += [StatefulMetric(metric_name, built_for(metric, shapes[name]), _selector(outputs, name))
                     for metric_name, metric in summed.items()]

    def per_example(labels: Any, predictions: Any) -> dict[str, Any]:
        labels, predictions = outputs(labels, "labels"), outputs(predictions, "predictions")
        values = {}
        if len(functions) > 1:  # Keras tracks each loss only when there are several (CompileLoss.build)
            values.update({f"{name}_loss": function(labels[name], predictions[name])
                           for name, function in functions.items()})
        for name, resolved in metrics.items():
            for metric_name, function in resolved.items():
                values[metric_name] = per_sample(function(labels[name], predictions[name]), predictions[name])
        return values

    mean_metrics = len(functions) > 1 or any(metrics.values())
    return loss, per_example if mean_metrics else None, MetricStates(stateful) if stateful else None


def _selector(outputs: Callable[[Any, str], dict[str, Any]], name: str) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``(labels, predictions)`` of the output ``name``."""
    def select(labels: Any, predictions: Any) -> tuple[Any, Any]:
        return outputs(labels, "labels")[name], outputs(predictions, "predictions")[name]

    return select


def _per_output(recipe: Recipe, value: Any, names: list[str], what: str, *, exact_keys: bool) -> dict[str, Any]:
    """``{output name: entry or None}`` of a compile argument given per output (a dict by
    name, a list in output order) or once for every output."""
    if value is None:
        return {name: None for name in names}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        if unknown or (exact_keys and set(value) != set(names)):
            raise refusal(recipe, f"{what}={{...}} with keys {sorted(value)}; the model's outputs are {names} "
                                  "(a dict needs one key per output, as Keras does)")
        return {name: value.get(name) for name in names}
    if isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise refusal(recipe, f"a list of {len(value)} {what} for {len(names)} outputs {names}; give one entry per "
                                  "output (None for none) or a dict by output name")
        return dict(zip(names, value))
    return {name: value for name in names}


def _loss_weights(recipe: Recipe, value: Any, names: list[str], with_loss: list[str]) -> dict[str, float | None]:
    if value is None:
        return {name: None for name in names}
    if isinstance(value, dict):
        missing = [name for name in with_loss if name not in value]
        unknown = sorted(set(value) - set(names))
        if missing or unknown:
            raise refusal(recipe, f"loss_weights={{...}} with keys {sorted(value)}; expected one per loss: {with_loss}")
        return {name: value.get(name) for name in names}
    if isinstance(value, (list, tuple)) and len(value) == len(names):
        return dict(zip(names, value))
    raise refusal(recipe, f"loss_weights={value!r}; expected a dict by output name or a list of {len(names)}")


def _per_output_metrics(recipe: Recipe, value: Any, names: list[str], *,
                        exact_keys: bool) -> dict[str, dict[str, PerExample]]:
    """``{output name: {"<output>_<metric>": function}}``, Keras' names (CompileMetrics.result)."""
    if not value:
        return {}
    if not isinstance(value, (list, tuple, dict)) or (isinstance(value, (list, tuple)) and len(value) != len(names)):
        raise refusal(recipe, f"metrics={value!r} for {len(names)} outputs {names}; give a list with one entry per "
                              "output or a dict by output name, as Keras does")
    per_output = _per_output(recipe, value, names, "metrics", exact_keys=exact_keys)
    resolved: dict[str, dict[str, PerExample]] = {}
    seen: set[str] = set()
    for name, entry in per_output.items():
        if entry is None:
            continue
        functions = resolved_metrics(recipe, entry, prefix=f"{name}_")
        clash = seen & set(functions)
        if clash:
            raise refusal(recipe, f"two metrics named {sorted(clash)[0]!r}")
        seen |= set(functions)
        resolved[name] = functions
    return resolved
