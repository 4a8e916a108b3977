"""Sharded saves, in process: the files TensorFlow writes with ``BalancedShares`` are one
standard checkpoint, and two persists (rank 1, then the chief) commit it.

No worker processes: both "workers" persist the same twin here, as two MWMS replicas hold
the same state. The real 2-worker run (kill -9, exact resume) is
tests/integration/test_sharded_save.py; the store's side, tests/checkpoint/test_shares.py.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.checkpoint.shares import SHARDED_EXTRA_KEY, data_file_name  # noqa: E402
from resilient_train.job.recipe import load_recipe  # noqa: E402
from resilient_train.runner.failures.faults import FaultPlan  # noqa: E402
from resilient_train.runner.state import ckpt_layout  # noqa: E402
from resilient_train.runner.state.checkpointing import SaveRequest, TwinState  # noqa: E402
from resilient_train.runner.state.model_state import weights_digest  # noqa: E402
from resilient_train.runner.state.sharded_save import (  # noqa: E402
    ShardedWriter,
    ShareContext,
    persist_share,
)

RECIPE = load_recipe(str(Path(__file__).resolve().parents[3] / "recipes" / "wide_mlp.py"))
# features -> 2 features -> 2 features -> features: kernels of 2, 4 and 2 units (x3 with Adam's
# slots), which two shares can split evenly by bytes.
PARAMS = {**RECIPE.params, "features": 64, "width": 128}


def _parts(counters_prefix: str = "", live_model: keras.Model | None = None):
    model = RECIPE.build_model(PARAMS)
    optimizer = RECIPE.build_optimizer(PARAMS)
    optimizer.build(model.trainable_variables)
    rng = ckpt_layout.rng_state(model) if live_model is None else ckpt_layout.twin_rng_state(live_model, model)
    checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer,
                                            counters=ckpt_layout.new_counters(name_prefix=counters_prefix), rng=rng)
    return checkpoint, model, optimizer


@pytest.fixture(scope="module")
def trained():
    """A live graph after 3 Adam steps (slots non-zero), its twin snapshotted."""
    keras.backend.clear_session()
    live, model, optimizer = _parts()
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.standard_normal((8, 64), dtype=np.float32)
        y = rng.integers(0, 10, size=(8,))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(RECIPE.loss(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    live.global_step.assign(3)
    twin = TwinState.build(live, model, lambda: _twin_parts(model))
    twin.snapshot()
    return live, model, twin


def _twin_parts(live_model):
    checkpoint, model, _ = _parts("twin_", live_model)
    return checkpoint, model


def _values(prefix: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def test_the_shares_are_one_standard_checkpoint_with_the_exact_tensors(trained, tmp_path):
    live, model, twin = trained
    writer = ShardedWriter(twin, 2)
    for name in ("sharded", "plain"):
        (tmp_path / name).mkdir()
    writer.write(str(tmp_path / "sharded" / "ckpt"))
    twin.write(str(tmp_path / "plain" / "ckpt"))
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == [
        "ckpt.data-00000-of-00002", "ckpt.data-00001-of-00002", "ckpt.index"]
    sharded, plain = _values(tmp_path / "sharded" / "ckpt"), _values(tmp_path / "plain" / "ckpt")
    assert sorted(sharded) == sorted(plain) and len(sharded) > 20
    for key in plain:
        np.testing.assert_array_equal(sharded[key], plain[key], err_msg=key)
    # Plain TensorFlow restores it into a fresh graph (a checkpoint written by ``write`` has
    # no save_counter, hence expect_partial), to the exact values of every variable.
    _, fresh_model, fresh_optimizer = _parts()
    fresh_step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh_optimizer, global_step=fresh_step).restore(
        str(tmp_path / "sharded" / "ckpt")).expect_partial().assert_nontrivial_match()
    assert int(fresh_step.numpy()) == 3
    for live_v, fresh_v in zip([*model.weights, *live.optimizer.variables],
                               [*fresh_model.weights, *fresh_optimizer.variables], strict=True):
        np.testing.assert_array_equal(live_v.numpy(), fresh_v.numpy(), err_msg=live_v.path)
    assert int(fresh_optimizer.iterations.numpy()) == 3
    # Balanced by bytes: each data file within 10% of half (the object graph rides in share 0).
    sizes = [(tmp_path / "sharded" / data_file_name("ckpt", k, 2)).stat().st_size for k in range(2)]
    assert all(abs(size - sum(sizes) / 2) <= 0.1 * sum(sizes) / 2 for size in sizes), sizes
    plan = writer.extra()
    assert plan["writers"] == {"ckpt.data-00000-of-00002": 0, "ckpt.data-00001-of-00002": 1}
    assert sum(share["tensor_bytes"] for share in plan["shares"]) == twin.state_bytes


def test_two_persists_commit_one_checkpoint_that_restores_exactly(trained, tmp_path):
    live, model, twin = trained
    url = str(tmp_path / "store")
    stores = {rank: CheckpointStore(url) for rank in (0, 1)}
    stores[0].claim_generation(1, run_id="run-1", attempt=1)
    stores[1].adopt_generation(1, run_id="run-1", attempt=1)
    request = SaveRequest(global_step=3, epoch=0, step_in_epoch=3, extra={"completed": False},
                          files={"callbacks.json": b"{}"})
    results: dict[int, object] = {}

    def persist(rank: int) -> None:
        context = ShareContext(store=stores[rank], staging_root=tmp_path / f"work-{rank}" / "staging", rank=rank,
                               digest=weights_digest, run_id="run-1", world_size=2,
                               faults=FaultPlan([], rank=rank, attempt=1), keep=2, wait_timeout_s=60.0)
        results[rank] = persist_share(ShardedWriter(twin, 2), twin, request, context, emit=lambda *a, **k: None)

    persist(1)  # rank 1 uploads its share and its record, and is done
    persist(0)  # the chief finds the record with its own copy's sha256, and commits
    manifest = results[0]
    assert results[1] is None and manifest is not None
    assert sorted(manifest.files) == ["callbacks.json", "ckpt.data-00000-of-00002", "ckpt.data-00001-of-00002",
                                      "ckpt.index"]
    assert manifest.extra[SHARDED_EXTRA_KEY]["writers"] == {"ckpt.data-00000-of-00002": 0,
                                                            "ckpt.data-00001-of-00002": 1}
    assert manifest.weights_sha256 == weights_digest(twin.digest_view)
    (info,) = stores[0].verify(3)
    assert info.status.value == "ok"
    got, local = CheckpointStore(url).fetch(3, tmp_path / "cache")
    assert got == manifest
    fresh, fresh_model, _ = _parts()
    ckpt_layout.restore(fresh, local / "ckpt", where="test", recipe_name="wide_mlp")
    for live_w, fresh_w in zip(model.weights, fresh_model.weights):
        np.testing.assert_array_equal(live_w.numpy(), fresh_w.numpy(), err_msg=live_w.path)
