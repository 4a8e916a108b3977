import pytest

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import check_recipe_source, load_recipe, recipe_name, resolve_params

GOOD = """
DEFAULTS = {"epochs": 2}
PARAMS = {"lr": 0.1, "name": "x", "flag": False, "n": 3}
def build_model(params): return None
def build_optimizer(params): return None
def loss(labels, predictions): return None
def dataset(input_context, epoch, seed): return None
"""


def write(tmp_path, text, name="r.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_load_good_recipe_without_tensorflow_work(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD))
    assert (recipe.name, dict(recipe.defaults), recipe.metrics) == ("r", {"epochs": 2}, None)


def test_missing_file_names_path():
    with pytest.raises(RecipeError, match=r"Recipe file 'nope/r.py' does not exist"):
        check_recipe_source("nope/r.py")


def test_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "def build_model(:\n")
    with pytest.raises(RecipeError, match=r"syntax error at line 1"):
        check_recipe_source(path)


def test_missing_function_named(tmp_path):
    path = write(tmp_path, GOOD.replace("def loss(labels, predictions): return None\n", ""))
    with pytest.raises(RecipeError, match=r"does not define loss; a recipe must define build_model, build_optimizer, loss, dataset"):
        check_recipe_source(path)


def test_import_error_is_reported_not_raised_raw(tmp_path):
    path = write(tmp_path, "import no_such_module_xyz\n" + GOOD)
    with pytest.raises(RecipeError, match=r"failed to import: ModuleNotFoundError: No module named 'no_such_module_xyz'"):
        load_recipe(path)


def test_unknown_module():
    with pytest.raises(RecipeError, match=r"Recipe module 'no.such.recipe' cannot be found"):
        check_recipe_source("no.such.recipe")


def test_bundled_recipes_pass_the_shape_check():
    for name in ("recipes/digits_cnn.py", "recipes/mnist_cnn.py", "recipes/linear_regression.py"):
        assert check_recipe_source(name).name == name.split("/")[1]
    assert recipe_name("recipes/digits_cnn.py") == "digits_cnn"
    assert recipe_name("pkg.mod_x") == "mod_x"


def test_params_are_coerced_to_default_types():
    defaults = {"lr": 0.1, "name": "x", "flag": False, "n": 3}
    assert resolve_params(defaults, {"lr": "0.5", "flag": "true", "n": "7"}) == {"lr": 0.5, "name": "x", "flag": True, "n": 7}
    with pytest.raises(RecipeError, match=r"Unknown recipe parameter 'lrr' in --set lrr=1; accepted: flag, lr, n, name"):
        resolve_params(defaults, {"lrr": "1"})
    with pytest.raises(RecipeError, match=r"Recipe parameter n='many' is not a valid int"):
        resolve_params(defaults, {"n": "many"})


def test_eval_dataset_is_optional_and_loaded(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD + "def eval_dataset(input_context, seed): return None\n"))
    assert recipe.eval_dataset is not None
    assert load_recipe(write(tmp_path, GOOD, name="plain.py")).eval_dataset is None


def test_eval_dataset_with_the_wrong_parameters_is_named(tmp_path):
    path = write(tmp_path, GOOD + "def eval_dataset(input_context, epoch, seed): return None\n")
    with pytest.raises(RecipeError, match=r"eval_dataset takes 3 positional parameter\(s\) at line 8; expected eval_dataset\(input_context, seed\)"):
        check_recipe_source(path)


def test_evaluation_asked_of_a_recipe_without_eval_dataset_is_refused_before_any_worker(tmp_path):
    path = write(tmp_path, GOOD)
    assert check_recipe_source(path, eval_every_epochs=0) == tmp_path / "r.py"
    with pytest.raises(RecipeError, match=r"Received eval_every_epochs=2 but recipe .*r\.py defines no eval_dataset"):
        check_recipe_source(path, eval_every_epochs=2)


# ------------------------------------------------------- compiled models, callbacks

COMPILED = """
import keras
def build_model(params):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse"{extra})
    return model
def dataset(input_context, epoch, seed): return None
def callbacks(params): return []
"""


def test_a_compiled_model_recipe_needs_no_optimizer_or_loss(tmp_path):
    recipe = load_recipe(write(tmp_path, COMPILED.format(extra="")))
    assert (recipe.build_optimizer, recipe.loss, recipe.metrics) == (None, None, None)
    assert callable(recipe.callbacks)
    assert check_recipe_source("recipes/digits_keras.py").name == "digits_keras.py"


def test_without_compile_build_optimizer_and_loss_are_still_required(tmp_path):
    path = write(tmp_path, COMPILED.format(extra="").replace("model.compile(", "model.configure("))
    with pytest.raises(RecipeError, match=r"does not define build_optimizer, loss; .* may come from model.compile\(\)"):
        check_recipe_source(path)


