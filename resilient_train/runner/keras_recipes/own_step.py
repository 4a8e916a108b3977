"""A model's own ``train_step``, run inside the runner's distributed call.

Keras' "Customizing what happens in fit()" guide (TensorFlow backend) has a ``keras.Model``
subclass override ``train_step(self, data)``: a ``tf.GradientTape``, ``self.compute_loss``
or a loss of its own, ``self.optimizer.apply`` / ``apply_gradients``, metric trackers
(``keras.metrics.Mean``) listed by a ``metrics`` property, and a dict of logs returned
(GANs, VAEs and contrastive models are written that way). The runner's own step would
silently ignore it, so such a model's step is its ``train_step``, called where Keras' TF
trainer calls it: per replica under ``strategy.run``, inside the runner's call of N steps
(runner/training/train_call.py ``TrainCall``), so steps per call, the packed all-reduce of the
stop/save/size votes, saves, the memory tier and exact resume are unchanged.

What Keras does under a strategy, and so what is done here:

* the step's logs are the replicas' MEAN (Keras' ``reduce_per_replica(..., "auto")``):
  each replica adds ``value / num_replicas`` to the packed all-reduce's SUM;
* the trackers are reset at every epoch's start (fit's ``reset_metrics()``), not when an
  attempt re-enters an epoch mid-way;
* an epoch's logs are the trackers' results read across replicas
  (``get_metrics_result()``) when the last step's logs have exactly the names of
  ``model.metrics``, else the last step's logs (Keras' ``_get_metrics_result_or_logs``);
* the trackers' variables are in every checkpoint (runner/state/ckpt_layout.py
  ``metrics``), so a resumed epoch reports what an uninterrupted one would. They are
  sync-on-read sums: a checkpoint holds the sum over replicas and a restore gives each
  replica ``sum / replicas``, so with several replicas the resumed epoch's logs equal the
  uninterrupted run's to float32 rounding (the weights, which the logs do not feed, are
  bit-identical); with one replica, exactly.

Refused, one line each (``RecipeRefused``): ``run_eagerly`` / ``jit_compile`` /
``steps_per_execution`` as for any compiled model (runner/keras_recipes/compiled.py),
no optimizer, logs that are not a dict of scalars, and validation in ``fit`` or
``evaluate`` after it (a model's own ``test_step`` is not run by the runner's evaluation
yet): job/recipe.py refuses the literal cases before workers start.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from resilient_train.errors import RecipeRefused
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import from_fit_script
from resilient_train.runner.input.batches import with_autograph

__all__ = ["has_own_step", "from_own_step", "OwnStep", "LastLogs"]


def has_own_step(model: Any) -> bool:
    """Does ``model``'s class override ``train_step`` (Keras' trainer then runs that)? A class
    that overrides only ``compute_loss`` / ``compute_metrics`` is refused by
    runner/keras_recipes/compiled.py; ``test_step`` matters only to evaluation (refused)."""
    owner = next((k for k in type(model).__mro__ if "train_step" in vars(k)), None)
    return owner is not None and not owner.__module__.startswith("keras.")


def _refuse(recipe: Recipe, what: str) -> RecipeRefused:
    """One line in the user's terms (a fit script compiled a model; a recipe's build_model returned one)."""
    if from_fit_script(recipe):
        return RecipeRefused(f"Script {Path(recipe.source).name}: its model has its own train_step and {what}")
    return RecipeRefused(f"recipe {recipe.name}: build_model() returned a model with its own train_step and {what}")


def from_own_step(recipe: Recipe, model: keras.Model) -> Recipe:
    """``recipe`` for a compiled model with its own ``train_step``: the optimizer is the one
    ``compile`` was given; loss and metrics are the step's own (``loss`` is never called)."""
    config = dict(model._compile_config.config)
    if config.get("run_eagerly"):
        raise _refuse(recipe, "run_eagerly=True; the runner compiles its step (leave run_eagerly unset)")
    if config.get("jit_compile") is True:
        raise _refuse(recipe, "jit_compile=True; the runner's step is not XLA-compiled (leave it unset)")
    if config.get("steps_per_execution", 1) != 1:
        raise _refuse(recipe, f"steps_per_execution={config['steps_per_execution']}; use the runner's "
                              "--steps-per-execution instead")
    if model.optimizer is None:
        raise _refuse(recipe, "no optimizer; pass optimizer=... to compile()")
    if recipe.eval_dataset is not None:
        raise _refuse(recipe, "validation; not supported yet: the runner's evaluation does not run a model's "
                              "own test_step")
    optimizer = model.optimizer
    return dataclasses.replace(recipe, build_optimizer=lambda params: optimizer, loss=_never_called, metrics=None)


def _never_called(labels: Any, predictions: Any) -> Any:
    raise AssertionError("a model with its own train_step computes its own loss")


class OwnStep:
    """The model's ``train_step`` as the runner's replica step, and its epoch logs."""

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy, recipe: Recipe) -> None:
        self.model = model
        self.recipe = recipe
        self.replicas = strategy.num_replicas_in_sync
        # AutoGraph converts it at its first trace, as Keras' tf.function of train_step does.
        self._train_step = with_autograph(model.train_step)
        self._results = tf.function(lambda: {m.name: m.result() for m in model.metrics}, autograph=False)

    def step(self, data: Any) -> dict[str, tf.Tensor]:
        """One replica's step: ``train_step(data)``; its logs divided by the replicas (their
        SUM in the packed all-reduce is Keras' MEAN over replicas)."""
        logs = self._train_step(data)
        if not isinstance(logs, dict) or not logs:
            raise _refuse(self.recipe, f"its train_step returned {type(logs).__name__}; expected a dict of "
                                       "scalar logs, as Keras' fit() logs them")
        values = {}
        for name, value in logs.items():
            value = tf.convert_to_tensor(value)
            if value.shape.rank != 0:
                raise _refuse(self.recipe, f"its train_step's log {name!r} has shape {value.shape}; expected a "
                                           "scalar (Keras' fit() logs scalars)")
            values[str(name)] = tf.cast(value, tf.float32) / self.replicas
        return values

    def reset(self) -> None:
        """An epoch starts: the trackers start over (Keras' fit resets them every epoch)."""
        self.model.reset_metrics()

    def epoch_logs(self, last: dict[str, float]) -> dict[str, float]:
        """The epoch's logs: the trackers' results read across replicas when the last step's
        logs name exactly ``model.metrics``, else the last step's logs (Keras' choice). Every
        worker must call it (a read of a sync-on-read variable is a collective)."""
        names = [m.name for m in self.model.metrics]
        if set(last) != set(names):
            return dict(last)
        return {name: float(value) for name, value in self._results().items()}


class LastLogs:
    """A model's own step logs running results, so an epoch's numbers are its last step's
    (``EpochStats``' means of per-step values would average averages)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.batches = 0

    def add(self, values: dict[str, float]) -> None:
        self.last = dict(values)
        self.batches += 1

    def means(self) -> dict[str, float]:
        return dict(self.last)

    def to_extra(self) -> dict[str, Any]:
        return {"epoch_last_logs": dict(self.last), "epoch_batches": self.batches}

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.last = {k: float(v) for k, v in extra.get("epoch_last_logs", {}).items()}
        self.batches = int(extra.get("epoch_batches", 0))
