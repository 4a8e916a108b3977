"""Deterministic recipe failures become fatal RecipeErrors with the fix."""

from types import SimpleNamespace

from resilient_train.runner.diagnose import explain


class Counter:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class OutOfRangeError(Exception):
    """Stands for tf.errors.OutOfRangeError (recognised by name)."""


def test_a_short_dataset_names_the_batch_count_and_repeat():
    trainer = SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(28))
    error = explain(OutOfRangeError("End of sequence"), recipe_name="digits", trainer=trainer, steps_per_epoch=60)
    assert str(error) == (
        "recipe digits: dataset() yielded 28 batches for epoch 0; steps_per_epoch is 60: "
        "add .repeat() (or lower --steps-per-epoch)"
    )


def test_an_op_at_import_is_named():
    error = explain(RuntimeError("Collective ops must be configured at program startup"),
                    recipe_name="bad", trainer=None, steps_per_epoch=None)
    assert str(error).startswith("recipe bad runs a TensorFlow op at import")


def test_anything_else_is_left_alone():
    trainer = SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(3))
    assert explain(ValueError("boom"), recipe_name="r", trainer=trainer, steps_per_epoch=10) is None
    assert explain(OutOfRangeError("End of sequence"), recipe_name="r", trainer=None, steps_per_epoch=10) is None


class StagingError(Exception):
    """Stands for autograph's wrapper of an exception raised while tracing."""


def test_a_recipe_error_raised_while_tracing_is_taken_back_out():
    wrapped = StagingError(
        "in user code:\n\n    File \"loop.py\", line 238, in step_fn  *\n        per_example = ...\n\n"
        "    RecipeError: recipe r: loss() must return one value per example, got shape (); fix it\n"
    )
    error = explain(wrapped, recipe_name="r", trainer=None, steps_per_epoch=10)
    assert str(error) == "recipe r: loss() must return one value per example, got shape (); fix it"
