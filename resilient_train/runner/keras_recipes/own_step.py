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
  ``metrics``), so a resumed epoch reports what an uninterrupted one would, to the bit.
  They are sync-on-read sums: a checkpoint holds the sum over replicas and a restore gives
  each replica ``sum / replicas``. Left alone, each replica's share would hold its own
  running sum, and a resumed epoch would add its steps to an equal split instead: its
  logs (and a CSVLogger's rows, an EarlyStopping on them) would differ from the
  uninterrupted run's in float32 rounding, an epoch resumed mid-way included, so the
  numbers would depend on where kills and hangs fell. So with several replicas every step
  puts its trackers in the state a restore gives (:meth:`OwnStep.fold`): after the
  model's ``train_step``, each replica's float32 sum-aggregated tracker variables ride the
  step's one packed all-reduce (no collective of their own) and each replica keeps
  :func:`equal_share` of the sum. A restore at any step then gives back exactly the
  state the uninterrupted run had there. With one replica nothing is folded (plain Keras'
  numbers, bit for bit).

A model that also overrides ``test_step`` is evaluated with it (validation in ``fit``,
``evaluate`` after it: runner/outputs/evaluation.py hands such a model to
:class:`OwnTestStep`), as Keras' ``evaluate`` runs it: the trackers are reset first,
``test_step`` runs per replica on each held-out batch, its logs are the replicas' MEAN,
and the result is the trackers' results when the logs name exactly ``model.metrics``,
else the last batch's logs; ``fit`` reports them as ``val_<name>``.

Optimizers of its own (keras.io's GAN: ``compile(d_optimizer=..., g_optimizer=...)``
overridden, each applied in ``train_step``) are attributes of the model, so the checkpoint
holds them under ``model``; Keras builds them at their first ``apply_gradients``, so they are
built before any restore by tracing ``train_step`` once (:meth:`OwnStep.build_own_optimizers`,
from a batch's spec: a fit script's input, or a recipe's dataset of epoch 0).

Refused, one line each (``RecipeRefused``): ``run_eagerly`` / ``jit_compile`` /
``steps_per_execution`` as for any compiled model (runner/keras_recipes/compiled.py),
no optimizer, logs that are not a dict of scalars, a ``test_step`` whose logs have no
``loss`` (the runner's validation reports ``val_loss``), and validation in ``fit`` or
``evaluate`` after it when the class keeps Keras' own ``test_step`` (it would evaluate
``compile``'s loss, which such a model does not give the runner): job/recipe.py refuses the
literal cases before workers start.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from resilient_train.errors import RecipeRefused
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.compiled import from_fit_script
from resilient_train.runner.input.batches import with_autograph

__all__ = ["has_own_step", "has_own_test_step", "own_optimizers", "build_own_optimizers", "build_twin_optimizers",
           "equal_share", "from_own_step", "OwnStep", "OwnTestStep", "LastLogs"]

_EXAMPLES = "__examples__"  # the held-out examples a test step saw, beside its logs


def has_own_step(model: Any, method: str = "train_step") -> bool:
    """Does ``model``'s class override ``train_step`` (Keras' trainer then runs that)? A class
    that overrides only ``compute_loss`` / ``compute_metrics`` is refused by
    runner/keras_recipes/compiled.py."""
    owner = next((k for k in type(model).__mro__ if method in vars(k)), None)
    return owner is not None and not owner.__module__.startswith("keras.")


def has_own_test_step(model: Any) -> bool:
    """A model with its own ``train_step`` and ``test_step``: evaluated by :class:`OwnTestStep`."""
    return isinstance(model, keras.Model) and has_own_step(model) and has_own_step(model, "test_step")


def own_optimizers(model: Any) -> dict[str, keras.optimizers.Optimizer]:
    """The model's optimizers other than ``compile``'s (keras.io's GAN: ``d_optimizer``,
    ``g_optimizer``), by attribute name. The model tracks them, so every checkpoint holds their
    state under its ``model`` key (``model/d_optimizer/...``), once they are built
    (:meth:`OwnStep.build_own_optimizers`)."""
    return {name: value for name, value in sorted(vars(model).items())
            if isinstance(value, keras.optimizers.Optimizer) and value is not getattr(model, "optimizer", None)}


def build_twin_optimizers(model: keras.Model, twin: keras.Model) -> None:
    """A recipe's twin (``build_model`` called again: runner/training/loop.py ``_build_twin``) has
    its own optimizers unbuilt: build each over the twin's variables at the positions the live
    one was built over (by :meth:`OwnStep.build_own_optimizers`), so the checkpoint keys agree."""
    twin_of = {id(v): t for v, t in zip(model.trainable_variables, twin.trainable_variables)}
    for name, optimizer in own_optimizers(model).items():
        copy = getattr(twin, name, None)
        if optimizer.built and isinstance(copy, keras.optimizers.Optimizer) and not copy.built:
            copy.build([twin_of[id(v)] for v in optimizer._trainable_variables])


def build_own_optimizers(model: keras.Model, strategy: tf.distribute.Strategy, element_spec: Any) -> None:
    """Create the variables of ``model``'s own optimizers (:func:`own_optimizers`) before any restore.

    Keras builds an optimizer at its first ``apply_gradients``, over the variables it is
    given there, and its checkpoint keys are positions in that list: only the step knows
    them. Tracing ``train_step`` once under ``strategy.run`` (``element_spec`` with any
    batch size) builds each optimizer as the first step will, and runs nothing: no
    update, no counter, no random draw (its ops are in a graph never called). Also how
    ``verify --deep`` and ``export`` lay out such a model's checkpoint (the default strategy)."""
    if all(optimizer.built for optimizer in own_optimizers(model).values()):
        return
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype), element_spec)
    step = with_autograph(model.train_step)
    tf.function(lambda data: strategy.run(step, args=(data,)), autograph=False).get_concrete_function(spec)


def equal_share(total: tf.Tensor, replicas: int) -> tf.Tensor:
    """Each replica's share of a sync-on-read SUM ``total`` (float32), as a restore gives it.

    A restore assigns ``total / replicas`` (TensorFlow's ``get_on_read_restore_ops``), and a
    save reads the sum of the replicas' shares back. For that round trip to be exact, the
    sum of ``replicas`` equal shares must be exact in any order: with 1 or 2 replicas
    ``total / replicas`` is (a halving is exact, and so is ``x + x``); with more, the share's
    lowest ``ceil(log2(replicas))`` significand bits are cleared, so every partial sum
    ``k * share`` (k <= replicas) fits float32's 24 bits, the sum is ``replicas * share``
    exactly and ``sum / replicas`` is ``share`` again."""
    share = tf.cast(total, tf.float32) / replicas
    bits = 0 if replicas <= 2 else math.ceil(math.log2(replicas))
    if not bits:
        return share
    cleared = tf.bitwise.bitwise_and(tf.bitcast(share, tf.int32), tf.constant(-(1 << bits), tf.int32))
    return tf.bitcast(cleared, tf.float32)


def _folded_variables(model: keras.Model) -> list[Any]:
    """The tracker variables :meth:`OwnStep.fold` keeps in the restored state: float32
    sum-aggregated ones (Keras' ``Metric.add_variable`` default: ``Mean``'s total and count,
    ``MeanAbsoluteError``'s...). Others are left as Keras updates them."""
    return [v for v in model.metrics_variables
            if str(getattr(v, "aggregation", "")) == "sum" and str(v.dtype) == "float32"]


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
    if recipe.eval_dataset is not None and not has_own_test_step(model):
        raise _refuse(recipe, "validation, but Keras' own test_step; not supported: it evaluates compile()'s loss, "
                              "which this model does not have: override test_step too")
    optimizer = model.optimizer
    return dataclasses.replace(recipe, build_optimizer=lambda params: optimizer, loss=_never_called, metrics=None)


def _never_called(labels: Any, predictions: Any) -> Any:
    raise AssertionError("a model with its own train_step computes its own loss")


class OwnStep:
    """The model's ``train_step`` as the runner's replica step, and its epoch logs."""

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy, recipe: Recipe) -> None:
        self.model = model
        self.recipe = recipe
        self.strategy = strategy
        self.replicas = strategy.num_replicas_in_sync
        # AutoGraph converts it at its first trace, as Keras' tf.function of train_step does.
        self._train_step = with_autograph(model.train_step)
        self._results = tf.function(lambda: {m.name: m.result() for m in model.metrics}, autograph=False)
        # With several replicas, the trackers are kept in the state a restore gives (fold)
        self._folded = _folded_variables(model) if self.replicas > 1 else []
        self.fold_width = sum(math.prod(v.shape) for v in self._folded)

    def build_own_optimizers(self, element_spec: Any) -> None:
        """Create the variables of the model's own optimizers before any restore
        (:func:`build_own_optimizers`)."""
        build_own_optimizers(self.model, self.strategy, element_spec)

    def step(self, data: Any) -> dict[str, tf.Tensor]:
        """One replica's step: ``train_step(data)``; its logs divided by the replicas (their
        SUM in the packed all-reduce is Keras' MEAN over replicas)."""
        return _logs_of(self.recipe, "train_step", self._train_step(data), self.replicas)

    def fold_columns(self) -> tf.Tensor:
        """In the replica step, after ``train_step``: this replica's share of each folded tracker
        variable, flattened (``fold_width`` columns; none with one replica), for the step's
        packed all-reduce."""
        if not self._folded:
            return tf.zeros([0], tf.float32)
        return tf.concat([tf.reshape(tf.convert_to_tensor(v.value), [-1]) for v in self._folded], axis=0)

    def fold(self, summed: tf.Tensor) -> list[Any]:
        """In the replica step, after the all-reduce: ``summed`` (the sums of
        :meth:`fold_columns` over replicas) become each replica's :func:`equal_share`, the state a
        restore of this step's checkpoint gives. Returns reads of the assigned variables, for
        control dependencies (Keras' ``assign`` returns its argument, not the op; a read of the
        same variable is ordered after the assignment by tf.function's automatic control
        dependencies)."""
        shares, offset = equal_share(summed, self.replicas), 0
        for variable in self._folded:
            size = math.prod(variable.shape)
            variable.assign(tf.reshape(shares[offset:offset + size], variable.shape))
            offset += size
        return [tf.convert_to_tensor(variable.value) for variable in self._folded]

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


