"""A model.fit script is told apart from a recipe, and what it cannot get is refused, before workers start."""

import re

import pytest

from resilient_train.errors import ConfigError, RecipeError
from resilient_train.job.config import JobConfig
from resilient_train.job.preflight import literal_recipe_dicts, preflight
from resilient_train.job.recipe import check_recipe_source, is_fit_script

SCRIPT = """
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
dataset = make_dataset().repeat().batch(64)
with strategy.scope():
    model = build_and_compile()
history = model.fit(dataset, epochs=3, steps_per_epoch=70, callbacks=[tf.keras.callbacks.CSVLogger("log.csv")])
model.save("model.keras")
"""


def write(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(tmp_path, text):
    with pytest.raises(RecipeError) as caught:
        check_recipe_source(write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message  # one line
    return message


def test_the_tutorial_and_the_test_script_are_fit_scripts_and_pass():
    for path in ("examples/keras_tutorial.py", "tests/recipes/fit_script.py"):
        assert is_fit_script(path)
        assert check_recipe_source(path).name == path.rsplit("/", 1)[1]


def test_a_script_with_a_dataset_variable_is_a_script(tmp_path):
    path = write(tmp_path, SCRIPT)
    assert is_fit_script(path)
    assert check_recipe_source(path).name == "train.py"


def test_recipes_are_not_fit_scripts(tmp_path):
    assert not is_fit_script("recipes/digits_keras.py")
    assert not is_fit_script("recipes/digits_cnn.py")
    assert not is_fit_script("recipes/digits_indexed.py")
    # a recipe whose docstring or helper mentions .fit( stays a recipe: it defines dataset()
    path = write(tmp_path, "def build_model(p): pass\ndef dataset(c, e, s): pass\ndef other(m): m.fit(x)\n")
    assert not is_fit_script(path)


def test_a_file_without_fit_and_recipe_functions_is_a_recipe_missing_functions(tmp_path):
    message = refused(tmp_path, "import tensorflow as tf\nmodel = tf.keras.Sequential()\n")
    assert "does not define build_model, build_optimizer, loss, dataset" in message


@pytest.mark.parametrize("call, expected", [
    ("model.fit(dataset, epochs=3)",
     r"fit\(\) at line 7 has no steps_per_epoch; pass fit\(dataset, epochs=..., steps_per_epoch=N\)"),
    ("model.fit(x_train, y_train, 64, epochs=3)",
     r"fit\(\) at line 7 gets 3 positional arguments; expected fit\(x, y, batch_size=..., ...\) or fit\(dataset, ...\)"),
    ("model.fit(x_train, y_train, epochs=3, steps_per_epoch=5)",
     r"fit\(steps_per_epoch=...\) at line 7: not supported with arrays yet: an epoch is the arrays once over"),
    ("model.fit(x=x_train, y=y_train, validation_freq=[1, 3])",
     r"fit\(validation_freq=\[...\]\) at line 7: a list is not supported yet; pass an int N"),
    ("model.fit(x_train, y_train, shuffle='batch')", r"fit\(shuffle='batch'\) at line 7: not supported"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, validation_split=0.2)",
     r"fit\(validation_split=...\) at line 7: Keras splits arrays, not a dataset"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, batch_size=64)",
     r"fit\(batch_size=...\) at line 7: batch the tf.data.Dataset instead"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, class_weight={0: 1.0})",
     r"fit\(class_weight=...\) at line 7: not supported with a dataset yet"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, sample_weight=w)",
     r"fit\(sample_weight=...\) at line 7: Keras takes it with arrays only: yield \(x, y, sample_weight\)"),
    ("model.fit(x_train, y_train, sample_weight=w, class_weight={0: 2.0})",
     r"fit\(sample_weight=..., class_weight=...\) at line 7: Keras refuses both at once"),
    ("model.fit(x_train, y_train, sample_weight=w, validation_split=0.2)",
     r"fit\(sample_weight=..., validation_split=...\) at line 7: not supported yet: Keras weighs the held-out loss"),
    ("model.compile(optimizer='sgd', loss={'a': 'mse', 'b': 'mae'})\nmodel.fit(x_train, y_train, sample_weight=w)",
     r"fit\(sample_weight=...\) at line 8 for the model compiled with several losses at line 7: not supported yet "
     r"with several outputs"),
    ("model.compile(optimizer='sgd', loss='mse', loss_weights=[1, 2])\nmodel.fit(x_train, y_train, class_weight=c)",
     r"fit\(class_weight=...\) at line 8 for the model compiled with several losses at line 7: Keras supports "
     r"class_weight only for a model with a single output"),
    ("model.compile(optimizer='sgd', loss='bce', metrics=['accuracy', tf.keras.metrics.F1Score(name='f1')])\n"
     "model.fit(x_train, y_train)",
     r"compile\(metrics=...\) at line 7 uses F1Score\(\), whose result is one number per class: not supported "
     r"\(a log, a CSV column and a callback's monitor need one number\): pass average='macro'"),
    ("model.compile(optimizer='sgd', loss='bce', metrics={'risk': ['f1_score']})\nmodel.fit(x_train, y_train)",
     r"compile\(metrics=...\) at line 7 uses 'f1_score', whose result is one number per class"),
    ("model.compile(optimizer='sgd', loss='bce', metrics=[tf.keras.metrics.Recall(thresholds=[0.3, 0.6])])\n"
     "model.fit(x_train, y_train)",
     r"compile\(metrics=...\) at line 7 uses Recall\(\), whose result is one number per threshold"),
    ("model.compile(optimizer='sgd', loss=['mse', 'mae'], weighted_metrics=['mae'])\nmodel.fit(x_train, y_train)",
     r"compile\(weighted_metrics=...\) at line 7 with several losses is not supported: not yet with several outputs"),
    ("model.compile(optimizer='sgd', loss='bce', weighted_metrics=['f1_score'])\nmodel.fit(x_train, y_train)",
     r"compile\(metrics=...\) at line 7 uses 'f1_score', whose result is one number per class"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, initial_epoch=1)",
     r"fit\(initial_epoch=...\) at line 7: the runner resumes at the right epoch itself"),
    ("model.fit(dataset, **kwargs)", r"fit\(\*\*...\) at line 7; pass fit's arguments by name"),
    ("model.fit(dataset, epochs=1, steps_per_epoch=5)\nmodel.fit(dataset, epochs=1, steps_per_epoch=5)",
     r"calls fit\(\) 2 times \(lines 7, 8\); one fit\(\) call is supported"),
    ("for i in range(2):\n    model.fit(dataset, epochs=1, steps_per_epoch=5)",
     r"calls fit\(\) inside a loop \(line 8\); one fit\(\) call is supported"),
    ("model.fit(dataset, epochs=3, steps_per_epoch=5, callbacks=[tf.keras.callbacks.BackupAndRestore('b')])",
     r"the fit\(\) call at line 7 uses BackupAndRestore at line 7; remove it: resilient-train already backs up"),
    ("cb = tf.keras.callbacks.ProgbarLogger()\nmodel.fit(dataset, epochs=3, steps_per_epoch=5, callbacks=[cb])",
     r"^Script .*train.py: the fit\(\) call at line 8 uses ProgbarLogger at line 7; not supported yet: the runner "
     r"reports progress as events \(remove it\)$"),
])
def test_fit_calls_the_runner_cannot_honour_are_refused_in_one_line(tmp_path, call, expected):
    head = SCRIPT.split("history = ")[0]
    assert head.count("\n") == 6  # the fit call is on line 7
    message = refused(tmp_path, head + call + "\n")
    assert str(tmp_path / "train.py") in message  # names the file
    assert re.search(expected, message), message


