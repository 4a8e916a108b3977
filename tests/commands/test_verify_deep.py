"""``verify --deep``: a checkpoint restored into the recipe's model and optimizer, in-process.

The checkpoint is written the way a worker writes one (the same object graph, built by
commands/export.py ``training_checkpoint``, whose keys tests/integration/test_diff_and_deep.py
checks against a real run) and committed with its real weights digest.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from resilient_train.checkpoint import CheckpointStore
from resilient_train.checkpoint.manifest import MANIFEST_NAME
from resilient_train.commands.export import training_checkpoint
from resilient_train.commands.verify import DeepOptions, Slot, compare_layouts, verify_command
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from resilient_train.job.recipe import load_recipe
from resilient_train.runner.state.model_state import weights_digest

from tests.integration.harness import REPO, recipe_variant
from tests.support.storage import Backend

RECIPE = str(REPO / "recipes" / "linear_regression.py")
EXTRA_LAYER = ("keras.layers.Dense(1)])", "keras.layers.Dense(3), keras.layers.Dense(1)])")


def test_compare_layouts_by_key():
    expected = {"a": Slot("a", "m/a", (2, 1), "float32"), "b": Slot("b", "m/b", (1,), "float32"),
                "c": Slot("c", "m/c", (), "int64")}
    found = {"a": Slot("a", "a", (2, 3), "float32"), "c": Slot("c", "c", (), "int64"), "d": Slot("d", "d", (4,), "float32")}
    result = compare_layouts(expected, found)
    assert [s.name for s in result["missing"]] == ["m/b"]
    assert [s.key for s in result["unexpected"]] == ["d"]
    assert [(e.name, e.shape, f.shape) for e, f in result["mismatched"]] == [("m/a", (2, 1), (2, 3))]


def commit_real_checkpoint(tmp_path: Path, *, global_step: int = 5, store: CheckpointStore | None = None) -> CheckpointStore:
    """A checkpoint of linear_regression's training state (weights moved off their init)."""
    recipe = load_recipe(RECIPE)
    checkpoint, model, counters = training_checkpoint(recipe, recipe.params)
    for variable in model.weights:
        variable.assign(variable.numpy() + 0.25)
    counters["epoch"].assign(0)
    counters["step_in_epoch"].assign(global_step)
    counters["global_step"].assign(global_step)
    local = tmp_path / "stage"
    local.mkdir(parents=True)
    checkpoint.write(str(local / "ckpt"))
    store = store or CheckpointStore(str(tmp_path / "store"))
    store.commit(local, run_id="r", epoch=0, step_in_epoch=global_step, global_step=global_step, world_size=1,
                 weights_sha256=weights_digest(model), tf_version="2", extra={
                     "recipe_source": RECIPE,
                     "fingerprint": {"recipe_sha256": "0" * 64, "params": dict(recipe.params), "seed": 1,
                                     "epochs": 1, "steps_per_epoch": 10, "global_batch_size": 4, "workers": 1}})
    return store


def deep(store: CheckpointStore, storage_options: dict | None = None, **options) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_command(store.url, storage_options or {}, as_json=True, hash=True, out=out, err=err, deep=DeepOptions(**options))
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_a_consistent_checkpoint_restores_with_the_recorded_recipe(tmp_path, backend: Backend):
    store = commit_real_checkpoint(tmp_path, store=backend.store())
    code, record, err = deep(store, backend.options)
    assert (code, err) == (EXIT_OK, "")
    report = record["deep"]
    assert report["recipe"] == RECIPE and report["recipe_changed"] is True  # the fingerprint's sha256 is made up
    [result] = report["checkpoints"]
    assert (result["global_step"], result["consistent"], result["missing"], result["mismatched"]) == (5, True, [], [])
    assert result["counters"] == {name: {"manifest": value, "restored": value}
                                  for name, value in (("epoch", 0), ("step_in_epoch", 5), ("global_step", 5))}
    assert result["weights_sha256"]["restored"] == result["weights_sha256"]["manifest"]


def test_a_recipe_with_an_extra_layer_is_reported_variable_by_variable(tmp_path):
    store = commit_real_checkpoint(tmp_path)
    variant = recipe_variant(tmp_path, "linear_extra", *EXTRA_LAYER)
    out = io.StringIO()
    code = verify_command(store.url, {}, as_json=False, hash=True, out=out, deep=DeepOptions(recipe=variant))
    assert code == EXIT_FAILURE
    lines = out.getvalue().splitlines()
    start = lines.index("global_step 5: inconsistent")
    assert lines[start + 1:] == [
        "  missing variable sequential/dense_1/kernel (optimizer/_trainable_variables/2): expected (3, 1) float32",
        "  missing variable sequential/dense_1/bias (optimizer/_trainable_variables/3): expected (1,) float32",
        "  missing variable adagrad/sequential_dense_1_kernel_accumulator (optimizer/_variables/4): expected (3, 1) float32",
        "  missing variable adagrad/sequential_dense_1_bias_accumulator (optimizer/_variables/5): expected (1,) float32",
        "  mismatched variable sequential/dense/kernel (optimizer/_trainable_variables/0): expected (2, 3) float32, "
        "found (2, 1) float32",
        "  mismatched variable sequential/dense/bias (optimizer/_trainable_variables/1): expected (3,) float32, "
        "found (1,) float32",
        "  mismatched variable adagrad/sequential_dense_kernel_accumulator (optimizer/_variables/2): expected (2, 3) "
        "float32, found (2, 1) float32",
        "  mismatched variable adagrad/sequential_dense_bias_accumulator (optimizer/_variables/3): expected (3,) "
        "float32, found (1,) float32",
        "  not restored: the variables above do not fit the recipe's model and optimizer",
        "1 checkpoint failed the deep check",
    ]


