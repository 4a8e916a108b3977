"""The indexed contract's position maths (pure) and its permutation (TensorFlow, eager).

Invariants: a global step's positions do not depend on the worker count (the shares of
n workers, concatenated in rank order, are the global batch); each pass is a permutation
of all examples; re-entry at step k yields exactly the uninterrupted epoch from step k.
"""

import pytest
import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.indexed import IndexPlan, example_indices, indexed_dataset


@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_shares_concatenate_to_the_global_batch_at_any_worker_count(workers):
    plan = IndexPlan(num_examples=100, global_batch_size=16, steps_per_epoch=5)
    for epoch, step in [(0, 0), (0, 4), (3, 2)]:
        joined = [p for rank in range(workers) for p in plan.worker_positions(epoch, step, rank, workers)]
        assert joined == list(plan.step_positions(epoch, step))


def test_positions_of_a_step():
    plan = IndexPlan(num_examples=100, global_batch_size=16, steps_per_epoch=5)
    assert plan.step_positions(2, 3) == range(208, 224)  # (2*5 + 3) * 16
    assert plan.worker_positions(2, 3, 1, 4) == range(212, 216)
    assert plan.pass_and_offset(208) == (2, 8)


def test_share_refuses_a_worker_count_that_does_not_divide_the_batch():
    plan = IndexPlan(num_examples=100, global_batch_size=16, steps_per_epoch=5)
    with pytest.raises(ValueError, match=r"Received workers=3 for global_batch_size=16"):
        plan.share(0, 3)
    with pytest.raises(ValueError, match=r"Received rank=2; expected 0 <= rank < 2"):
        plan.share(2, 2)


@pytest.mark.parametrize("field", ["num_examples", "global_batch_size", "steps_per_epoch"])
def test_plan_refuses_non_positive_sizes(field):
    values = {"num_examples": 10, "global_batch_size": 2, "steps_per_epoch": 3, field: 0}
    with pytest.raises(ValueError, match=rf"Received {field}=0; expected an integer >= 1"):
        IndexPlan(**values)


def test_every_pass_is_a_permutation_and_passes_differ():
    order = example_indices(tf.range(3 * 37, dtype=tf.int64), 37, seed=5).numpy()
    passes = order.reshape(3, 37)
    for one_pass in passes:
        assert sorted(one_pass.tolist()) == list(range(37))
    assert passes[0].tolist() != passes[1].tolist() != passes[2].tolist()
    assert order.tolist() != example_indices(tf.range(3 * 37, dtype=tf.int64), 37, seed=6).numpy().tolist()


def test_vector_form_equals_the_public_scalar_index_shuffle():
    positions = [0, 5, 36, 37, 80]
    vector = example_indices(tf.constant(positions, tf.int64), 37, seed=5).numpy().tolist()
    scalar = [int(tf.random.experimental.index_shuffle(tf.constant(p % 37, tf.int64), tf.constant([5, p // 37], tf.int64),
                                                        tf.constant(36, tf.int64))) for p in positions]
    assert vector == scalar
    assert [int(example_indices(tf.constant(p, tf.int64), 37, seed=5)) for p in positions] == scalar


def _recipe(augment=None):
    return Recipe(name="toy", source="toy.py", build_model=None, build_optimizer=None, loss=None, dataset=None,
                  num_examples=lambda params: 37, augment=augment,
                  example=lambda index, params: (tf.cast(index, tf.float32) * 10.0, index))


def _indices(recipe, *, rank=0, workers=1, start_step=0, epoch=1, steps_per_epoch=6, global_batch_size=8):
    dataset = indexed_dataset(recipe, params={}, num_examples=37, seed=3, epoch=epoch, start_step=start_step,
                              steps_per_epoch=steps_per_epoch, global_batch_size=global_batch_size,
                              input_pipeline_id=rank, num_input_pipelines=workers,
                              per_replica_batch_size=global_batch_size // workers)
    return [(batch, indices.numpy().tolist()) for batch, indices in dataset]


def test_pipeline_yields_the_examples_at_its_positions_and_their_indices():
    elements = _indices(_recipe())
    assert len(elements) == 6
    expected = example_indices(tf.range(48, 96, dtype=tf.int64), 37, seed=3).numpy().reshape(6, 8).tolist()
    assert [indices for _, indices in elements] == expected  # epoch 1 = positions [48, 96): passes 1 and 2
    (features, labels), indices = elements[0]
    assert labels.numpy().tolist() == indices and features.numpy().tolist() == [10.0 * i for i in indices]


def test_two_workers_feed_the_global_batch_of_one_in_rank_order():
    one = [indices for _, indices in _indices(_recipe())]
    ranks = [[indices for _, indices in _indices(_recipe(), rank=r, workers=2)] for r in range(2)]
    assert [first + second for first, second in zip(*ranks)] == one


def test_reentry_starts_at_the_step_without_building_the_ones_before():
    whole = [indices for _, indices in _indices(_recipe())]
    assert [indices for _, indices in _indices(_recipe(), start_step=4)] == whole[4:]


def test_augment_gets_the_position_as_its_seed():
    seeds = []

    def augment(example, seed):
        return (seed, example[1])

    elements = _indices(_recipe(augment), start_step=5)
    for (seed, _), _ in elements:
        seeds.extend(seed.numpy().tolist())
    assert seeds == [[3, p] for p in range(88, 96)]  # (1*6 + 5) * 8 = 88


def test_epoch_passes_start_every_epoch_at_a_pass_and_refuse_more_than_one_pass():
    plan = IndexPlan(num_examples=37, global_batch_size=8, steps_per_epoch=4, epoch_passes=True)
    assert (plan.epoch_first(2), plan.step_positions(2, 1)) == (74, range(82, 90))
    assert plan.pass_and_offset(plan.step_positions(2, 3)[-1]) == (2, 31)
    assert IndexPlan(37, 8, 4).step_positions(2, 1) == range(72, 80)  # the stream: epochs are windows
    with pytest.raises(ValueError, match="Received steps_per_epoch=5 of 8 with epoch_passes; expected at most 37"):
        IndexPlan(37, 8, 5, epoch_passes=True)


def test_an_epoch_pass_pipeline_is_the_epochs_permutation_shared_by_the_workers():
    def indices(rank=0, workers=1, start_step=0, shuffle=True):
        dataset = indexed_dataset(_recipe(), params={}, num_examples=37, seed=3, epoch=2, start_step=start_step,
                                  steps_per_epoch=4, global_batch_size=8, input_pipeline_id=rank,
                                  num_input_pipelines=workers, per_replica_batch_size=8 // workers,
                                  epoch_passes=True, shuffle=shuffle)
        return [i.numpy().tolist() for _, i in dataset]

    order = example_indices(tf.range(74, 106, dtype=tf.int64), 37, seed=3).numpy().reshape(4, 8).tolist()
    assert indices() == order  # pass 2, offsets 0..31
    assert [a + b for a, b in zip(indices(0, 2), indices(1, 2))] == order
    assert indices(start_step=3) == order[3:]
    assert indices(shuffle=False) == [list(range(k, k + 8)) for k in range(0, 32, 8)]
