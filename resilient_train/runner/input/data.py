"""Deterministic per-epoch input with exact mid-epoch re-entry.

The recipe's ``dataset(input_context, epoch, seed)`` is a pure function of its arguments, so
batch ``k`` of epoch ``e`` is the same batch on every attempt. Resuming at
``step_in_epoch = k`` therefore rebuilds epoch ``e`` positioned at batch ``k``: no iterator
state needs to be checkpointed, and a changed worker count only changes sharding.

An indexed recipe (``num_examples`` + ``example``, runner/input/indexed.py) gets a pipeline the
runner builds and positions itself; its elements are ``(batch, indices)``. For a
``dataset`` recipe, two ways to get there:

* the recipe's ``dataset`` accepts a ``start_step`` keyword: it returns the epoch from
  batch ``start_step`` on and can get there cheaply (e.g. ``Dataset.range(start_step, ...)``
  of indices before the expensive ``map``), so re-entry costs the same at any point of the
  epoch;
* otherwise the runner calls ``.skip(start_step)``, which runs the whole pipeline of every
  skipped batch (the recovery time then grows with the position in the epoch).

Why the tf.data iterator state is only a bounded fallback (runner/input/iterator_state.py): it is
saved by a synchronous op on the training thread (the async twin cannot hold a copy) and
holds the shuffle and prefetch buffers: for recipes/digits_cnn.py one worker's iterator is
634 KB after 5 batches, about twice the model + optimizer state it would ride with
(input_bound: 38 KB, its prefetched batches). A saved state is also tied to the worker
count, and breaks when the pipeline code changes. A recipe-level start position keeps the
contract a pure function and costs nothing at save time.
Issue 20 added it back as an option, bounded in size (runner/input/iterator_state.py): MWMS's
per-worker iterator is an ``OwnedMultiDeviceIterator``, which ``tf.train.Checkpoint``
refuses, and MWMS refuses ``InputReplicationMode.PER_REPLICA``, so on that path each worker
iterates its own pipeline as a plain (saveable) iterator. That iterator must hand the step
the shapes the distributed one does: at 2 workers MWMS's partial-batch handling gives every
batch an unknown first dimension, and a step traced for a static batch computes gradients
that differ in the last bits (same batches, same losses; :func:`_distributed_batch_is_dynamic`),
so the plain path relaxes its batch dimension the same way and trains to the same weights.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.determinism import InputCheck, first_batch_digest, seed_input_rng
from resilient_train.runner.input.indexed import example_count, indexed_dataset

__all__ = ["RecipeInputContext", "epoch_dataset", "record_first_batch", "accepts_start_step"]


class RecipeInputContext(tf.distribute.InputContext):
    """TensorFlow's InputContext plus what a recipe needs to build its batches."""

    def __init__(self, base: tf.distribute.InputContext, global_batch_size: int, params: dict[str, Any]):
        super().__init__(base.num_input_pipelines, base.input_pipeline_id, base.num_replicas_in_sync)
        self.global_batch_size = global_batch_size
        self.per_replica_batch_size = base.get_per_replica_batch_size(global_batch_size)
        self.params = params


def epoch_dataset(
    strategy: tf.distribute.Strategy,
    recipe: Recipe,
    *,
    epoch: int,
    seed: int,
    start_step: int,
    steps_per_epoch: int,
    global_batch_size: int,
    params: dict[str, Any],
    input_check: InputCheck | None = None,
    worker: tuple[int, int] | None = None,
    symbolic: bool = False,
):
    """The distributed dataset for ``epoch``, positioned at ``start_step``.

    ``worker=(rank, workers)``: instead, worker ``rank``'s own ``tf.data.Dataset`` (the same
    batches its replica would get; for the iterator-state path, runner/input/iterator_state.py);
    ``symbolic``: with ``experimental_symbolic_checkpoint`` on, so its saved state holds
    positions, not buffered elements (the values are the same either way).

    Every global RNG a recipe draws from is reseeded from ``(seed, epoch)`` right before
    each call of ``recipe.dataset`` (runner/input/determinism.py), so an unseeded shuffle or
    ``np.random`` noise is the same on every attempt. With ``input_check``, the chief
    (input pipeline 0) also hashes the first batch of a separate build of the epoch from
    its start, for the resume check, unless :func:`record_first_batch` did so ahead of it.
    """
    builder = _EpochBuilder(recipe, seed=seed, steps_per_epoch=steps_per_epoch,
                            global_batch_size=global_batch_size, params=params)

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        context = RecipeInputContext(input_context, global_batch_size, params)
        if input_check is not None and input_context.input_pipeline_id == 0 and not input_check.recorded(epoch):
            input_check.observe(epoch, first_batch_digest(builder.build(context, epoch, 0)[0]))
        dataset, skip = builder.build(context, epoch, start_step)
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        if symbolic:
            options.experimental_symbolic_checkpoint = True
        return dataset.with_options(options).skip(skip).take(steps_per_epoch - start_step).prefetch(2)

    if worker is None:
        return strategy.distribute_datasets_from_function(dataset_fn)
    # One replica per worker: this worker's pipeline, iterated as a plain (checkpointable)
    # tf.data iterator; strategy.run hands each batch to the worker's only replica.
    rank, workers = worker
    dataset = dataset_fn(tf.distribute.InputContext(workers, rank, workers))
    return _with_dynamic_batch(dataset) if _distributed_batch_is_dynamic(strategy, dataset) else dataset


