"""One worker's save and restore (runner/state/saving.py), alone: one worker, async twin, a
local store. A save commits the step once with what the epoch adds to its manifest, a second
save of the same step commits nothing, and a fresh graph restores the committed step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from resilient_train.checkpoint import CheckpointStore, Manifest  # noqa: E402
from resilient_train.cluster.tf_config import ClusterInfo  # noqa: E402
from resilient_train.job.config import JobConfig  # noqa: E402
from resilient_train.job.recipe import load_recipe  # noqa: E402
from resilient_train.rundir.stepmarker import PhaseMarker  # noqa: E402
from resilient_train.runner.failures.faults import FaultPlan  # noqa: E402
from resilient_train.runner.input.determinism import InputCheck  # noqa: E402
from resilient_train.runner.state import ckpt_layout  # noqa: E402
from resilient_train.runner.state.model_state import weights_digest  # noqa: E402
from resilient_train.runner.state.saving import Saving  # noqa: E402

RECIPE = load_recipe(str(Path(__file__).resolve().parents[3] / "recipes" / "digits_cnn.py"))
PARAMS = dict(RECIPE.params)
CLUSTER = ClusterInfo(num_workers=1, rank=0, task_type="worker", task_index=0)


class _Input:
    """The epoch input's save-side seam: nothing of the input to record."""

    captured = True

    def state_to_save(self, epoch: int, step_in_epoch: int, *, files_everywhere: bool = False,
                      capture: bool = True) -> tuple[dict[str, bytes], dict[str, Any]]:
        return {}, {}

    def plan_reentry(self, manifest: Manifest, checkpoint_dir: Path) -> tuple[str, str]:
        return "skip", "test"


def _graph() -> tuple[tf.train.Checkpoint, keras.Model]:
    model = RECIPE.build_model(PARAMS)
    optimizer = RECIPE.build_optimizer(PARAMS)
    optimizer.build(model.trainable_variables)
    return ckpt_layout.training_graph(model=model, optimizer=optimizer, counters=ckpt_layout.new_counters(),
                                      rng=ckpt_layout.rng_state(model)), model


def _saving(tmp_path: Path, saved: list[int]) -> tuple[Saving, tf.train.Checkpoint, keras.Model]:
    checkpoint, model = _graph()

    def build_twin() -> tuple[tf.train.Checkpoint, keras.Model]:
        twin_model = RECIPE.build_model(PARAMS)
        optimizer = RECIPE.build_optimizer(PARAMS)
        optimizer.build(twin_model.trainable_variables)
        return ckpt_layout.training_graph(model=twin_model, optimizer=optimizer,
                                          counters=ckpt_layout.new_counters(name_prefix="twin_"),
                                          rng=ckpt_layout.twin_rng_state(model, twin_model)), twin_model

    job = JobConfig(recipe="recipes/digits_cnn.py", snapshot_every="off", epochs=2, steps_per_epoch=10)
    saving = Saving(
        job, CLUSTER, store=CheckpointStore(str(tmp_path / "store")), run_id="r1", work_dir=tmp_path / "work",
        faults=FaultPlan([], rank=0, attempt=1), checkpoint=checkpoint, model=model,
        strategy=tf.distribute.get_strategy(),
        counters=(checkpoint.epoch, checkpoint.step_in_epoch, checkpoint.global_step), tier=None, tier_off="off",
        phase=PhaseMarker(None), build_twin=build_twin, sum_over_workers=lambda value: value,
        gather=lambda value: [value], concat_over_workers=lambda value: value, recipe=RECIPE, input_check=InputCheck(recipe_name=RECIPE.name),
        fingerprint={"seed": 7}, epoch_extra=lambda step: {"epoch_sums": {"loss": float(step)}},
        stopped_early=lambda: False, saved=lambda: saved.append(int(checkpoint.global_step.numpy())))
    saving.wire(callbacks=None, epoch_input=_Input())  # type: ignore[arg-type]
    return saving, checkpoint, model


def test_a_save_commits_its_step_once_and_a_fresh_graph_restores_it(tmp_path):
    keras.backend.clear_session()  # as a new worker process: earlier tests' layers named its seed generators
    keras.utils.set_random_seed(3)
    saved: list[int] = []
    saving, checkpoint, model = _saving(tmp_path, saved)
    assert saving.restore_or_start() is None  # an empty store: a fresh start
    checkpoint.global_step.assign(3)
    checkpoint.step_in_epoch.assign(3)
    model.trainable_variables[0].assign_add(tf.ones_like(model.trainable_variables[0]))
    manifest = saving.save(flush=True)
    assert manifest is not None and manifest.global_step == 3
    assert manifest.weights_sha256 == weights_digest(model)
    assert manifest.extra["epoch_sums"] == {"loss": 3.0}  # what the epoch adds, asked at the save
    assert (manifest.extra["completed"], manifest.extra["recipe"], manifest.extra["fingerprint"]) == (
        False, "digits_cnn", {"seed": 7})
    saving.save(flush=True)  # the same step again: nothing new is committed
    assert [info.global_step for info in saving._store.verify()] == [3]
    assert saved == [3, 3]  # every agreed save is reported, committed or not

    keras.backend.clear_session()
    keras.utils.set_random_seed(4)
    fresh, fresh_checkpoint, fresh_model = _saving(tmp_path, [])
    restored = fresh.restore_or_start()
    assert restored is not None and restored.manifest.global_step == 3 and restored.callback_state is None
    assert int(fresh_checkpoint.global_step.numpy()) == 3
    assert weights_digest(fresh_model) == manifest.weights_sha256
    assert all(np.array_equal(a, b) for a, b in zip(fresh_model.get_weights(), model.get_weights(), strict=True))
