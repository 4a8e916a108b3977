"""An unchanged ``model.fit`` script, run by the runner with the recipe guarantees.

``resilient-train run train.py`` where ``train.py`` creates
``tf.distribute.MultiWorkerMirroredStrategy()``, builds and compiles a model in its scope,
builds a ``tf.data`` dataset and calls ``model.fit(dataset, epochs=E, steps_per_epoch=S,
callbacks=[...])`` (job/recipe.py detects the form and refuses what cannot be honoured
before workers start). Each worker runs the whole script with ``runpy`` under two seams:

* ``MultiWorkerMirroredStrategy(...)`` (``tf.distribute`` and ``tf.distribute.experimental``)
  returns the runner's strategy (runner/training/strategy.py: heartbeat, registration and collective
  timeouts), made at the script's first call; the script's own arguments are ignored.
* ``keras.Model.fit`` enters the runner's training loop (runner/training/loop.py) with a recipe
  synthesised from the compiled model (runner/keras_recipes/compiled.py) and the callbacks
  (runner/keras_recipes/callbacks.py; a ``History`` is added last, and ``fit`` returns it). There is
  one loop: checkpoints, exact resume, SIGTERM and callback state are the recipe path's.
* ``keras.Model.evaluate`` (after ``fit``): the runner's evaluation (runner/outputs/evaluation.py)
  over the dataset's global batches, each worker its slice; it returns what Keras would
  (``[loss, *metrics]``, or a dict with ``return_dict=True``). Keras 3's own ``evaluate``
  fails under MultiWorkerMirroredStrategy on TF 2.21 ("Attempt to convert a value
  (PerReplica...)"), as ``fit`` does; measured here, ``predict``, ``save`` and calling the
  model work unchanged (``predict`` returns this worker's shard of its input).

The input is positioned by the runner, as Keras' ``fit`` reads a repeated dataset: ONE
iterator per process, continuing across epochs, so epoch ``e`` step ``k`` is global batch
``e * S + k`` of the script's dataset. A resumed process skips to that batch on its first
iterator. Each worker keeps its slice of every global batch (what ``fit``'s auto-sharding
of an in-memory dataset does), so the dataset is batched at the GLOBAL batch size, as the
Keras tutorial has it. ``tf.data``'s unseeded shuffles draw from TensorFlow's global seed,
which the runner sets (``--seed``) before the script runs; a reshuffling ``shuffle`` gives
each NEW iterator other orders, which is why the process never makes a second one.

``fit(x, y, batch_size=B, epochs=E, shuffle=True)`` on NumPy arrays (or dicts of arrays for
several inputs) is the indexed input (runner/input/indexed.py) over the arrays, read the way
Keras reads them: every epoch is a new permutation of the ``n`` examples, a function of
``(seed, epoch)`` (``shuffle=False``: their order), cut into ``n // B`` global batches of
``B``, each worker its contiguous share; the last ``n % B`` examples of the epoch's order
are left out (Keras keeps a smaller last batch, which would not split over the workers).
Re-entry at step ``s`` starts the epoch's index range there (O(1)). ``validation_split=f``
holds out the last ``n - floor(n * (1 - f))`` examples before any shuffle, as Keras does.
``sample_weight=w`` or ``class_weight={class: weight}`` (Keras' own mapping to per-example
weights) rides with the arrays as ``(x, y, w)``: the step weighs each example's loss, the
metrics stay unweighted, as Keras' ``metrics=`` are.
``validation_data`` (arrays, or a finite dataset batched at the global batch size),
``validation_steps`` and ``validation_freq=N`` feed the runner's evaluation
(runner/outputs/evaluation.py): ``val_*`` in ``epoch_finished`` and in the callbacks' logs.
It evaluates every N-th epoch and, unlike Keras when N does not divide the epochs, after
the last one too.

A model whose class overrides ``train_step`` trains with that step (runner/keras_recipes/own_step.py).
Its twin for the asynchronous checkpoint (:func:`model_then_twins`) is a clone, or, for a
subclass Keras cannot clone, its class called again with the arguments the script called it
with (the ``keras.Model.__new__`` seam records them), each model among them copied.
:func:`script_model` runs a script up to its ``fit`` call for ``resilient-train export``.

When the loop completes, ``fit`` returns and the rest of the script runs (evaluate, save):
once per completed run, on every worker. A stop agreed on SIGTERM saves and ends the
script at ``fit`` (exit 143): the code after ``fit`` does not run then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import keras
import numpy as np
import tensorflow as tf

from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.errors import RecipeError, RecipeRefused
from resilient_train.job.config import JobConfig
from resilient_train.job.recipe import (
    FIT_ARRAYS_REFUSED,
    FIT_DATASET_REFUSED,
    FIT_PAIRS_REFUSED,
    FIT_REFUSED,
    SEVERAL_OUTPUTS_WEIGHTS_REFUSED,
    Recipe,
    recipe_name,
)
from resilient_train.runner.input.indexed import IndexPlan, indexed_dataset
from resilient_train.runner.input.iterator_state import INDEXED
from resilient_train.runner.keras_recipes.callbacks import refused_callback
from resilient_train.runner.keras_recipes.own_step import (
    build_own_optimizers, has_own_step, has_own_test_step, own_optimizers,
)
from resilient_train.runner.outputs.evaluation import Evaluator
from resilient_train.runner.training.strategy import make_strategy

__all__ = ["FitScript", "ContinuousInput", "ArrayInput", "model_then_twins", "validation_split_at", "array_steps",
           "sample_weights", "script_model"]

_HONOURED = ("x", "y", "batch_size", "epochs", "steps_per_epoch", "callbacks", "verbose", "shuffle", "validation_data",
             "validation_split", "validation_steps", "validation_freq", "validation_batch_size",
             "sample_weight", "class_weight")  # verbose: ignored
_KERAS_BATCH_SIZE = 32  # fit()'s default batch_size


def validation_split_at(examples: int, fraction: float) -> int:
    """How many examples train under ``validation_split=fraction``: Keras' split
    (``keras/src/trainers/data_adapters/array_slicing.py``: the first ``floor(n * (1 - f))``
    train, the rest are held out, before any shuffle)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"Received validation_split={fraction!r}; expected a float in (0, 1)")
    split_at = int(np.floor(examples * (1.0 - fraction)))
    if split_at == 0 or split_at == examples:
        raise ValueError(f"Received validation_split={fraction!r} for {examples} examples; it leaves no "
                         "training or no validation example")
    return split_at