def _logs_of(recipe: Recipe, method: str, logs: Any, replicas: int) -> dict[str, tf.Tensor]:
    """A step's logs as float32 scalars divided by the replicas (their SUM over replicas is
    Keras' MEAN), or the one-line refusal of logs Keras' fit() could not log either."""
    if not isinstance(logs, dict) or not logs:
        raise _refuse(recipe, f"its {method} returned {type(logs).__name__}; expected a dict of scalar logs, as "
                              "Keras' fit() logs them")
    values = {}
    for name, value in logs.items():
        value = tf.convert_to_tensor(value)
        if value.shape.rank != 0:
            raise _refuse(recipe, f"its {method}'s log {name!r} has shape {value.shape}; expected a scalar (Keras' "
                                  "fit() logs scalars)")
        values[str(name)] = tf.cast(value, tf.float32) / replicas
    return values


class OwnTestStep:
    """The model's ``test_step`` as the runner's evaluation (see the module docstring)."""

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy, recipe: Recipe) -> None:
        self.model = model
        self.recipe = recipe
        test_step = with_autograph(model.test_step)
        replicas = strategy.num_replicas_in_sync

        def replica_step(data: Any) -> dict[str, tf.Tensor]:
            values = _logs_of(recipe, "test_step", test_step(data), replicas)
            values[_EXAMPLES] = tf.cast(tf.shape(tf.nest.flatten(data)[0])[0], tf.float32)
            return values

        # A short last batch has another shape: let the function generalise, not retrace per shape.
        @tf.function(reduce_retracing=True, autograph=False)
        def step(data: Any) -> dict[str, tf.Tensor]:
            per_replica = strategy.run(replica_step, args=(data,))
            return {name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                    for name, value in per_replica.items()}

        self._step = step
        self._results = tf.function(lambda: {m.name: m.result() for m in model.metrics}, autograph=False)

    def evaluate(self, iterator: Any) -> tuple[dict[str, float], int]:
        """Keras' ``evaluate`` over ``iterator`` (every worker: collective): the logs and the
        examples seen. Its ``loss`` is required (the runner reports ``val_loss``)."""
        self.model.reset_metrics()
        last: dict[str, float] = {}
        examples = 0
        for data in iterator:
            values = self._step(data)
            examples += int(values.pop(_EXAMPLES))
            last = {name: float(value) for name, value in values.items()}
        names = [m.name for m in self.model.metrics]
        logs = {n: float(v) for n, v in self._results().items()} if last and set(last) == set(names) else last
        if "loss" not in logs:
            raise _refuse(self.recipe, f"its test_step logs {sorted(logs)} and no 'loss'; the runner reports val_loss "
                                       "(return a 'loss' log)")
        return logs, examples


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
