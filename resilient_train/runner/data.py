"""Deterministic per-epoch input with exact mid-epoch re-entry.

The recipe's ``dataset(input_context, epoch, seed)`` is a pure function of its arguments, so
batch ``k`` of epoch ``e`` is the same batch on every attempt. Resuming at
``step_in_epoch = k`` therefore rebuilds epoch ``e`` and skips its first ``k`` batches: no
iterator state needs to be checkpointed, and a changed worker count only changes sharding.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from resilient_train.recipe import Recipe
from resilient_train.runner.determinism import InputCheck, first_batch_digest, seed_input_rng

__all__ = ["RecipeInputContext", "epoch_dataset"]


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
):
    """The distributed dataset for ``epoch``, positioned at ``start_step``.

    TensorFlow's global seed is reset from ``(seed, epoch)`` right before each call of
    ``recipe.dataset`` (runner/determinism.py), so an unseeded shuffle is the same on every
    attempt. With ``input_check``, the chief (input pipeline 0) also hashes the first batch
    of a separate build of the same input for the resume check.
    """

    def build(context: RecipeInputContext) -> tf.data.Dataset:
        seed_input_rng(seed, epoch)
        dataset = recipe.dataset(context, epoch, seed)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"recipe {recipe.name}: dataset() returned {type(dataset).__name__}; expected a tf.data.Dataset")
        return dataset

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        context = RecipeInputContext(input_context, global_batch_size, params)
        if input_check is not None and input_context.input_pipeline_id == 0:
            input_check.observe(epoch, first_batch_digest(build(context)))
        dataset = build(context)
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.with_options(options).skip(start_step).take(steps_per_epoch - start_step).prefetch(2)

    return strategy.distribute_datasets_from_function(dataset_fn)