def array_steps(examples: int, batch_size: int) -> int:
    """Steps of an epoch over ``examples`` arrays at global batch ``batch_size``: full batches
    only (the last ``examples % batch_size`` of each epoch's order are left out)."""
    steps = examples // batch_size
    if steps < 1:
        raise ValueError(f"Received {examples} examples for batch_size={batch_size}; expected at least one batch")
    return steps


class _Preempted(BaseException):
    """Ends the script at ``fit`` after a saved stop (a BaseException: a script's
    ``except Exception`` must not swallow it)."""


class ContinuousInput:
    """``input_source`` for the Trainer: one distributed iterator per process, positioned at
    global batch ``epoch * steps_per_epoch + start`` and read on across epochs."""

    def __init__(self, strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, *, global_batch_size: int,
                 steps_per_epoch: int) -> None:
        self.strategy = strategy
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.steps_per_epoch = steps_per_epoch
        self._iterator: Iterator[Any] | None = None
        self._next_position: int | None = None

    @property
    def element_spec(self) -> Any:
        """A global batch's spec (own_step.py builds a model's own optimizers with it)."""
        return self.dataset.element_spec

    def __call__(self, epoch: int, start: int) -> Iterator[Any]:
        position = epoch * self.steps_per_epoch + start
        if self._iterator is None:
            self._iterator = iter(self.strategy.distribute_datasets_from_function(self._positioned(position)))
        elif position != self._next_position:  # a second iterator would reshuffle: never guess
            raise RuntimeError(f"fit script input: asked for global batch {position}, the iterator is at "
                               f"{self._next_position}")
        self._next_position = (epoch + 1) * self.steps_per_epoch
        return self._iterator

    def _positioned(self, position: int) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return _worker_slices(self.dataset.skip(position), self.global_batch_size, context).prefetch(2)

        return dataset_fn


