"""A fit script's model with its own train_step passes the source check; what it cannot get is refused there."""

import pytest

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import check_recipe_source

SCRIPT = """
import keras
import tensorflow as tf

class Own(keras.Model):
    def train_step(self, data):
        return {{"loss": 0.0}}

    def test_step(self, data):
        return {{"loss": 0.0}}

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = Own()
model.fit({call})
"""


DATASET = "dataset, epochs=3, steps_per_epoch=70"


def write(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_vae_example_passes():
    assert check_recipe_source("examples/keras_vae.py").name == "keras_vae.py"


def test_a_script_class_overriding_train_step_and_test_step_passes(tmp_path):
    assert check_recipe_source(write(tmp_path, SCRIPT.format(call=DATASET))).name == "train.py"


VALIDATION = [("validation_data", DATASET + ", validation_data=val"),
              ("validation_split", "x, y, batch_size=64, validation_split=0.2")]
KERAS_TEST_STEP = SCRIPT.replace("""    def test_step(self, data):
        return {{"loss": 0.0}}

""", "")


@pytest.mark.parametrize("name, call", VALIDATION)
def test_validation_with_an_own_train_step_and_test_step_passes(tmp_path, name, call):
    assert check_recipe_source(write(tmp_path, SCRIPT.format(call=call))).name == "train.py"


@pytest.mark.parametrize("name, call", VALIDATION)
def test_validation_with_an_own_train_step_and_keras_test_step_is_refused_naming_the_class(tmp_path, name, call):
    path = write(tmp_path, KERAS_TEST_STEP.format(call=call))
    with pytest.raises(RecipeError) as caught:
        check_recipe_source(path)
    assert str(caught.value) == (
        f"Script {path}: fit({name}=...) at line 12 with class Own's own train_step (line 6) and Keras' test_step: "
        "not supported: it evaluates compile()'s loss, which this model does not have: override test_step too")


def test_a_script_class_overriding_compute_loss_without_train_step_is_refused(tmp_path):
    text = SCRIPT.format(call=DATASET).replace("def train_step(self, data)", "def compute_loss(self, *args, **kwargs)")
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as caught:
        check_recipe_source(path)
    assert str(caught.value) == (
        f"Script {path}: class Own overrides compute_loss at line 6 but not train_step; the runner runs Keras' step "
        "or the model's own train_step, which would not call it")


def test_a_class_with_its_own_compile_beside_its_train_step_is_accepted(tmp_path):
    # keras.io's GAN: its own optimizers are built before a restore (runner/keras_recipes/own_step.py)
    text = SCRIPT.replace("    def test_step(self, data):", "    def compile(self, d_optimizer, g_optimizer):\n"
                          "        super().compile()\n\n    def test_step(self, data):")
    check_recipe_source(write(tmp_path, text.format(call=DATASET)))
