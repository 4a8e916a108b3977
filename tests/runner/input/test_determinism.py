"""The resume check's bookkeeping and the input seeding, in-process."""

import random
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import load_recipe
from resilient_train.runner.input.data import epoch_dataset, record_first_batch
from resilient_train.runner.input.determinism import InputCheck, batch_digest, first_batch_digest, seed_input_rng

LINEAR = str(Path(__file__).resolve().parents[3] / "recipes" / "linear_regression.py")


def unseeded_first_batch() -> str:
    return first_batch_digest(tf.data.Dataset.range(100).shuffle(100).batch(5))


def test_seeding_makes_an_unseeded_shuffle_independent_of_earlier_ops():
    seed_input_rng(3, 1)
    fresh = unseeded_first_batch()
    for _ in range(7):  # a resumed process created other ops before building the epoch
        tf.random.uniform([1])
    seed_input_rng(3, 1)
    assert unseeded_first_batch() == fresh
    seed_input_rng(3, 2)
    assert unseeded_first_batch() != fresh


def test_seeding_makes_numpy_and_python_global_draws_a_function_of_seed_and_epoch():
    def draws():
        return np.random.normal(size=4).tolist(), [random.random() for _ in range(4)]

    seed_input_rng(3, 1)
    fresh = draws()
    np.random.normal(size=7), random.random()  # a resumed process drew other numbers before
    seed_input_rng(3, 1)
    assert draws() == fresh
    seed_input_rng(3, 2)
    other = draws()
    assert other[0] != fresh[0] and other[1] != fresh[1]


def test_the_digest_recorded_ahead_of_an_epoch_is_the_one_entering_it_takes(monkeypatch):
    emitted = []
    monkeypatch.setattr("resilient_train.runner.input.determinism.emit", lambda name, **f: emitted.append((name, f)))
    recipe, params = load_recipe(LINEAR), {"learning_rate": 0.05, "fail_at_step": -1}
    strategy = tf.distribute.get_strategy()  # one input pipeline, one replica
    shape = dict(seed=0, steps_per_epoch=10, global_batch_size=4, params=params)

    entered = InputCheck()
    iter(epoch_dataset(strategy, recipe, epoch=1, start_step=0, input_check=entered, **shape))
    ahead = InputCheck()
    record_first_batch(strategy, recipe, ahead, epoch=1, workers=1, plain=False, **shape)
    assert ahead.recorded(1) and not ahead.recorded(2)
    assert ahead.to_extra(1) == entered.to_extra(1) != {}
    emitted.clear()
    iter(epoch_dataset(strategy, recipe, epoch=1, start_step=0, input_check=ahead, **shape))
    assert emitted == []  # entering the epoch does not build (or report) its first batch again


def test_batch_digest_covers_values_and_structure():
    a = (tf.constant([[1.0, 2.0]]), tf.constant([1]))
    assert batch_digest(a) == batch_digest((tf.constant([[1.0, 2.0]]), tf.constant([1])))
    assert batch_digest(a) != batch_digest((tf.constant([[1.0, 2.5]]), tf.constant([1])))
    assert batch_digest(a) != batch_digest((tf.constant([1.0, 2.0]), tf.constant([1])))


def test_a_checkpoint_records_the_digest_of_its_epoch_only(monkeypatch):
    emitted = []
    monkeypatch.setattr("resilient_train.runner.input.determinism.emit", lambda name, **f: emitted.append((name, f)))
    check = InputCheck()
    check.observe(0, "a" * 64)
    check.observe(1, None)  # an empty epoch has no first batch and no event
    assert emitted == [("input_digest", {"group": True, "epoch": 0, "sha256": "a" * 64})]  # the event log has it too
    assert check.to_extra(0) == {"input_digest": {"epoch": 0, "sha256": "a" * 64}}
    assert check.to_extra(1) == {}  # nothing observed for it (the loop records it ahead of the epoch-end save)


