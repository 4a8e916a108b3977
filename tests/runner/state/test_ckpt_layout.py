"""The checkpoint's object graph is the file format (runner/state/ckpt_layout.py): its keys, pinned.

The exact lists below are what a checkpoint of each recipe holds today; a worker's, the
parameter-server coordinator's and ``export``'s graphs are all built by ``training_graph``.
A change to any of these lists is a change of the checkpoint format: every existing
checkpoint would stop restoring (CheckpointIncompatibleError). Change them deliberately.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import trackable_object_graph_pb2  # noqa: E402

from resilient_train.errors import CheckpointIncompatibleError  # noqa: E402
from resilient_train.job.recipe import load_recipe  # noqa: E402
from resilient_train.runner.state import ckpt_layout  # noqa: E402
from resilient_train.runner.state.model_state import weights_digest  # noqa: E402

RECIPES = Path(__file__).resolve().parents[3] / "recipes"

TOP_LEVEL_KEYS = ["epoch", "global_step", "model", "optimizer", "rng", "step_in_epoch"]

_V = "/.ATTRIBUTES/VARIABLE_VALUE"

# (key, shape, dtype) as tf.train.list_variables / load_checkpoint report them.
LINEAR_REGRESSION = [
    ("_CHECKPOINTABLE_OBJECT_GRAPH", [], "string"),
    ("epoch" + _V, [], "int64"),
    ("global_step" + _V, [], "int64"),
    ("optimizer/_iterations" + _V, [], "int64"),
    ("optimizer/_learning_rate" + _V, [], "float32"),
    ("optimizer/_trainable_variables/0" + _V, [2, 1], "float32"),
    ("optimizer/_trainable_variables/1" + _V, [1], "float32"),
    ("optimizer/_variables/2" + _V, [2, 1], "float32"),
    ("optimizer/_variables/3" + _V, [1], "float32"),
    ("step_in_epoch" + _V, [], "int64"),
]

# A compiled Keras model (its optimizer is compile()'s) with a seeded Dropout: its
# seed-generator state is the rng entry.
DIGITS_KERAS = [
    ("_CHECKPOINTABLE_OBJECT_GRAPH", [], "string"),
    ("epoch" + _V, [], "int64"),
    ("global_step" + _V, [], "int64"),
    ("optimizer/_iterations" + _V, [], "int64"),
    ("optimizer/_learning_rate" + _V, [], "float32"),
    ("optimizer/_trainable_variables/0" + _V, [3, 3, 1, 8], "float32"),
    ("optimizer/_trainable_variables/1" + _V, [8], "float32"),
    ("optimizer/_trainable_variables/2" + _V, [288, 32], "float32"),
    ("optimizer/_trainable_variables/3" + _V, [32], "float32"),
    ("optimizer/_trainable_variables/4" + _V, [32, 10], "float32"),
    ("optimizer/_trainable_variables/5" + _V, [10], "float32"),
    ("optimizer/_variables/2" + _V, [3, 3, 1, 8], "float32"),
    ("optimizer/_variables/3" + _V, [8], "float32"),
    ("optimizer/_variables/4" + _V, [288, 32], "float32"),
    ("optimizer/_variables/5" + _V, [32], "float32"),
    ("optimizer/_variables/6" + _V, [32, 10], "float32"),
    ("optimizer/_variables/7" + _V, [10], "float32"),
    ("rng/seed_generator_seed_generator_state" + _V, [2], "int64"),
    ("step_in_epoch" + _V, [], "int64"),
]


def _parts(recipe_file: str, *, name_prefix: str = ""):
    """Model, optimizer and counters as a fresh worker process builds them (a cleared
    Keras session: the auto-generated names that key ``rng`` are a new process's)."""
    recipe = load_recipe(str(RECIPES / recipe_file))
    params = dict(recipe.params)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = recipe.build_model(params)
    optimizer = recipe.build_optimizer(params) if recipe.build_optimizer is not None else model.optimizer
    optimizer.build(model.trainable_variables)
    return recipe, model, optimizer, ckpt_layout.new_counters(name_prefix)


def _graph(recipe_file: str):
    recipe, model, optimizer, counters = _parts(recipe_file)
    checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer, counters=counters,
                                            rng=ckpt_layout.rng_state(model))
    return recipe, checkpoint, model, counters


