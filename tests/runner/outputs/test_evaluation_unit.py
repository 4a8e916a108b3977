"""Evaluation wiring that needs no TensorFlow work: the interval and the console line."""

import pytest

from resilient_train.job.config import JobConfig
from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.supervisor.console import render_event

pytest.importorskip("tensorflow")
from resilient_train.runner.outputs.evaluation import Validation, eval_every_epochs  # noqa: E402


def recipe(with_eval: bool) -> Recipe:
    def nothing(*args):
        return None

    return Recipe(name="r", source="r.py", build_model=nothing, build_optimizer=nothing, loss=nothing,
                  dataset=nothing, eval_dataset=nothing if with_eval else None)


def test_interval_defaults_to_every_epoch_only_with_an_eval_split():
    assert eval_every_epochs(JobConfig(recipe="r.py"), recipe(True)) == 1
    assert eval_every_epochs(JobConfig(recipe="r.py"), recipe(False)) == 0
    assert eval_every_epochs(JobConfig(recipe="r.py", eval_every_epochs=0), recipe(True)) == 0
    assert eval_every_epochs(JobConfig(recipe="r.py", eval_every_epochs=3), recipe(True)) == 3


def test_asking_for_evaluation_without_an_eval_split_names_the_fix():
    with pytest.raises(RecipeError, match=r"eval_every_epochs=2 but recipe r defines no eval_dataset"):
        eval_every_epochs(JobConfig(recipe="r.py", eval_every_epochs=2), recipe(False))


def test_epoch_line_shows_validation_numbers():
    record = {"event": "epoch_finished", "ts": "2026-01-01T10:00:00.000", "epoch": 1, "loss": 0.5,
              "metrics": {"accuracy": 0.8}, **Validation(0.25, {"accuracy": 0.9}, 297).event_fields()}
    assert render_event(record) == (
        "10:00:00  epoch 2 finished  loss 0.5000  accuracy 0.8000  val_loss 0.2500  val_accuracy 0.9000"
    )
