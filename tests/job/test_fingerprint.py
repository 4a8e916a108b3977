"""The job fingerprint: a re-run that changed what the weights depend on
stops with exit 2 naming the change; more epochs is allowed and reported."""

import json
from pathlib import Path

import pytest

from resilient_train.job.config import JobConfig
from resilient_train.errors import ConfigError
from resilient_train.job.fingerprint import (
    FINGERPRINT_FILE,
    check_and_record,
    compare,
    fingerprint_for_supervisor,
    fingerprint_for_worker,
)
from resilient_train.job.recipe import load_recipe, resolve_params

RECIPE = "recipes/linear_regression.py"


def job(tmp_path: Path, **values) -> JobConfig:
    return JobConfig(recipe=values.pop("recipe", RECIPE), run_dir=str(tmp_path / "run"), **values)


COMMITTED = {"completed": False}  # a committed checkpoint's extra (from before fingerprints)


def guard(tmp_path, *, accept=False, extra=COMMITTED, **values):
    return check_and_record(tmp_path / "run", fingerprint_for_supervisor(job(tmp_path, **values)), extra,
                            accept_changes=accept)


def test_the_supervisor_and_the_worker_compute_the_same_fingerprint(tmp_path):
    config = job(tmp_path, params={"learning_rate": "0.1"}, seed=3)
    recipe = load_recipe(RECIPE)
    on_worker = fingerprint_for_worker(config.with_recipe_defaults(recipe.defaults), recipe.source,
                                       resolve_params(recipe.params, config.params))
    assert fingerprint_for_supervisor(config) == on_worker
    assert on_worker.params == {"fail_at_step": -1, "learning_rate": 0.1}
    assert (on_worker.epochs, on_worker.steps_per_epoch, on_worker.global_batch_size) == (3, 10, 4)


def test_first_run_records_and_an_unchanged_rerun_passes(tmp_path):
    assert guard(tmp_path, seed=1) is None
    recorded = json.loads((tmp_path / "run" / FINGERPRINT_FILE).read_text())
    assert recorded["seed"] == 1 and recorded["workers"] == 2
    assert guard(tmp_path, seed=1) is None


def test_changed_seed_and_param_exit_2_listing_both(tmp_path):
    guard(tmp_path, seed=1)
    with pytest.raises(ConfigError) as raised:
        guard(tmp_path, seed=2, params={"learning_rate": "0.5"})
    assert str(raised.value) == (
        f"{tmp_path / 'run'} holds a job with other settings (params.learning_rate 0.05 -> 0.5, seed 1 -> 2). "
        "To start a new run, pass a new --run-dir (and --storage if set); to continue this one as changed, "
        "add --accept-changes"
    )


def test_a_changed_strategy_is_a_change_and_an_old_fingerprint_without_one_is_not(tmp_path):
    guard(tmp_path)
    with pytest.raises(ConfigError) as raised:
        guard(tmp_path, strategy="parameter-server")
    assert "(strategy 'mirrored' -> 'parameter-server')" in str(raised.value)
    recorded = json.loads((tmp_path / "run" / FINGERPRINT_FILE).read_text())
    del recorded["strategy"]  # written before strategies were recorded
    (tmp_path / "run" / FINGERPRINT_FILE).write_text(json.dumps(recorded))
    assert guard(tmp_path, strategy="parameter-server") is None


def test_an_edited_recipe_is_a_change(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text(Path(RECIPE).read_text())
    guard(tmp_path, recipe=str(recipe))
    recipe.write_text(Path(RECIPE).read_text() + "\n# tweak\n")
    with pytest.raises(ConfigError, match=r"\(recipe source edited\)"):
        guard(tmp_path, recipe=str(recipe))


def test_more_epochs_is_allowed_and_reported_fewer_is_not(tmp_path):
    guard(tmp_path, epochs=3)
    assert guard(tmp_path, epochs=5) == {"changes": {"epochs": {"was": 3, "now": 5}}, "accepted": "more epochs"}
    with pytest.raises(ConfigError, match=r"epochs 5 -> 2"):
        guard(tmp_path, epochs=2)


def test_accept_changes_records_the_new_job(tmp_path):
    guard(tmp_path, seed=1)
    assert guard(tmp_path, seed=2, accept=True) == {"changes": {"seed": {"was": 1, "now": 2}},
                                                     "accepted": "--accept-changes"}
    assert guard(tmp_path, seed=2) is None


def test_a_new_run_dir_on_old_storage_is_checked_against_the_manifest(tmp_path):
    recipe = load_recipe(RECIPE)
    old = fingerprint_for_worker(job(tmp_path, seed=7).with_recipe_defaults(recipe.defaults), recipe.source,
                                 resolve_params(recipe.params, {}))
    with pytest.raises(ConfigError, match=r"seed 7 -> 0"):
        guard(tmp_path, extra={"fingerprint": old.to_dict()})


def test_before_anything_is_committed_a_change_is_recorded_not_refused(tmp_path):
    guard(tmp_path, seed=1, extra=None)
    assert guard(tmp_path, seed=2, extra=None) == {"changes": {"seed": {"was": 1, "now": 2}},
                                                   "accepted": "no checkpoint committed yet"}
    with pytest.raises(ConfigError, match=r"seed 2 -> 3"):
        guard(tmp_path, seed=3)


def test_unknown_fields_are_never_changes(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("D = 3\nDEFAULTS = {'epochs': D}\ndef build_model(p): ...\ndef build_optimizer(p): ...\n"
                      "def loss(y, p): ...\ndef dataset(c, e, s): ...\n")
    computed = fingerprint_for_supervisor(job(tmp_path, recipe=str(recipe)))
    assert computed.epochs is None and computed.params == {}
    known = computed.__class__(**{**computed.to_dict(), "epochs": 3})
    assert compare(known, computed) == []


def test_force_storage_accepts_the_storage_job_as_changed(tmp_path):
    from resilient_train.job.fingerprint import guard_job

    recipe = load_recipe(RECIPE)
    old = fingerprint_for_worker(job(tmp_path, seed=7).with_recipe_defaults(recipe.defaults), recipe.source,
                                 resolve_params(recipe.params, {}))
    event = guard_job(job(tmp_path, force_storage=True), {"fingerprint": old.to_dict()}, accept_changes=False)
    assert event == {"changes": {"seed": {"was": 7, "now": 0}}, "accepted": "--force-storage"}
