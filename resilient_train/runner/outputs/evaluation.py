"""Held-out evaluation at epoch ends: ``val_loss`` and ``val_<metric>`` over a finite split.

The recipe's optional ``eval_dataset(input_context, seed)`` is sharded like ``dataset``
and finite. Every ``eval_every_epochs`` epochs (and after the last one) every worker runs
the model on its shard under the strategy, after the epoch's checkpoint was taken (so an
async save persists while evaluation runs), and the per-replica SUMS of loss, metrics and
example counts are all-reduced; the means are sums over every held-out example divided
by their count, so uneven shards and a short last batch weigh each example once.

Why the numbers repeat to the last digit after a kill and resume: evaluation only reads
the weights (``training=False`` draws from no RNG and updates no statistics), the
weights at an epoch end are bit-identical on every attempt, the split is not shuffled,
and op determinism is on. Sums are kept in float64 on the host in batch order.

Refuses: ``--eval-every-epochs N > 0`` for a recipe without ``eval_dataset`` (a
``RecipeError``: fatal, a restart cannot fix it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from resilient_train.job.config import JobConfig
from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.data import RecipeInputContext
from resilient_train.runner.input.batches import with_autograph

__all__ = ["Evaluator", "Validation", "eval_every_epochs"]

_EXAMPLES = "__examples__"
_LOSS = "__loss__"
_STATES = "__metric_states__"  # the summed states of AUC, Precision... (runner/keras_recipes/metric_states.py)


@dataclass(frozen=True)
class Validation:
    """One evaluation: means over ``examples`` held-out examples."""

    loss: float
    metrics: dict[str, float] = field(default_factory=dict, hash=False)
    examples: int = 0

    def event_fields(self) -> dict[str, Any]:
        """The fields ``epoch_finished`` carries (docs/events.md)."""
        return {"val_loss": self.loss, "val_metrics": dict(self.metrics), "val_examples": self.examples}


def eval_every_epochs(job: JobConfig, recipe: Recipe) -> int:
    """The resolved interval: the flag, else 1 when the recipe has an eval split, else 0."""
    if job.eval_every_epochs is None:
        return 1 if recipe.eval_dataset is not None else 0
    if job.eval_every_epochs > 0 and recipe.eval_dataset is None:
        raise RecipeError(
            f"Received eval_every_epochs={job.eval_every_epochs} but recipe {recipe.name} defines no "
            "eval_dataset(input_context, seed); add one or pass --eval-every-epochs 0"
        )
    return job.eval_every_epochs


class Evaluator:
    """Runs the recipe's eval split through the model on every worker; one instance per run."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        recipe: Recipe,
        params: dict[str, Any],
        *,
        every_epochs: int,
        total_epochs: int,
        seed: int,
        global_batch_size: int,
        max_steps: int | None = None,
    ) -> None:
        if recipe.eval_dataset is None or every_epochs < 1:
            raise ValueError(f"Received every_epochs={every_epochs} for recipe {recipe.name}; expected an eval split and >= 1")
        self.strategy = strategy
        self.model = model
        self.recipe = recipe
        self.params = params
        self.every_epochs = every_epochs
        self.total_epochs = total_epochs
        self.seed = seed
        self.global_batch_size = global_batch_size
        self.max_steps = max_steps
        # A model with its own test_step is evaluated by it, as Keras' evaluate does (runner/keras_recipes/own_step.py).
        from resilient_train.runner.keras_recipes.own_step import OwnTestStep, has_own_test_step

        self._own_test = OwnTestStep(model, strategy, recipe) if has_own_test_step(model) else None
        self._step = self._make_eval_step() if self._own_test is None else None
        # Where a finished evaluation's iterator goes: by default dropped here; the Trainer
        # hands it to its reaper thread (runner/input/teardown.py), as it does each epoch's input.
        self.retire: Callable[[Any], Any] = lambda iterator: None

    @classmethod
    def for_job(cls, strategy, model, recipe: Recipe, params: dict[str, Any], job: JobConfig) -> "Evaluator | None":
        """The evaluator ``job`` asks for, or None when evaluation is off."""
        every = eval_every_epochs(job, recipe)
        if every == 0:
            return None
        return cls(
            strategy, model, recipe, params,
            every_epochs=every,
            total_epochs=job.epochs,
            seed=job.seed,
            global_batch_size=job.global_batch_size,
            max_steps=job.eval_steps,
        )

    def due(self, epochs_done: int) -> bool:
        """Evaluate after ``epochs_done`` epochs? Every N-th, and always after the last."""
        return epochs_done % self.every_epochs == 0 or epochs_done >= self.total_epochs

    def after_epoch(self, epochs_done: int) -> dict[str, Any]:
        """``epoch_finished`` fields for this epoch end: the validation, or nothing if not due."""
        return self.evaluate().event_fields() if self.due(epochs_done) else {}

    def evaluate(self) -> Validation:
        """One pass over the eval split on every worker (collective: all workers must call it)."""
        if self._own_test is not None:
            iterator = iter(self._dataset())
            logs, examples = self._own_test.evaluate(iterator)
            self.retire(iterator)
            del iterator
            return Validation(loss=logs.pop("loss"), metrics=logs, examples=examples)
        totals: dict[str, float] = {}
        states = self.recipe.metric_states
        state_sums = None if states is None else np.zeros(states.width, np.float32)
        iterator = iter(self._dataset())
        for features, labels in iterator:
            for name, value in self._step(features, labels).items():
                if name == _STATES:  # float32 sums, as the metric's own variables add
                    state_sums = state_sums + value.numpy()
                else:
                    totals[name] = totals.get(name, 0.0) + float(value)
        self.retire(iterator)
        del iterator
        examples = int(totals.pop(_EXAMPLES, 0.0))
        if examples == 0:
            raise RecipeError(f"recipe {self.recipe.name}: eval_dataset() yielded no examples")
        loss = totals.pop(_LOSS) / examples
        metrics = {k: v / examples for k, v in totals.items()}
        if states is not None:
            metrics.update(states.results(state_sums))
        return Validation(loss=loss, metrics=metrics, examples=examples)

    def _dataset(self):
        recipe, params, seed, max_steps = self.recipe, self.params, self.seed, self.max_steps
        global_batch_size = self.global_batch_size

        def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
            context = RecipeInputContext(input_context, global_batch_size, params)
            dataset = recipe.eval_dataset(context, seed)
            if not isinstance(dataset, tf.data.Dataset):
                raise TypeError(
                    f"recipe {recipe.name}: eval_dataset() returned {type(dataset).__name__}; expected a tf.data.Dataset"
                )
            if dataset.cardinality() == tf.data.INFINITE_CARDINALITY and max_steps is None:
                raise RecipeError(
                    f"recipe {recipe.name}: eval_dataset() is infinite; remove repeat() or pass --eval-steps"
                )
            options = tf.data.Options()
            options.deterministic = True
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            dataset = dataset.with_options(options)
            return dataset.take(max_steps) if max_steps is not None else dataset

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _make_eval_step(self):
        model, recipe, strategy = self.model, self.recipe, self.strategy
        # As the training call (runner/training/loop.py): only the recipe's own functions are converted by AutoGraph.
        loss = with_autograph(recipe.loss)
        metrics = None if recipe.metrics is None else with_autograph(recipe.metrics)

        def step_fn(features, labels):
            predictions = model(features, training=False)
            per_example = tf.cast(loss(labels, predictions), tf.float64)
            sums = {_LOSS: tf.reduce_sum(per_example), _EXAMPLES: tf.cast(tf.shape(per_example)[0], tf.float64)}
            if metrics is not None:
                for name, values in metrics(labels, predictions).items():
                    sums[name] = tf.reduce_sum(tf.cast(values, tf.float64))
            if recipe.metric_states is not None:  # summed states (runner/keras_recipes/metric_states.py)
                sums[_STATES] = recipe.metric_states.shares(labels, predictions)
            return sums

        # A short last batch has another shape: let the function generalise, not retrace per shape.
        @tf.function(reduce_retracing=True, autograph=False)
        def eval_step(features, labels):
            per_replica = strategy.run(step_fn, args=(features, labels))
            return {
                name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for name, value in per_replica.items()
            }

        return eval_step