def test_same_digest_after_restore_is_silent_and_a_different_one_is_reported(capsys, monkeypatch):
    emitted = []
    monkeypatch.setattr("resilient_train.runner.input.determinism.emit", lambda name, **f: emitted.append((name, f)))
    extra = {"input_digest": {"epoch": 1, "sha256": "a" * 64}}
    check = InputCheck(recipe_name="r")
    check.expect(extra, checkpoint="ckpt-000000000015", same_world_size=True)
    check.observe(1, "a" * 64)
    assert [name for name, _ in emitted] == ["input_digest"]
    emitted.clear()
    check.expect(extra, checkpoint="ckpt-000000000015", same_world_size=True)
    check.observe(1, "b" * 64)
    assert [name for name, _ in emitted] == ["input_digest", "input_mismatch"]
    assert emitted[1][1]["epoch"] == 1 and emitted[1][1]["found_sha256"] == "b" * 64
    assert "the first batch of epoch 1 differs" in capsys.readouterr().err

    strict = InputCheck(strict=True, recipe_name="r")
    strict.expect(extra, checkpoint="ckpt-000000000015", same_world_size=True)
    with pytest.raises(RecipeError, match=r"\(--strict-resume\)$"):
        strict.observe(1, "b" * 64)


def test_a_mismatch_is_carried_by_every_later_checkpoint_and_inherited_by_a_restore(monkeypatch):
    # Issue 51: said once mid-run, then lost; now each later manifest carries it.
    monkeypatch.setattr("resilient_train.runner.input.determinism.emit", lambda name, **f: None)
    check = InputCheck(recipe_name="r")
    check.expect({"input_digest": {"epoch": 1, "sha256": "a" * 64}}, checkpoint="ckpt-000000000010",
                 same_world_size=True)
    assert check.inexact == [] and "inexact" not in check.to_extra(1)
    check.observe(1, "b" * 64)
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}
    assert check.to_extra(1) == {"input_digest": {"epoch": 1, "sha256": "b" * 64}, "inexact": [entry]}
    assert check.to_extra(2) == {"inexact": [entry]}  # (epoch 2's input not built yet)

    resumed = InputCheck(recipe_name="r")  # a later attempt restores a checkpoint taken after it
    resumed.expect({"input_digest": {"epoch": 2, "sha256": "c" * 64}, "inexact": [entry]},
                   checkpoint="ckpt-000000000025", same_world_size=True)
    resumed.observe(2, "c" * 64)  # this resume is exact; the history is not
    assert resumed.to_extra(2)["inexact"] == [entry] == resumed.inexact
    again = InputCheck(recipe_name="r")  # a restore of a checkpoint from before it: exact again
    again.expect({"input_digest": {"epoch": 1, "sha256": "a" * 64}}, checkpoint="ckpt-000000000010",
                 same_world_size=True)
    again.observe(1, "a" * 64)
    assert again.inexact == [] and "inexact" not in again.to_extra(1)


def test_every_worker_learns_the_chiefs_verdict_so_a_non_chiefs_checkpoint_carries_it_too(monkeypatch):
    monkeypatch.setattr("resilient_train.runner.input.determinism.emit", lambda name, **f: None)
    extra = {"input_digest": {"epoch": 1, "sha256": "a" * 64}}
    chief, other = InputCheck(recipe_name="r"), InputCheck(recipe_name="r")
    for check in (chief, other):
        check.expect(extra, checkpoint="ckpt-000000000012", same_world_size=True)
        assert check.agreement_pending
    chief.observe(1, "b" * 64)  # only the chief builds input pipeline 0 and compares
    assert (chief.restore_mismatched, other.restore_mismatched) == (True, False)
    for check in (chief, other):  # the loop's all-reduce hands both the chief's verdict
        check.agreed(chief.restore_mismatched)
        assert not check.agreement_pending
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000012"}
    assert chief.inexact == other.inexact == [entry]  # recorded once each
    assert other.to_extra(1) == {"inexact": [entry]}  # (a non-chief hashes nothing)

    clean = InputCheck(recipe_name="r")
    clean.expect(extra, checkpoint="ckpt-000000000012", same_world_size=True)
    clean.agreed(False)
    assert clean.inexact == [] and not clean.agreement_pending
    unchecked = InputCheck(recipe_name="r")
    unchecked.expect(extra, checkpoint="ckpt-000000000012", same_world_size=False)  # other shards: no check
    assert not unchecked.agreement_pending


def test_another_world_size_is_not_compared():
    check = InputCheck(strict=True)
    check.expect({"input_digest": {"epoch": 1, "sha256": "a" * 64}}, checkpoint="c", same_world_size=False)
    check.observe(1, "b" * 64)  # other sharding: a different first batch is expected