def _top_level_keys(prefix: str) -> list[str]:
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return [child.local_name for child in graph.nodes[0].children]


def _variables(prefix: str) -> list[tuple[str, list[int], str]]:
    dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    return [(name, shape, dtypes[name].name) for name, shape in tf.train.list_variables(prefix)]


@pytest.mark.parametrize("recipe_file, expected", [("linear_regression.py", LINEAR_REGRESSION),
                                                   ("digits_keras.py", DIGITS_KERAS)])
def test_a_saved_checkpoint_has_exactly_the_pinned_keys(tmp_path, recipe_file, expected):
    _, checkpoint, _, _ = _graph(recipe_file)
    prefix = checkpoint.write(str(tmp_path / "ckpt"))
    assert _top_level_keys(prefix) == TOP_LEVEL_KEYS  # rng is there even when empty (linear_regression)
    assert _variables(prefix) == expected


def test_the_twin_graph_writes_the_live_keys(tmp_path):
    # The async twin: other variable names (twin_epoch...), another model's auto-generated
    # layer names, the rng entry keyed by the live model's paths: the same file format.
    _, live, live_model, _ = _graph("digits_keras.py")
    _, twin_model, twin_optimizer, twin_counters = _parts("digits_keras.py", name_prefix="twin_")
    twin = ckpt_layout.training_graph(model=twin_model, optimizer=twin_optimizer, counters=twin_counters,
                                      rng=ckpt_layout.twin_rng_state(live_model, twin_model))
    assert [v.name for v in twin_counters.values()] == ["twin_epoch:0", "twin_step_in_epoch:0", "twin_global_step:0"]
    prefix = twin.write(str(tmp_path / "twin" / "ckpt"))
    assert _top_level_keys(prefix) == TOP_LEVEL_KEYS
    assert _variables(prefix) == DIGITS_KERAS


def test_restore_reads_every_part_back(tmp_path):
    _, checkpoint, model, counters = _graph("digits_keras.py")
    for variable in model.weights:
        variable.assign(variable.numpy() + 0.5)
    for value, name in enumerate(ckpt_layout.COUNTERS, 3):
        counters[name].assign(value)
    digest = weights_digest(model)
    prefix = checkpoint.write(str(tmp_path / "ckpt"))
    recipe, fresh, fresh_model, fresh_counters = _graph("digits_keras.py")
    ckpt_layout.restore(fresh, prefix, where="Checkpoint here", recipe_name=recipe.name)
    assert weights_digest(fresh_model) == digest
    assert {name: int(v.numpy()) for name, v in fresh_counters.items()} == {
        "epoch": 3, "step_in_epoch": 4, "global_step": 5}
    weights_only = _parts("digits_keras.py")[1]
    ckpt_layout.restore(ckpt_layout.weights_graph(weights_only), prefix, where="Checkpoint here",
                        recipe_name=recipe.name, partial=True)
    assert weights_digest(weights_only) == digest


def test_restore_refuses_another_models_checkpoint_naming_where_and_the_recipe(tmp_path):
    _, checkpoint, _, _ = _graph("linear_regression.py")
    prefix = checkpoint.write(str(tmp_path / "ckpt"))
    recipe, other, _, _ = _graph("digits_keras.py")
    with pytest.raises(CheckpointIncompatibleError,
                       match=r"^Checkpoint file:///x/ckpt-000000000005 does not fit recipe digits_keras's model: \S"):
        ckpt_layout.restore(other, prefix, where="Checkpoint file:///x/ckpt-000000000005", recipe_name=recipe.name)


def test_training_graph_takes_exactly_the_three_counters():
    _, model, optimizer, counters = _parts("linear_regression.py")
    del counters["step_in_epoch"]
    with pytest.raises(ValueError, match=r"Received counters \['epoch', 'global_step'\]; expected exactly "
                                         r"\['epoch', 'global_step', 'step_in_epoch'\]"):
        ckpt_layout.training_graph(model=model, optimizer=optimizer, counters=counters, rng={})


def test_rng_keys_are_the_live_paths_with_non_word_characters_as_underscores():
    _, model, _, _ = _parts("digits_keras.py")
    assert list(ckpt_layout.rng_state(model)) == ["seed_generator_seed_generator_state"]
    assert ckpt_layout.rng_key("dropout/seed_generator.state:0") == "dropout_seed_generator_state_0"