def test_an_edited_weights_digest_is_reported(tmp_path):
    store = commit_real_checkpoint(tmp_path)
    path = Path(store.root) / "ckpt-000000000005" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    recorded = manifest["weights_sha256"]
    manifest["weights_sha256"] = "e" * 64
    path.write_text(json.dumps(manifest))
    out = io.StringIO()
    code = verify_command(store.url, {}, as_json=False, hash=True, out=out, deep=DeepOptions())
    assert code == EXIT_FAILURE
    lines = out.getvalue().splitlines()
    assert lines[lines.index("global_step 5: inconsistent") + 1:] == [
        f"  weights_sha256: manifest {'e' * 12}, restored {recorded[:12]}",
        "1 checkpoint failed the deep check",
    ]


def test_no_recipe_recorded_and_none_given_is_a_usage_error(tmp_path):
    store = commit_real_checkpoint(tmp_path)
    path = Path(store.root) / "ckpt-000000000005" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    del manifest["extra"]["recipe_source"]
    path.write_text(json.dumps(manifest))
    code, record, err = deep(store)
    assert (code, record) == (EXIT_USAGE, {})
    assert err == ("error: the manifest of global step 5 records no recipe file (written before recipe_source "
                   "was recorded); pass --recipe\n")


@pytest.mark.parametrize("argv", [["verify", "x", "--all"], ["verify", "x", "--recipe", "r.py"],
                                  ["verify", "x", "--newest", "2"]])
def test_deep_options_without_deep_are_a_usage_error(argv, capsys):
    from resilient_train.cli import main

    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err == "resilient-train verify: --all, --newest, --recipe and --set need --deep\n"


def test_newest_n_restores_the_n_newest(tmp_path):
    store = commit_real_checkpoint(tmp_path, global_step=5)
    commit_real_checkpoint(tmp_path / "second", global_step=10, store=store)
    commit_real_checkpoint(tmp_path / "third", global_step=15, store=store)
    for options, steps in (({}, [15]), ({"newest": 2}, [10, 15]), ({"all": True}, [5, 10, 15])):
        code, record, _ = deep(store, **options)
        assert (code, [c["global_step"] for c in record["deep"]["checkpoints"]]) == (EXIT_OK, steps)
    with pytest.raises(ValueError, match=r"Received newest=0; expected an int >= 1"):
        DeepOptions(newest=0)


def test_a_recipes_gan_lays_out_its_own_optimizers_and_trackers_as_a_worker_saves_them():
    # keras.io's GAN as a recipe (its own train_step, compile(d_optimizer=..., g_optimizer=...)):
    # the worker builds both optimizers before its restore and saves its trackers under
    # "metrics" (runner/training/loop.py); the deep check's graph must hold the same keys, or
    # every such checkpoint reads as "unexpected variable" (tests/integration/test_own_train_step.py
    # restores real ones).
    from resilient_train.commands.verify import expected_layout

    recipe = load_recipe(str(REPO / "tests" / "recipes" / "gan_recipe.py"))
    checkpoint, model, _ = training_checkpoint(recipe, recipe.params)
    keys = expected_layout(checkpoint)
    optimizers = {k.split("/")[1] for k in keys if k.startswith("model/") and k.split("/")[1].endswith("_optimizer")}
    assert optimizers == {"d_optimizer", "g_optimizer"}
    assert model.d_optimizer.built and model.g_optimizer.built
    assert sorted(k.split("/")[1] for k in keys if k.startswith("metrics/")) == [
        "d_loss_count", "d_loss_total", "g_loss_count", "g_loss_total"]


def test_a_fit_scripts_run_is_rebuilt_from_the_script_and_takes_no_set():
    from types import SimpleNamespace

    from resilient_train.commands.verify import _recipe_for
    from resilient_train.errors import ConfigError

    script = str(REPO / "tests" / "recipes" / "fit_gan.py")
    manifest = SimpleNamespace(global_step=5, extra={"recipe_source": script,
                                                     "fingerprint": {"seed": 3, "recipe_sha256": "a" * 64}})
    recipe, params, sha = _recipe_for(DeepOptions(), manifest)
    assert (recipe.name, recipe.source, params, sha) == ("fit_gan", script, {}, "a" * 64)
    assert recipe.dataset is None and recipe.build_optimizer is None  # the script's compile() decides
    with pytest.raises(ConfigError, match=r"^--set lr with the fit\(\) script .*fit_gan.py: a script has no parameters$"):
        _recipe_for(DeepOptions(overrides={"lr": "0.1"}), manifest)