class ArrayInput:
    """``input_source`` for the Trainer from a fit script's arrays: epoch ``epoch`` from step
    ``start`` is the indexed pipeline (runner/input/indexed.py) with one pass per epoch,
    its range started at the step: a new distributed iterator per epoch, built in O(1)."""

    reentry = (INDEXED, "a fit script's arrays: the runner's pipeline starts at the step")

    def __init__(self, strategy: tf.distribute.Strategy, arrays: Any, *, seed: int, shuffle: bool,
                 global_batch_size: int, steps_per_epoch: int) -> None:
        self.strategy = strategy
        self.arrays = tf.nest.map_structure(tf.constant, arrays)  # (x, y), made once, captured by each pipeline
        self.num_examples = int(tf.nest.flatten(arrays)[0].shape[0])
        self.plan = IndexPlan(self.num_examples, global_batch_size, steps_per_epoch, epoch_passes=True)
        self.seed = seed
        self.shuffle = shuffle
        arrays_ = self.arrays
        self._recipe = Recipe(name="fit", source="", build_model=lambda params: None, build_optimizer=None, loss=None,
                              dataset=None, num_examples=lambda params: self.num_examples,
                              example=lambda index, params: tf.nest.map_structure(lambda t: tf.gather(t, index), arrays_))

    @property
    def element_spec(self) -> Any:
        """A batch's spec (own_step.py builds a model's own optimizers with it)."""
        return tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), self.arrays)

    def __call__(self, epoch: int, start: int) -> Iterator[Any]:
        plan = self.plan

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = indexed_dataset(
                self._recipe, params={}, num_examples=plan.num_examples, seed=self.seed, epoch=epoch,
                start_step=start, steps_per_epoch=plan.steps_per_epoch, global_batch_size=plan.global_batch_size,
                input_pipeline_id=context.input_pipeline_id, num_input_pipelines=context.num_input_pipelines,
                per_replica_batch_size=context.get_per_replica_batch_size(plan.global_batch_size),
                epoch_passes=True, shuffle=self.shuffle)
            options = tf.data.Options()
            options.deterministic = True
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return dataset.map(lambda batch, indices: batch).with_options(options).prefetch(2)

        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))


