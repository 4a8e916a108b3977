"""Async checkpointing, in process: the twin graph, the snapshot, the background saver.

These tests need no worker processes: they build the live graph the way Trainer._setup
does (default strategy) and check exact invariants: the twin's files have the live
checkpoint's keys, shapes and values and restore into a fresh live graph; a snapshot is
not changed by later training; building the twin moves no global RNG; a background
failure is re-raised on the caller's thread, once; saves commit in order.
The end-to-end behaviour (real workers, kills, preemption) is in test_async_checkpoint_e2e.py.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import structlog  # noqa: E402
import tensorflow as tf  # noqa: E402

from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.job.config import JobConfig  # noqa: E402
from resilient_train.errors import ConfigError, StorageError  # noqa: E402
from resilient_train.job.recipe import load_recipe  # noqa: E402
from resilient_train.runner.state.checkpointing import (  # noqa: E402
    AsyncCheckpointer,
    SaveRequest,
    TwinState,
    pair_variables,
    persist_twin,
)
from resilient_train.runner.state import ckpt_layout  # noqa: E402
from resilient_train.runner.failures.faults import FaultPlan  # noqa: E402
from resilient_train.runner.state.model_state import weights_digest  # noqa: E402

RECIPE = load_recipe(str(Path(__file__).resolve().parents[3] / "recipes" / "digits_cnn.py"))
PARAMS = dict(RECIPE.params)


def _graph() -> tuple[tf.train.Checkpoint, keras.Model, keras.optimizers.Optimizer]:
    """The checkpointed objects, built like Trainer._setup builds them.

    Starts from a cleared Keras session so auto-generated names (which key the ``rng``
    dict) are those of a fresh worker process, as on every real restore.
    """
    keras.backend.clear_session()
    model = RECIPE.build_model(PARAMS)
    optimizer = RECIPE.build_optimizer(PARAMS)
    optimizer.build(model.trainable_variables)
    checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer, counters=ckpt_layout.new_counters(),
                                            rng=ckpt_layout.rng_state(model))
    return checkpoint, model, optimizer


def _twin_of(live: tf.train.Checkpoint, live_model: keras.Model) -> TwinState:
    def build():
        model = RECIPE.build_model(PARAMS)
        optimizer = RECIPE.build_optimizer(PARAMS)
        optimizer.build(model.trainable_variables)
        checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer,
                                                counters=ckpt_layout.new_counters(name_prefix="twin_"),
                                                rng=ckpt_layout.twin_rng_state(live_model, model))
        return checkpoint, model

    return TwinState.build(live, live_model, build)


def _train(checkpoint: tf.train.Checkpoint, model: keras.Model, optimizer, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rng.random((16, 8, 8, 1), dtype=np.float32)
        y = rng.integers(0, 10, size=(16,))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(RECIPE.loss(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        checkpoint.global_step.assign_add(1)
        checkpoint.step_in_epoch.assign_add(1)


def _values(path: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


@pytest.fixture()
def live():
    keras.utils.set_random_seed(3)
    checkpoint, model, optimizer = _graph()
    _train(checkpoint, model, optimizer, steps=3)
    return checkpoint, model, optimizer


def test_twin_files_have_the_live_keys_shapes_and_values(live, tmp_path):
    checkpoint, model, optimizer = live
    twin = _twin_of(checkpoint, model)
    twin.snapshot()
    live_path = checkpoint.write(str(tmp_path / "live" / "ckpt"))
    (tmp_path / "twin").mkdir()
    twin.write(str(tmp_path / "twin" / "ckpt"))
    twin_path = str(tmp_path / "twin" / "ckpt")
    live_values, twin_values = _values(live_path), _values(twin_path)
    assert sorted(live_values) == sorted(twin_values)
    assert any("optimizer" in k for k in live_values) and any(k.startswith("rng/") for k in live_values)
    for name, value in live_values.items():
        assert twin_values[name].dtype == value.dtype and twin_values[name].shape == value.shape, name
        np.testing.assert_array_equal(twin_values[name], value, err_msg=name)
    assert weights_digest(twin.digest_view) == weights_digest(model)
    assert twin.state_bytes == sum(v.nbytes for v in live_values.values())


def test_the_compiled_twin_write_is_byte_identical_to_an_eager_write(live, tmp_path):
    checkpoint, model, _ = live
    twin = _twin_of(checkpoint, model)
    twin.snapshot()
    (tmp_path / "compiled").mkdir()
    twin.write(str(tmp_path / "compiled" / "ckpt"))
    twin.checkpoint.write(str(tmp_path / "eager" / "ckpt"))
    compiled = {p.name: p.read_bytes() for p in (tmp_path / "compiled").iterdir()}
    eager = {p.name: p.read_bytes() for p in (tmp_path / "eager").iterdir()}
    assert sorted(compiled) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    assert compiled == eager


def test_twin_files_restore_into_a_fresh_live_graph(live, tmp_path):
    checkpoint, model, optimizer = live
    twin = _twin_of(checkpoint, model)
    twin.snapshot()
    path = str(tmp_path / "ckpt")
    twin.write(path)
    expected_digest, expected_step = weights_digest(model), int(checkpoint.global_step.numpy())
    expected_iterations = int(optimizer.iterations.numpy())
    keras.utils.set_random_seed(99)  # a different initialisation, overwritten by the restore
    fresh, fresh_model, fresh_optimizer = _graph()
    assert weights_digest(fresh_model) != expected_digest
    fresh.read(path).assert_consumed()
    assert weights_digest(fresh_model) == expected_digest
    assert int(fresh.global_step.numpy()) == expected_step == 3
    assert int(fresh_optimizer.iterations.numpy()) == expected_iterations == 3
    for (_, live_var, _), (_, fresh_var, _) in zip(twin.pairs, pair_variables(fresh, twin.checkpoint)):
        np.testing.assert_array_equal(live_var.numpy(), fresh_var.numpy())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_a_snapshot_does_not_change_when_training_goes_on(live, compiled):
    checkpoint, model, optimizer = live
    twin = _twin_of(checkpoint, model)
    twin.snapshot()
    at_snapshot = [t.numpy().copy() for _, _, t in twin.pairs]
    digest_at_snapshot = weights_digest(model)
    if compiled:  # the Trainer's step is a tf.function; its in-place updates must not reach the twin
        step = tf.function(lambda x, y: optimizer.apply_gradients(zip(
            tf.gradients(tf.reduce_mean(RECIPE.loss(y, model(x, training=True))), model.trainable_variables),
            model.trainable_variables)))
        rng = np.random.default_rng(1)
        for _ in range(2):
            step(rng.random((16, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, size=(16,)))
        checkpoint.global_step.assign_add(2)
    else:
        _train(checkpoint, model, optimizer, steps=2, seed=1)
    assert weights_digest(model) != digest_at_snapshot
    for (path, _, twin_var), before in zip(twin.pairs, at_snapshot):
        np.testing.assert_array_equal(twin_var.numpy(), before, err_msg=path)
    assert weights_digest(twin.digest_view) == digest_at_snapshot


def test_building_the_twin_moves_no_global_rng(live):
    checkpoint, model, _ = live
    keras.utils.set_random_seed(5)
    expected = (random.random(), float(np.random.random()), keras.random.uniform(()).numpy())
    keras.utils.set_random_seed(5)
    _twin_of(checkpoint, model)
    assert (random.random(), float(np.random.random()), keras.random.uniform(()).numpy()) == expected


def test_pairing_refuses_a_twin_with_another_structure(live):
    checkpoint, model, _ = live
    other = tf.train.Checkpoint(model=keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match=r"twin checkpoint: / has children"):
        pair_variables(checkpoint, other)
    wrong_shape = tf.train.Checkpoint(v=tf.Variable(tf.zeros((2, 3))))
    with pytest.raises(ValueError, match=r"/v is float32\(2, 2\) live but float32\(2, 3\)"):
        pair_variables(tf.train.Checkpoint(v=tf.Variable(tf.zeros((2, 2)))), wrong_shape)


# ------------------------------------------------------------------ the saver


class _Twin:
    def __init__(self) -> None:
        self.snapshots = 0

    def snapshot(self) -> None:
        self.snapshots += 1


class _Events:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def __call__(self, event: str, **fields) -> None:
        self.records.append({"event": event, **fields})

    def named(self, event: str) -> list[dict]:
        return [r for r in self.records if r["event"] == event]


def _request(step: int) -> SaveRequest:
    return SaveRequest(global_step=step, epoch=0, step_in_epoch=step)


def test_a_background_failure_is_raised_on_the_next_call_once():
    events = _Events()
    saver = AsyncCheckpointer(_Twin(), lambda r: (_ for _ in ()).throw(StorageError("cannot commit: no bucket")),
                              emit=events)
    saver.save(_request(5))
    saver._join()  # the persist has failed by now
    with pytest.raises(StorageError, match="no bucket") as info:
        saver.raise_if_failed()
    assert "background persist of checkpoint step 5" in "".join(info.value.__notes__)
    saver.raise_if_failed()  # raised once, not forever
    assert [r["global_step"] for r in events.named("checkpoint_failed")] == [5]


def test_flush_raises_a_failure_of_the_in_flight_save():
    saver = AsyncCheckpointer(_Twin(), lambda r: (_ for _ in ()).throw(OSError("disk full")), emit=_Events())
    saver.save(_request(1))
    with pytest.raises(OSError, match="disk full"):
        saver.flush()


def test_a_save_due_while_one_persists_waits_and_commits_in_order():
    release = threading.Event()
    committed: list[int] = []
    events = _Events()
    twin = _Twin()

    def persist(request):
        if request.global_step == 10:
            release.wait(timeout=30)
        committed.append(request.global_step)

    saver = AsyncCheckpointer(twin, persist, emit=events)
    saver.save(_request(10))
    assert saver.in_flight == 10
    threading.Timer(0.2, release.set).start()
    saver.save(_request(20))  # blocks until step 10 committed, then snapshots
    saver.flush()
    assert committed == [10, 20]
    assert twin.snapshots == 2
    (waited,) = events.named("checkpoint_waited")
    assert (waited["global_step"], waited["in_flight_step"]) == (20, 10)
    assert waited["waited_ms"] > 0


def test_events_from_the_persist_thread_carry_the_bound_context(tmp_path):
    captured: list[dict] = []

    def persist(request):
        captured.append(dict(structlog.contextvars.get_contextvars()))

    structlog.contextvars.bind_contextvars(run_id="r1", rank=0)
    try:
        saver = AsyncCheckpointer(_Twin(), persist, emit=_Events())
        saver.save(_request(1))
        saver.flush()
    finally:
        structlog.contextvars.unbind_contextvars("run_id", "rank")
    assert captured == [{"run_id": "r1", "rank": 0}]


def test_persist_twin_commits_the_snapshot_with_its_digest(live, tmp_path):
    checkpoint, model, optimizer = live
    twin = _twin_of(checkpoint, model)
    events = _Events()
    store = CheckpointStore(str(tmp_path / "store"), emit=events)
    saver = AsyncCheckpointer(
        twin,
        lambda r: persist_twin(twin, r, store=store, staging_root=tmp_path / "staging", digest=weights_digest,
                               run_id="t", world_size=1, faults=FaultPlan([], rank=0, attempt=1), keep=3,
                               emit=events),
        emit=events,
    )
    snapshot_digest = weights_digest(model)
    saver.save(_request(3))
    _train(checkpoint, model, optimizer, steps=1, seed=2)  # training goes on during the persist
    manifest = saver.flush()
    assert manifest is not None and manifest.global_step == 3
    assert manifest.weights_sha256 == snapshot_digest != weights_digest(model)
    assert [(r["global_step"], r["weights_sha256"]) for r in events.named("checkpoint_committed")] == [
        (3, snapshot_digest)]  # the event carries the trajectory point, not only the manifest
    assert not (tmp_path / "staging" / "ckpt-000000000003").exists()
    assert [i.status.value for i in store.verify()] == ["ok"]


# ------------------------------------------------------------------ config


def test_job_config_validates_the_new_fields():
    assert JobConfig(recipe="r.py").checkpoint_mode == "async"
    assert JobConfig(recipe="r.py", checkpoint_mode="sync", save_every_seconds=2.5).save_every_seconds == 2.5
    with pytest.raises(ConfigError, match=r"Received checkpoint_mode='eager'; expected 'async' or 'sync'"):
        JobConfig(recipe="r.py", checkpoint_mode="eager")
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ConfigError, match=r"Received save_every_seconds="):
            JobConfig(recipe="r.py", save_every_seconds=bad)


def test_cli_flags_reach_the_job_config():
    from resilient_train.cli import _parser
    from resilient_train.job.config import job_from_args

    args = _parser().parse_args(["run", "recipes/digits_cnn.py", "--checkpoint-mode", "sync",
                                 "--save-every-seconds", "30"])
    job = job_from_args(args)
    assert (job.checkpoint_mode, job.save_every_seconds) == ("sync", 30.0)
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "x.py", "--checkpoint-mode", "later"])


def test_a_carried_capture_is_hashed_once_for_all_the_saves_that_carry_it(monkeypatch, tmp_path):
    import hashlib

    from resilient_train.runner.state import checkpointing

    hashed: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(checkpointing.hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or real(data))
    monkeypatch.setattr(checkpointing, "_digests", checkpointing._FileDigests())
    capture, state = b"i" * 1000, b"s" * 10
    entries = []
    for step in (20, 40, 60):  # one capture carried by three saves; the callbacks' state is new each time
        request = SaveRequest(global_step=step, epoch=0, step_in_epoch=step,
                              files={"iterator-0.bin": capture, "callbacks.json": bytes(bytearray(state))})
        (tmp_path / str(step)).mkdir()
        entries.append(checkpointing.write_request_files(tmp_path / str(step), request))
    assert hashed == [1000, 10, 10, 10]
    assert entries[0]["iterator-0.bin"] == entries[2]["iterator-0.bin"]
    assert entries[2]["iterator-0.bin"].sha256 == real(capture).hexdigest()
    assert (tmp_path / "60" / "iterator-0.bin").read_bytes() == capture