def record_first_batch(
    strategy: tf.distribute.Strategy,
    recipe: Recipe,
    input_check: InputCheck,
    *,
    epoch: int,
    seed: int,
    steps_per_epoch: int,
    global_batch_size: int,
    params: dict[str, Any],
    workers: int,
    plain: bool,
) -> None:
    """On the chief, before epoch ``epoch`` is entered: hash its first batch for the resume check.

    Why ahead: the checkpoint taken at the end of epoch ``epoch - 1`` is the one a resume
    at that boundary restores, and it can only carry the digest of the epoch it resumes
    into if that digest exists when it is saved. The build is the one :func:`epoch_dataset`
    would make for input pipeline 0 (the same input context: ``workers`` pipelines, one
    replica each on the plain path), so :func:`epoch_dataset` then skips its own.
    """
    builder = _EpochBuilder(recipe, seed=seed, steps_per_epoch=steps_per_epoch,
                            global_batch_size=global_batch_size, params=params)
    replicas = workers if plain else strategy.num_replicas_in_sync
    context = RecipeInputContext(tf.distribute.InputContext(workers, 0, replicas), global_batch_size, params)
    input_check.observe(epoch, first_batch_digest(builder.build(context, epoch, 0)[0]))


class _EpochBuilder:
    """Builds an epoch's ``tf.data.Dataset`` from the recipe, its RNGs seeded for the epoch."""

    def __init__(self, recipe: Recipe, *, seed: int, steps_per_epoch: int, global_batch_size: int,
                 params: dict[str, Any]) -> None:
        self.recipe = recipe
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.global_batch_size = global_batch_size
        self.params = params
        self.num_examples = example_count(recipe, params) if recipe.indexed else 0

    def build(self, context: RecipeInputContext, epoch: int, start: int) -> tuple[tf.data.Dataset, int]:
        """The recipe's dataset for ``epoch`` from batch ``start`` on, and the batches still to skip."""
        recipe = self.recipe
        seed_input_rng(self.seed, epoch)
        if recipe.indexed:  # the runner's own pipeline: positioned, never skipped
            return indexed_dataset(
                recipe, params=self.params, num_examples=self.num_examples, seed=self.seed, epoch=epoch,
                start_step=start, steps_per_epoch=self.steps_per_epoch, global_batch_size=self.global_batch_size,
                input_pipeline_id=context.input_pipeline_id, num_input_pipelines=context.num_input_pipelines,
                per_replica_batch_size=context.per_replica_batch_size,
            ), 0
        assert recipe.dataset is not None  # a recipe has one of the two contracts (job/recipe.py)
        if accepts_start_step(recipe.dataset):
            dataset, skip = recipe.dataset(context, epoch, self.seed, start_step=start), 0
        else:
            dataset, skip = recipe.dataset(context, epoch, self.seed), start
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"recipe {recipe.name}: dataset() returned {type(dataset).__name__}; expected a tf.data.Dataset")
        return dataset, skip


def _distributed_batch_is_dynamic(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset) -> bool:
    """Whether ``strategy``'s distributed iterator would hand ``dataset``'s batches to the
    step with an unknown batch dimension (its partial-batch handling).

    Why it matters: the train step is traced from the element's static shapes, and TF
    compiles a different (equally deterministic) gradient computation for ``(4, 16, 16, 3)``
    than for ``(None, 16, 16, 3)``; measured on tests/recipes/input_bound_skip.py at 2
    workers: identical batches and losses, gradients differing in the last bits from step 0,
    so other weights. MultiWorkerMirroredStrategy turns the handling on for every finite
    dataset in multi-worker mode (TF 2.21, ``input_lib._enable_get_next_as_optional``); we
    ask TF's own rule so the plain iterator sees exactly the shapes the distributed one does.
    """
    from tensorflow.python.distribute import input_lib  # private: the rule must be TF's own

    return bool(input_lib._enable_get_next_as_optional(strategy, dataset, input_lib._cardinality(dataset)))


def _with_dynamic_batch(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with the first dimension of every tensor of rank >= 1 relaxed to None, as
    the distributed iterator's element spec has it (``input_lib._rebatch_as_dynamic``); the
    values are untouched (``PlaceholderWithDefault`` passes its input through)."""

    def relax(component):
        if not isinstance(component, tf.Tensor) or component.shape.rank in (None, 0):
            return component  # sparse/ragged keep their spec; a scalar has no batch dimension
        return tf.raw_ops.PlaceholderWithDefault(input=component, shape=[None, *component.shape[1:]])

    # Not converted by AutoGraph (nothing to convert): its conversion was ~0.05 s of every
    # attempt's input phase. Sequential (no num_parallel_calls), so in order:
    # ``deterministic=True`` here only made tf.data warn in every worker log that it has no effect.
    @tf.autograph.experimental.do_not_convert
    def relax_element(*element):
        return tf.nest.map_structure(relax, element[0] if len(element) == 1 else element)

    return dataset.map(relax_element)


def accepts_start_step(dataset_fn: Any) -> bool:
    """Whether a recipe's ``dataset`` takes ``start_step`` (it positions the epoch itself)."""
    try:
        return "start_step" in inspect.signature(dataset_fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return False