def _worker_slices(dataset: tf.data.Dataset, batch: int, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This input pipeline's slice of every global batch, in per-replica batches."""
    pipelines, index = context.num_input_pipelines, context.input_pipeline_id
    per_pipeline = batch // pipelines
    per_replica = context.get_per_replica_batch_size(batch)

    def my_slice(*element: Any) -> Any:
        structure = element if len(element) > 1 else element[0]
        return tf.nest.map_structure(lambda t: t[index * per_pipeline:(index + 1) * per_pipeline], structure)

    dataset = dataset.map(my_slice)
    if per_replica < per_pipeline:  # several replicas on this worker
        dataset = dataset.rebatch(per_replica)
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


class FitScript:
    """One worker's run of a ``model.fit`` script (see the module docstring).

    ``before_strategy()``: called right before the strategy is made (the worker releases
    its port placeholder). ``make_trainer(job, recipe, strategy, input_source)``: the
    worker's Trainer. ``run_trainer(trainer)``: runs it (the worker retakes SIGTERM first).
    """

    def __init__(
        self,
        job: JobConfig,
        cluster: ClusterInfo,
        *,
        before_strategy: Callable[[], None],
        make_trainer: Callable[..., Any],
        run_trainer: Callable[[Any], Any],
    ) -> None:
        self.job = job
        self.cluster = cluster
        self.path = Path(job.recipe)
        self.name = recipe_name(job.recipe)
        self._before_strategy = before_strategy
        self._make_trainer = make_trainer
        self._run_trainer = run_trainer
        self.strategy: tf.distribute.Strategy | None = None
        self.trainer: Any = None
        self.result: Any = None
        self._fit_calls = 0
        # The arguments each script-defined keras.Model subclass was called with, by id of the
        # instance: how a twin of a model Keras cannot clone is made (model_then_twins).
        self._init_arguments: dict[int, tuple[tuple, dict]] = {}

    def run(self) -> Any:
        """Run the script; the TrainResult, or None when a stop was saved at ``fit``."""
        keras.utils.set_random_seed(self.job.seed)  # no op is made: the strategy still comes first
        tf.config.experimental.enable_op_determinism()
        with self._seams():
            try:
                runpy.run_path(str(self.path), run_name="__main__")
            except _Preempted:
                return None
        if self._fit_calls == 0:
            raise RecipeError(f"Script {self.path} ended without calling model.fit(); nothing was trained")
        return self.result

    # ------------------------------------------------------------------ seams
    @contextlib.contextmanager
    def _seams(self):
        script = self
        real = tf.distribute.MultiWorkerMirroredStrategy

        class StrategySeam(real):
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                return script._strategy()

        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            return script._fit(model, *args, **kwargs)

        def evaluate(model: Any, *args: Any, **kwargs: Any) -> Any:
            return script._evaluate(model, *args, **kwargs)

        real_new = keras.Model.__new__

        def new(cls: type, *args: Any, **kwargs: Any) -> Any:
            instance = real_new(cls, *args, **kwargs)
            if not cls.__module__.startswith("keras."):
                script._init_arguments[id(instance)] = (args, kwargs)
            return instance

        places = [(tf.distribute, "MultiWorkerMirroredStrategy"),
                  (tf.distribute.experimental, "MultiWorkerMirroredStrategy"), (keras.Model, "fit"),
                  (keras.Model, "evaluate"), (keras.Model, "__new__")]
        saved = [(owner, name, owner.__dict__.get(name, getattr(owner, name))) for owner, name in places]
        tf.distribute.MultiWorkerMirroredStrategy = StrategySeam
        tf.distribute.experimental.MultiWorkerMirroredStrategy = StrategySeam
        defined = {name for owner, name in places if owner is keras.Model and name in vars(keras.Model)}
        keras.Model.fit = fit
        keras.Model.evaluate = evaluate
        keras.Model.__new__ = staticmethod(new)
        try:
            yield
        finally:
            for owner, name, value in saved:
                if owner is keras.Model and name not in defined:
                    delattr(keras.Model, name)
                else:
                    setattr(owner, name, value)

    def _strategy(self) -> tf.distribute.Strategy:
        if self.strategy is None:
            self._before_strategy()
            self.strategy = make_strategy(self.job, self.cluster)
        return self.strategy

    # -------------------------------------------------------------------- fit
    def _refuse(self, what: str) -> RecipeRefused:
        return RecipeRefused(f"Script {self.path}: {what}")

    def _fit(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        self._fit_calls += 1
        if self._fit_calls > 1:
            raise self._refuse("model.fit() called a second time; one fit() call is supported")
        if len(args) > 2:
            raise self._refuse(f"fit() got {len(args)} positional arguments; pass all but x and y by name")
        for name, value in zip(("x", "y"), args):
            kwargs[name] = value
        # Arrays: fit(x, y, ...), or x alone for a model with its own train_step (keras.io's VAE:
        # vae.fit(digits, epochs=30, batch_size=128)); else a tf.data.Dataset.
        x = kwargs.get("x")
        arrays = kwargs.get("y") is not None or (
            not isinstance(x, tf.data.Dataset) and (isinstance(x, (np.ndarray, dict, list, tuple)) or hasattr(x, "__array__")))
        if arrays and kwargs.get("y") is None and not has_own_step(model):
            raise self._refuse(f"fit(x) at line {self._fit_line()} without y: the model's compile() loss needs labels; "
                               "pass fit(x, y, ...) (x alone trains a model with its own train_step)")
        refused = {**FIT_REFUSED, **(FIT_ARRAYS_REFUSED if arrays else FIT_DATASET_REFUSED)}
        for name, value in kwargs.items():
            if (name not in _HONOURED or name in refused) and value is not None:
                why = refused.get(name, "not supported")
                raise self._refuse(f"fit({name}=...): {why}")
        for (first, second), why in FIT_PAIRS_REFUSED.items():
            if kwargs.get(first) is not None and kwargs.get(second):
                raise self._refuse(f"fit({first}=..., {second}=...): {why}")
        for name, why in SEVERAL_OUTPUTS_WEIGHTS_REFUSED.items():
            if kwargs.get(name) is not None and len(model.outputs or []) > 1:
                raise self._refuse(f"fit({name}=...) for a model with {len(model.outputs)} outputs: {why}")
        epochs = kwargs.get("epochs", 1)
        if self.strategy is None:
            raise self._refuse("fit() was called without a tf.distribute.MultiWorkerMirroredStrategy(); create "
                               "one first and build and compile the model in its scope()")
        if not isinstance(epochs, int) or epochs < 1:
            raise self._refuse(f"fit(epochs={epochs!r}); expected a positive int")
        validation_data = kwargs.get("validation_data")
        if arrays:
            batch, steps, source, held_out = self._array_input(kwargs)
            if validation_data is None:  # Keras: validation_data, when given, wins over validation_split
                validation_data = held_out
        else:
            batch, steps, source = self._dataset_input(kwargs.get("x"), epochs, kwargs.get("steps_per_epoch"))
        if batch % self.cluster.num_workers:
            raise self._refuse(f"the global batch of {batch} does not split over {self.cluster.num_workers} "
                               "workers; use a multiple of the worker count")
        given = list(kwargs.get("callbacks") or [])
        refused_cb = refused_callback(given)  # in the script's terms (recipe terms would name no callbacks())
        if refused_cb is not None:
            raise self._refuse(f"the fit() call at line {self._fit_line()}: callbacks[{refused_cb[0]}] {refused_cb[1]}")
        job = self.job.with_recipe_defaults({"epochs": epochs, "steps_per_epoch": steps, "global_batch_size": batch})
        eval_dataset = None
        if validation_data is not None:
            eval_dataset = self._validation(validation_data, kwargs, batch)
            job = dataclasses.replace(job, eval_every_epochs=self._validation_freq(kwargs.get("validation_freq")),
                                      eval_steps=kwargs.get("validation_steps"))
        history = keras.callbacks.History()
        callbacks = [*given, history]
        recipe = Recipe(
            name=self.name, source=str(self.path), build_optimizer=None,
            build_model=model_then_twins(model, lambda m: self._init_arguments.get(id(m))),
            loss=None, dataset=_no_dataset, callbacks=lambda params: list(callbacks), eval_dataset=eval_dataset,
        )
        self.trainer = self._make_trainer(job, recipe, self.strategy, source)
        self.result = self._run_trainer(self.trainer)
        if self.result is None:
            raise _Preempted()
        return history

    def _dataset_input(self, dataset: Any, epochs: int, steps: Any) -> tuple[int, int, ContinuousInput]:
        """``fit(dataset, steps_per_epoch=S)``: the global batch, S, and the input source."""
        if not isinstance(dataset, tf.data.Dataset):
            raise self._refuse(f"fit() got {type(dataset).__name__} and no y; expected a tf.data.Dataset batched at "
                               "the global batch size, or arrays: fit(x, y, batch_size=...)")
        if not isinstance(steps, int) or steps < 1:
            raise self._refuse(f"fit(steps_per_epoch={steps!r}); expected a positive int (exact resume counts steps)")
        cardinality = int(dataset.cardinality())
        if 0 <= cardinality < epochs * steps:
            raise self._refuse(f"the dataset has {cardinality} batches; fit(epochs={epochs}, steps_per_epoch="
                               f"{steps}) reads {epochs * steps}: add .repeat()")
        batch = _global_batch_size(dataset)
        return batch, steps, ContinuousInput(self.strategy, dataset, global_batch_size=batch, steps_per_epoch=steps)

    def _array_input(self, kwargs: dict[str, Any]) -> tuple[int, int, ArrayInput, Any]:
        """``fit(x, y, batch_size=B, shuffle=..., validation_split=f)``: B, the steps per epoch,
        the input source (the module docstring) and the held-out ``(x, y)`` (None without a split)."""
        try:
            if kwargs.get("y") is None:  # x alone (the caller checked the model has its own train_step)
                return self._x_input(kwargs)
            x, y = _as_arrays(kwargs["x"], "x"), _as_arrays(kwargs["y"], "y")
            count = _example_count((x, y))
            split, held = kwargs.get("validation_split"), None
            if split and kwargs.get("validation_data") is None:
                at = validation_split_at(count, float(split))
                held = tf.nest.map_structure(lambda a: a[at:], (x, y))
                x, y = tf.nest.map_structure(lambda a: a[:at], (x, y))
                count = at
            batch = kwargs.get("batch_size") or _KERAS_BATCH_SIZE
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError(f"Received batch_size={batch!r}; expected a positive int")
            steps = array_steps(count, batch)
            weights = sample_weights(y, kwargs.get("sample_weight"), kwargs.get("class_weight"), count)
        except ValueError as exc:
            raise self._refuse(f"fit() at line {self._fit_line()}: {exc}") from None
        shuffle = kwargs.get("shuffle", True)
        if shuffle not in (True, False):
            raise self._refuse(f"fit(shuffle={shuffle!r}): pass True (a new permutation every epoch) or False")
        arrays = (x, y) if weights is None else (x, y, weights)  # (x, y, w): the step weighs each example's loss
        source = ArrayInput(self.strategy, arrays, seed=self.job.seed, shuffle=bool(shuffle),
                            global_batch_size=batch, steps_per_epoch=steps)
        return batch, steps, source, held

    def _x_input(self, kwargs: dict[str, Any]) -> tuple[int, int, ArrayInput, Any]:
        """``fit(x, batch_size=B, shuffle=...)`` without labels: each batch is ``x``'s rows
        alone, the ``data`` Keras hands a model's own ``train_step`` then."""
        for name in ("sample_weight", "class_weight", "validation_split"):
            if kwargs.get(name) is not None:
                raise ValueError(f"{name} without y is not supported (pass fit(x, y, ...))")
        x = _as_arrays(kwargs["x"], "x")
        count = _example_count(x)
        batch = kwargs.get("batch_size") or _KERAS_BATCH_SIZE
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"Received batch_size={batch!r}; expected a positive int")
        steps = array_steps(count, batch)
        shuffle = kwargs.get("shuffle", True)
        if shuffle not in (True, False):
            raise self._refuse(f"fit(shuffle={shuffle!r}): pass True (a new permutation every epoch) or False")
        source = ArrayInput(self.strategy, x, seed=self.job.seed, shuffle=bool(shuffle), global_batch_size=batch,
                            steps_per_epoch=steps)
        return batch, steps, source, None

    def _validation(self, data: Any, kwargs: dict[str, Any], train_batch: int) -> Callable[[Any, int], tf.data.Dataset]:
        """The recipe's ``eval_dataset`` for ``validation_data`` (arrays or a finite dataset)."""
        if isinstance(data, tf.data.Dataset):
            if kwargs.get("validation_steps") is None and data.cardinality() == tf.data.INFINITE_CARDINALITY:
                raise self._refuse("fit(validation_data=) is a repeated dataset without validation_steps=N")
            dataset, batch = data, _global_batch_size(data)
        else:
            if not isinstance(data, (tuple, list)) or len(data) != 2:
                raise self._refuse("fit(validation_data=...): expected (x_val, y_val) or a tf.data.Dataset "
                                   "(sample weights are not supported yet)")
            try:
                arrays = (_as_arrays(data[0], "x_val"), _as_arrays(data[1], "y_val"))
                _example_count(arrays)
            except ValueError as exc:
                raise self._refuse(f"fit(validation_data=...): {exc}") from None
            batch = kwargs.get("validation_batch_size") or kwargs.get("batch_size") or train_batch
            dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(batch)
        return lambda context, seed: _worker_slices(dataset, batch, context)

    def _validation_freq(self, freq: Any) -> int:
        if freq is None:
            return 1
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
            raise self._refuse(f"fit(validation_freq={freq!r}): expected a positive int (a list is not supported yet)")
        return freq

    def _fit_line(self) -> int | str:
        """The script's line that called fit() (the innermost frame of the script's file)."""
        target = os.path.abspath(self.path)
        frame = sys._getframe(1)
        while frame is not None:
            if os.path.abspath(frame.f_code.co_filename) == target:
                return frame.f_lineno
            frame = frame.f_back
        return "?"

    def _evaluate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate(dataset, steps=None, return_dict=False)`` after ``fit``, through the
        runner's evaluation (runner/outputs/evaluation.py): Keras 3's own fails under this strategy."""
        if len(args) > 1 or kwargs.get("y") is not None or kwargs.get("sample_weight") is not None:
            raise self._refuse("evaluate() on arrays; pass a tf.data.Dataset batched at the global batch size")
        dataset = args[0] if args else kwargs.get("x")
        steps, return_dict = kwargs.get("steps"), kwargs.get("return_dict", False)
        if self.trainer is None or self.strategy is None:
            raise self._refuse("evaluate() before fit() is not supported")
        if has_own_step(model) and not has_own_test_step(model):
            raise self._refuse("evaluate() of a model with its own train_step and Keras' test_step is not supported: "
                               "it evaluates compile()'s loss, which this model does not have: override test_step too")
        if not isinstance(dataset, tf.data.Dataset):
            raise self._refuse(f"evaluate() got {type(dataset).__name__}; expected a tf.data.Dataset")
        if steps is None and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise self._refuse("evaluate() on a repeated dataset without steps=N")
        batch = _global_batch_size(dataset)
        recipe = dataclasses.replace(
            self.trainer.recipe, eval_dataset=lambda context, seed: _worker_slices(dataset, batch, context))
        evaluator = Evaluator(self.strategy, model, recipe, {}, every_epochs=1, total_epochs=1, seed=self.job.seed,
                              global_batch_size=batch, max_steps=steps)
        result = evaluator.evaluate()
        values = {"loss": result.loss, **result.metrics}
        return values if return_dict else list(values.values())


class _ModelReached(BaseException):
    """Ends a script at its ``fit`` call, carrying the model and ``fit``'s input (:func:`script_model`)."""

    def __init__(self, model: keras.Model, args: tuple, kwargs: dict) -> None:
        super().__init__("fit() reached")
        self.model = model
        self.args, self.kwargs = args, kwargs


def _fit_input_spec(args: tuple, kwargs: dict) -> Any:
    """The element spec of what ``fit(x, y, ...)`` was given: a dataset's, else the arrays'
    (``(x, y)``, or ``x`` alone) batched; only the shapes past the batch and the dtypes matter."""
    x = args[0] if args else kwargs.get("x")
    y = args[1] if len(args) > 1 else kwargs.get("y")
    if isinstance(x, tf.data.Dataset):
        return x.element_spec
    return tf.data.Dataset.from_tensor_slices(x if y is None else (x, y)).batch(1).element_spec


def script_model(path: str | Path, *, seed: int) -> keras.Model:
    """The model a fit script passes to ``fit``, built as a worker's run built it, untrained.

    For ``resilient-train export`` of a script's checkpoint (commands/export.py): the script
    runs in this process from the top, as a worker runs it (``runpy``, ``__main__``, the
    run's ``--seed`` set first, Keras' layer numbering from a clear session), with
    ``MultiWorkerMirroredStrategy()`` the default strategy, until its ``fit`` call, which
    ends it: nothing is trained, nothing after ``fit`` runs. What the script prints goes to
    stderr. Its relative paths mean what they mean where the command runs.
    """
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    real = tf.distribute.MultiWorkerMirroredStrategy

    class DefaultStrategy(real):  # a class, as the worker's seam: scripts and Keras test isinstance() with it
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            return tf.distribute.get_strategy()

    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        raise _ModelReached(model, args, kwargs)

    saved = (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.MultiWorkerMirroredStrategy,
             keras.Model.__dict__["fit"] if "fit" in vars(keras.Model) else None)
    tf.distribute.MultiWorkerMirroredStrategy = tf.distribute.experimental.MultiWorkerMirroredStrategy = DefaultStrategy
    keras.Model.fit = fit
    try:
        with contextlib.redirect_stdout(sys.stderr):
            runpy.run_path(str(path), run_name="__main__")
    except _ModelReached as reached:
        # its own optimizers (keras.io's GAN) exist in the checkpoint: built as a worker builds them
        if own_optimizers(reached.model) and has_own_step(reached.model):
            build_own_optimizers(reached.model, tf.distribute.get_strategy(),
                                 _fit_input_spec(reached.args, reached.kwargs))
        return reached.model
    finally:
        tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.MultiWorkerMirroredStrategy = saved[:2]
        if saved[2] is None:
            del keras.Model.fit
        else:
            keras.Model.fit = saved[2]
    raise RecipeError(f"Script {path} ended without calling model.fit(); there is no model to export")


def model_then_twins(model: keras.Model, init_arguments: Callable[[Any], tuple[tuple, dict] | None] = lambda m: None
                     ) -> Callable[[dict], keras.Model]:
    """The recipe's ``build_model`` for a script's compiled ``model``: the model itself on the
    first call (the Trainer's live model), a twin with its own variables on every later one.

    The async checkpointer snapshots the live state into a twin built by calling
    ``build_model`` again (runner/training/loop.py ``_build_twin``) and writes the twin while training
    goes on. Handing it the live model made the snapshot a no-op and the write read
    variables the next steps were updating: a checkpoint torn across steps, so a kill and
    resume ended with other weights now and then (seen once in a suite run). The twin is
    ``keras.models.clone_model`` compiled with an optimizer of the same class and config.
    A subclassed model Keras cannot clone (keras.io's VAE: ``VAE(encoder, decoder)``, no
    ``get_config``) is made again from the arguments its class was called with in the script
    (``init_arguments(model)``: recorded by the fit script's seam), each model among them
    cloned the same way; one that cannot be made so either is refused with what to use instead.
    """
    calls = 0

    def build_model(params: dict) -> keras.Model:
        nonlocal calls
        calls += 1
        if calls == 1:
            return model
        twin = _copy_model(model, init_arguments)
        keras.Model.compile(twin, optimizer=type(model.optimizer).from_config(model.optimizer.get_config()))
        if has_own_step(model):  # its compile() may be its own (keras.io's GAN), with other arguments
            _copy_own_compile(model, twin)
        return twin

    return build_model


def _copy_own_compile(model: keras.Model, twin: keras.Model) -> None:
    """What a model's own ``compile`` set (keras.io's GAN: ``d_optimizer``, ``g_optimizer``,
    ``loss_fn``, its metric trackers), on ``twin``: each optimizer and tracker anew from its
    config, the rest shared. An own optimizer is built over the twin's variables at the
    positions the live one's were (by the live one's first step: own_step.py), so the twin's
    checkpoint keys are the live one's."""
    twin_of = {id(v): t for v, t in zip(model.trainable_variables, twin.trainable_variables)}
    for name, value in vars(model).items():
        if name.startswith("_") or name in vars(twin):
            continue
        if isinstance(value, keras.optimizers.Optimizer):
            copy = type(value).from_config(value.get_config())
            if value.built:
                copy.build([twin_of[id(v)] for v in value._trainable_variables])
            setattr(twin, name, copy)
        elif isinstance(value, keras.metrics.Metric):
            setattr(twin, name, type(value).from_config(value.get_config()))
        else:
            setattr(twin, name, value)


def _copy_model(model: keras.Model, init_arguments: Callable[[Any], tuple[tuple, dict] | None]) -> keras.Model:
    """A copy of ``model`` with its own variables (see :func:`model_then_twins`)."""
    try:
        return keras.models.clone_model(model)
    except Exception as exc:  # Keras' own refusal, e.g. a subclassed model
        arguments = init_arguments(model)
        if arguments is not None:
            copy = lambda value: _copy_model(value, init_arguments) if isinstance(value, keras.Model) else value
            args, kwargs = tf.nest.map_structure(copy, arguments)
            twin = type(model)(*args, **kwargs)
            if [v.shape for v in twin.weights] == [v.shape for v in model.weights]:
                return twin
        reason = (str(exc).splitlines() or [""])[0][:160]  # Keras' message runs to many lines
        raise RecipeError(f"the fit() model cannot be copied for the asynchronous checkpoint ({type(exc).__name__}: "
                          f"{reason}); pass --checkpoint-mode sync") from None


def _global_batch_size(dataset: tf.data.Dataset) -> int:
    """The global batch: read from the pipeline's last ``batch(n)`` when nothing after it can
    change an element's shape, else the leading dimension of the first element.

    Reading it without iterating matters: a ``shuffle(..., seed=7)`` reshuffles on every
    iterator, so a peek with ``take(1)`` moved its seed generator and the training iterator
    read the second order, not the first that plain Keras ``fit`` reads (issue 46)."""
    static = _batch_of_graph(dataset)
    if static is not None:
        return static
    for element in dataset.take(1):  # the same peek in every process: the same order on every attempt
        return int(tf.nest.flatten(element)[0].shape[0])
    raise RecipeError("the fit() dataset is empty")


# Dataset ops that pass every element on unchanged in shape, between the batch and the output.
_SHAPE_KEEPING_OPS = frozenset({
    "PrefetchDataset", "RepeatDataset", "CacheDataset", "CacheDatasetV2", "TakeDataset", "SkipDataset",
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "AssertCardinalityDataset", "Identity"})
_BATCH_OPS = frozenset({"BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2",
                        "ParallelBatchDataset"})


def _batch_of_graph(dataset: tf.data.Dataset) -> int | None:
    """The ``batch_size`` constant of the pipeline's last batch op, found in its serialized
    graph (which creates no iterator), or None when another op may reshape after it."""
    from tensorflow.core.framework import graph_pb2

    try:
        serialized = dataset._as_serialized_graph(  # noqa: SLF001 - tf.data has no public reader
            external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)
        graph = graph_pb2.GraphDef.FromString(serialized.numpy())
    except Exception:  # a pipeline TensorFlow cannot serialize: peek instead
        return None
    nodes = {node.name: node for node in graph.node}
    output = [node for node in graph.node if node.op == "_Retval"]
    node = nodes.get(output[0].input[0].split(":")[0]) if len(output) == 1 and output[0].input else None
    while node is not None and node.op in _SHAPE_KEEPING_OPS:
        node = nodes.get(node.input[0].split(":")[0]) if node.input else None
    if node is None or node.op not in _BATCH_OPS or len(node.input) < 2:
        return None
    size = nodes.get(node.input[1].split(":")[0])
    if size is None or size.op != "Const":
        return None
    return int(tf.make_ndarray(size.attr["value"].tensor))


def sample_weights(y: Any, sample_weight: Any, class_weight: Any, count: int) -> np.ndarray | None:
    """The per-example weights of ``fit(x, y, sample_weight=w)`` or ``class_weight={class: weight}``
    (None without either), float32 as Keras' loss reads them. ``class_weight`` is Keras' own
    mapping (``class_weight_to_sample_weights``: the label, or its argmax for one-hot labels,
    rounded to an int; classes not named weigh 1), over the training examples after any
    ``validation_split``, as Keras computes it."""
    if sample_weight is not None:
        weights = np.asarray(_as_arrays(sample_weight, "sample_weight"), dtype=np.float32)
        if weights.shape[0] != count or weights.size != count:  # (N,) or (N, 1): one weight per example
            raise ValueError(f"sample_weight has shape {weights.shape} for {count} training examples; expected "
                             f"({count},)")
        return weights.reshape(count)
    if not class_weight:
        return None
    if not isinstance(class_weight, dict):
        raise ValueError(f"class_weight is a {type(class_weight).__name__}; expected a dict {{class: weight}}")
    if isinstance(y, (dict, list, tuple)):
        raise ValueError("class_weight is only supported for a single output's labels (as in Keras)")
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

    return np.asarray(class_weight_to_sample_weights(y, class_weight), dtype=np.float32)


def _as_arrays(value: Any, name: str) -> Any:
    """A NumPy array, or a dict / list / tuple of them (several inputs or outputs), as NumPy."""
    if isinstance(value, dict):
        return {key: _as_arrays(item, f"{name}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_arrays(item, f"{name}[{i}]") for i, item in enumerate(value))
    if isinstance(value, (np.ndarray, tf.Tensor)) or hasattr(value, "__array__"):
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(f"{name} is a scalar; expected an array of examples")
        return array
    raise ValueError(f"{name} is a {type(value).__name__}; expected a NumPy array or a dict of arrays")


def _example_count(arrays: Any) -> int:
    """The examples' count, the leading dimension every array must share."""
    counts = {int(array.shape[0]) for array in tf.nest.flatten(arrays)}
    if len(counts) != 1:
        raise ValueError(f"the arrays have different numbers of examples ({sorted(counts)})")
    return counts.pop()


def _no_dataset(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a fit script's input comes from ContinuousInput")