@pytest.mark.parametrize("call", [
    "model.fit(x_train, y_train, batch_size=64, epochs=3, shuffle=True, validation_data=(x_val, y_val))",
    "model.fit(x={'a': xa, 'b': xb}, y=y_train, epochs=3, validation_split=0.2, validation_freq=2)",
    "model.fit(dataset, epochs=3, steps_per_epoch=5, validation_data=val, validation_steps=4)",
    "model.fit(x_train, y_train, batch_size=64, sample_weight=w, validation_data=(x_val, y_val))",
    "model.fit(x_train, y_train, class_weight={0: 1.0, 1: 3.0}, validation_split=0.2)",
    "model.compile(optimizer='sgd', loss={'risk': 'bce', 'prog': 'mse'}, loss_weights={'risk': 1.0, 'prog': 0.2},\n"
    "              metrics={'risk': ['accuracy'], 'prog': ['mae']})\n"
    "model.fit({'a': xa, 'b': xb}, {'risk': yr, 'prog': yp}, batch_size=64, validation_split=0.2)",
    "model.compile(optimizer='sgd', loss='bce', metrics=['auc', 'precision', tf.keras.metrics.Recall(thresholds=0.3),\n"
    "              tf.keras.metrics.F1Score(average='macro'), tf.keras.metrics.MeanIoU(num_classes=2)])\n"
    "model.fit(x_train, y_train, batch_size=64)",
    "model.compile(optimizer='sgd', loss='bce', metrics=['accuracy'], weighted_metrics=['accuracy', 'auc'])\n"
    "model.fit(x_train, y_train, batch_size=64, class_weight={0: 1.0, 1: 3.0})",
])
def test_fit_on_arrays_and_with_validation_passes_the_source_check(tmp_path, call):
    head = SCRIPT.split("history = ")[0]
    check_recipe_source(write(tmp_path, head + call + "\n"))  # no RecipeError


