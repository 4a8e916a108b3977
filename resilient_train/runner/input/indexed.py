"""The indexed input contract: the runner builds the pipeline from ``example(index)``.

A recipe that defines ``num_examples(params)`` and ``example(index, params)`` (instead of
``dataset``) hands the order of its examples to the runner, which keeps one invariant:
**the examples of global step s, and their order, are a function of (seed, s) alone**:
not of the worker count, the attempt, or where the epoch was entered.

The order is one endless stream of *positions*. Global step ``s`` of epoch ``e`` takes
the global batch at positions ``P = (e * steps_per_epoch + s) * GB + j`` for ``j`` in
``[0, GB)``; worker ``r`` of ``n`` takes its contiguous share ``[r * GB/n, (r+1) * GB/n)``
of that batch (its replicas split the share in order, as ``distribute_datasets_from_function``
hands out per-replica batches). Position ``P`` lies in *pass* ``P // N`` (``N`` =
``num_examples``) at offset ``P % N``, and names example
``index_shuffle(P % N, seed=(seed, pass), max_index=N - 1)``: each pass is a stateless
permutation of all ``N`` examples, a new one per pass.

Epochs are windows of ``steps_per_epoch * GB`` positions on that stream, so:

* ``steps_per_epoch * GB < N``: an epoch sees a part of a pass, and the next epoch goes on
  in the same pass: every example is seen once before any is seen twice;
* ``steps_per_epoch * GB > N``: an epoch runs into the next pass(es) (a new permutation
  each), so an example can be seen twice in one epoch, never twice in one pass.

A fit script's arrays (runner/keras_recipes/fitscript.py) take the other reading, Keras'
one: ``epoch_passes=True`` makes every epoch its own pass (epoch ``e`` starts at position
``e * N``), so each epoch draws a new permutation of all ``N`` examples, a function of
``(seed, e)``, and trains on its first ``steps_per_epoch * GB <= N`` positions (the rest,
fewer than a global batch when the epoch is the arrays once over, is left out: Keras'
smaller last batch would not split over the workers). ``shuffle=False`` keeps the arrays'
order (example = offset), as ``fit(shuffle=False)``.

Re-entry at step ``s`` of epoch ``e`` starts the range of positions there: O(1), no
replay. ``augment(example, seed)``, when the recipe defines it, gets the per-example
stateless seed ``[seed, P]`` (int64, shape [2], for ``tf.random.stateless_*``): the same
augmentation for the same position whatever the worker count, a new one every time the
example comes round again.

The pipeline yields ``(batch, indices)``: the training step uses the batch and, with
``--record-indices``, all-gathers the indices it was fed so the chief can write a digest
of each global step's example indices (rundir/stepindices.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe

__all__ = ["IndexPlan", "example_indices", "indexed_dataset", "example_count"]

# What tf.random.experimental.index_shuffle puts before a [2] seed (its raw op takes [3]).
_INDEX_SHUFFLE_PAD = 498247692  # a Python int: no TensorFlow op at import (the strategy comes first)


@dataclass(frozen=True)
class IndexPlan:
    """The position arithmetic of one job (pure Python; no TensorFlow)."""

    num_examples: int
    global_batch_size: int
    steps_per_epoch: int
    epoch_passes: bool = False  # every epoch its own pass (a fit script's arrays; module docstring)

    def __post_init__(self) -> None:
        for name in ("num_examples", "global_batch_size", "steps_per_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Received {name}={value!r}; expected an integer >= 1")
        if self.epoch_passes and self.steps_per_epoch * self.global_batch_size > self.num_examples:
            raise ValueError(
                f"Received steps_per_epoch={self.steps_per_epoch} of {self.global_batch_size} with epoch_passes; "
                f"expected at most {self.num_examples} positions per epoch (one pass)")

    def epoch_first(self, epoch: int) -> int:
        """The first position of epoch ``epoch``."""
        if self.epoch_passes:
            return epoch * self.num_examples
        return epoch * self.steps_per_epoch * self.global_batch_size

    def share(self, rank: int, workers: int) -> tuple[int, int]:
        """Worker ``rank`` of ``workers``: its offsets ``[lo, hi)`` inside every global batch."""
        if workers < 1 or self.global_batch_size % workers:
            raise ValueError(
                f"Received workers={workers} for global_batch_size={self.global_batch_size}; "
                "expected a number of workers that divides the global batch"
            )
        if not 0 <= rank < workers:
            raise ValueError(f"Received rank={rank}; expected 0 <= rank < {workers}")
        size = self.global_batch_size // workers
        return rank * size, (rank + 1) * size

    def step_positions(self, epoch: int, step: int) -> range:
        """The global batch of step ``step`` of epoch ``epoch``: its positions, in order."""
        first = self.epoch_first(epoch) + step * self.global_batch_size
        return range(first, first + self.global_batch_size)

    def worker_positions(self, epoch: int, step: int, rank: int, workers: int) -> range:
        """Worker ``rank``'s share of step ``step``'s positions."""
        lo, hi = self.share(rank, workers)
        batch = self.step_positions(epoch, step)
        return batch[lo:hi]

    def pass_and_offset(self, position: int) -> tuple[int, int]:
        return divmod(position, self.num_examples)


def example_indices(positions: tf.Tensor, num_examples: int, seed: int) -> tf.Tensor:
    """The example index at each position (int64 in, int64 out; a scalar or a vector).

    ``tf.random.experimental.index_shuffle(offset, [seed, pass], N - 1)``, through its raw
    op: the public wrapper pads a ``[n, 2]`` seed along the wrong axis (TF 2.21), and one
    call with a seed per position must give what the scalar form gives (the unit tests
    compare both with the public API).
    """
    positions = tf.cast(positions, tf.int64)
    count = tf.constant(num_examples, tf.int64)
    passes, offsets = positions // count, positions % count
    seeds = tf.stack([tf.fill(tf.shape(passes), tf.constant(_INDEX_SHUFFLE_PAD, tf.int64)), tf.fill(tf.shape(passes), tf.constant(seed, tf.int64)),
                      passes], axis=-1)
    return tf.raw_ops.RandomIndexShuffle(index=offsets, seed=seeds, max_index=tf.fill(tf.shape(offsets), count - 1),
                                         rounds=4)


def example_count(recipe: Recipe, params: dict[str, Any]) -> int:
    """``recipe.num_examples(params)``, refused unless it is an integer >= 1."""
    assert recipe.num_examples is not None  # only indexed recipes get here
    try:
        count = recipe.num_examples(params)
    except Exception as exc:
        raise RecipeError(f"recipe {recipe.name}: num_examples() failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RecipeError(f"recipe {recipe.name}: num_examples() returned {count!r}; expected an integer >= 1")
    return count


def indexed_dataset(
    recipe: Recipe,
    *,
    params: dict[str, Any],
    num_examples: int,
    seed: int,
    epoch: int,
    start_step: int,
    steps_per_epoch: int,
    global_batch_size: int,
    input_pipeline_id: int,
    num_input_pipelines: int,
    per_replica_batch_size: int,
    epoch_passes: bool = False,
    shuffle: bool = True,
) -> tf.data.Dataset:
    """Input pipeline ``input_pipeline_id``'s batches of epoch ``epoch`` from ``start_step``.

    Elements are ``(batch, indices)``: ``batch`` is what ``example`` (then ``augment``)
    returned, batched to ``per_replica_batch_size``; ``indices`` the int64 example indices.
    ``epoch_passes`` and ``shuffle=False``: a fit script's arrays (the module docstring).
    """
    plan = IndexPlan(num_examples, global_batch_size, steps_per_epoch, epoch_passes)
    lo, hi = plan.share(input_pipeline_id, num_input_pipelines)
    share = hi - lo
    epoch_first = plan.epoch_first(epoch)

    def position(local: tf.Tensor) -> tf.Tensor:  # local: this pipeline's k-th position of the epoch
        return epoch_first + (local // share) * global_batch_size + lo + local % share

    def make(local: tf.Tensor):
        at = position(local)
        index = example_indices(at, num_examples, seed) if shuffle else at % num_examples
        element = recipe.example(index, params)
        if recipe.augment is not None:
            element = recipe.augment(element, tf.stack([tf.constant(seed, tf.int64), at]))
        return element, index

    # The range starts at the re-entry step: nothing before it is built (O(1) re-entry).
    positions = tf.data.Dataset.range(start_step * share, steps_per_epoch * share)
    return positions.map(make, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(
        per_replica_batch_size, drop_remainder=True)