def test_a_build_model_taken_from_another_module_may_compile_there(tmp_path):
    """A twin recipe re-exports a compiled recipe's build_model; its source has no compile()."""
    write(tmp_path, COMPILED.format(extra=""), name="base.py")
    twin = "from base import build_model, dataset\n"
    assert check_recipe_source(write(tmp_path, twin, name="twin.py")).name == "twin.py"
    assert check_recipe_source(write(tmp_path, "import base\nbuild_model = base.build_model\n"
                                               "dataset = base.dataset\n", name="twin2.py")).name == "twin2.py"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (", run_eagerly=True", r"compile\(run_eagerly=True\) at line 5 is not supported: the runner compiles its own step"),
        (", jit_compile=True", r"compile\(jit_compile=True\) at line 5 is not supported"),
        (", steps_per_execution=8", r"compile\(steps_per_execution=8\) at line 5 is not supported; use resilient-train's --steps-per-execution"),
        (", metrics=['f1_score']", r"compile\(metrics=...\) at line 5 uses 'f1_score', whose result is one number per "
                                   r"class"),
        (", loss_weights=[1.0, 2.0], weighted_metrics=['mae']",
         r"compile\(weighted_metrics=\.\.\.\) at line 5 with several losses is not supported"),
    ],
)
def test_compile_arguments_the_runner_cannot_honour_are_refused_before_workers(tmp_path, extra, message):
    with pytest.raises(RecipeError, match=message):
        check_recipe_source(write(tmp_path, COMPILED.format(extra=extra)))


def test_compile_arguments_the_runner_accepts_pass(tmp_path):
    path = write(tmp_path, COMPILED.format(extra=", run_eagerly=False, jit_compile='auto', steps_per_execution=1"))
    assert check_recipe_source(path).name == "r.py"


def test_a_train_step_override_runs_and_another_override_without_it_is_refused_before_workers(tmp_path):
    text = COMPILED.format(extra="") + "class Mine(keras.Model):\n    def train_step(self, data):\n        return {}\n"
    assert check_recipe_source(write(tmp_path, text)).name == "r.py"  # the runner runs it (own_step.py)
    text = COMPILED.format(extra="") + "class Mine(keras.Model):\n    def compute_loss(self, *a):\n        return 0\n"
    with pytest.raises(RecipeError, match=r"^Recipe .*r.py: class Mine overrides compute_loss at line 10 but not "
                                          r"train_step; the runner runs Keras' step or the model's own train_step"):
        check_recipe_source(write(tmp_path, text))


def test_backup_and_restore_is_refused_with_the_reason(tmp_path):
    text = COMPILED.format(extra="").replace("return []", "return [keras.callbacks.BackupAndRestore('/tmp/b')]")
    with pytest.raises(RecipeError, match=r"uses BackupAndRestore at line 8; remove it: resilient-train already backs up"):
        check_recipe_source(write(tmp_path, text))


def test_callbacks_with_the_wrong_parameters_is_named(tmp_path):
    text = COMPILED.format(extra="").replace("def callbacks(params)", "def callbacks()")
    with pytest.raises(RecipeError, match=r"callbacks takes 0 positional parameter\(s\) at line 8; expected callbacks\(params\)"):
        check_recipe_source(write(tmp_path, text))


INDEXED = GOOD.replace("def dataset(input_context, epoch, seed): return None\n",
                       "def num_examples(params): return 10\ndef example(index, params): return None\n")


def test_indexed_recipe_loads_without_dataset(tmp_path):
    recipe = load_recipe(write(tmp_path, INDEXED))
    assert (recipe.indexed, recipe.dataset, recipe.num_examples({}), recipe.augment) == (True, None, 10, None)
    assert load_recipe(write(tmp_path, GOOD, name="g.py")).indexed is False


def test_both_input_contracts_are_refused(tmp_path):
    path = write(tmp_path, INDEXED + "def dataset(input_context, epoch, seed): return None\n")
    with pytest.raises(RecipeError, match=r"defines both dataset and num_examples, example; define one input contract"):
        check_recipe_source(path)


def test_half_an_indexed_contract_names_the_missing_function(tmp_path):
    path = write(tmp_path, INDEXED.replace("def num_examples(params): return 10\n", ""))
    with pytest.raises(RecipeError, match=r"does not define num_examples; a recipe's input is dataset"):
        check_recipe_source(path)


def test_example_with_wrong_parameters_is_refused(tmp_path):
    path = write(tmp_path, INDEXED.replace("def example(index, params)", "def example(index)"))
    with pytest.raises(RecipeError, match=r"example takes 1 positional parameter\(s\) at line \d+; expected example\(index, params\)"):
        check_recipe_source(path)


def test_record_indices_needs_the_indexed_contract(tmp_path):
    with pytest.raises(RecipeError, match=r"Received --record-indices but recipe .* defines dataset"):
        check_recipe_source(write(tmp_path, GOOD), record_indices=True)
    check_recipe_source(write(tmp_path, INDEXED, name="i.py"), record_indices=True)