def test_a_script_compile_argument_the_runner_cannot_honour_is_refused(tmp_path):
    message = refused(tmp_path, SCRIPT + "model.compile(optimizer='sgd', loss='mse', run_eagerly=True)\n")
    assert "compile(run_eagerly=True) at line 9 is not supported" in message


def test_size_flags_are_refused_for_a_script_whose_fit_sets_them(tmp_path):
    path = write(tmp_path, SCRIPT)
    for flag, value in (("epochs", 5), ("steps_per_epoch", 10), ("global_batch_size", 64)):
        job = JobConfig(recipe=path, run_dir=str(tmp_path / "run"), workers=2, **{flag: value})
        with pytest.raises(ConfigError, match=rf"--{flag.replace('_', '-')} {value} with the fit\(\) script .*train.py: "
                                              r"the script's fit\(\) call and its dataset's batch set it"):
            preflight(job)
    with pytest.raises(ConfigError, match=r"--record-indices with the fit\(\) script .*train.py: it needs the indexed"):
        preflight(JobConfig(recipe=path, run_dir=str(tmp_path / "run"), workers=2, record_indices=True))
    with pytest.raises(ConfigError, match=r"--workers 1:2 with the fit\(\) script .*train.py: a script's batch"):
        preflight(JobConfig(recipe=path, run_dir=str(tmp_path / "run"), workers="1:2"))
    preflight(JobConfig(recipe=path, run_dir=str(tmp_path / "run"), workers=2))  # no flags: fine


def test_a_script_has_no_literal_defaults(tmp_path):
    from pathlib import Path

    assert literal_recipe_dicts(Path(write(tmp_path, SCRIPT))) == {"DEFAULTS": None, "PARAMS": {}}


def test_load_recipe_refuses_a_fit_script_without_running_it(tmp_path):
    from resilient_train.job.recipe import load_recipe

    marker = tmp_path / "ran"
    path = write(tmp_path, f"open({str(marker)!r}, 'w').close()\n" + SCRIPT)
    with pytest.raises(RecipeError, match=r"train.py is a model.fit script, not a recipe: `resilient-train run` runs it"):
        load_recipe(path)
    assert not marker.exists()
