"""EpochInput: the re-entry path of a restore, the iterator per epoch, the saved states, the epoch end.

Two workers are simulated from rank 0's side: the injected ``gather`` returns this worker's value
and the peer's, ``gather_bytes`` this worker's state and the peer's; datasets are plain
``tf.data`` ranges, so an iterator's position is the value it yields next.
"""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

from resilient_train.checkpoint import FileEntry, Manifest
from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.iterator_state import (
    ITERATOR_STATE, SKIP, START_STEP, restore_iterator, serialize_iterator, state_file,
)
from resilient_train.runner.input.reentry import EPOCH_START, EpochInput

SHA = "0123456789abcdef" * 4
PEER_STATE = b"the peer's state"
STEPS = 100  # per epoch: epoch e's element k is e * STEPS + k


def with_symbolic(dataset: tf.data.Dataset, symbolic: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = symbolic
    return dataset.with_options(options)


class World:
    """Rank ``rank`` of two workers: records every call the EpochInput makes to its seams."""

    def __init__(self, *, rank: int = 0, peer_size: int | None = None, epoch: int = 0) -> None:
        self.rank, self.peer_size, self.epoch = rank, peer_size, epoch
        self.built: list[tuple[int, int, tuple[int, int] | None]] = []
        self.gathered: list[int] = []
        self.events: list[tuple[str, dict]] = []
        self.symbolic: list[bool] = []  # the symbolic argument of each build

    def dataset(self, epoch: int, start_step: int, worker: tuple[int, int] | None,
                symbolic: bool = False) -> tf.data.Dataset:
        self.built.append((epoch, start_step, worker))
        self.symbolic.append(symbolic)
        return with_symbolic(tf.data.Dataset.range(epoch * STEPS + start_step, (epoch + 1) * STEPS), symbolic)

    def gather(self, value: int) -> list[int]:
        self.gathered.append(value)
        peer = value if self.peer_size is None else self.peer_size
        return [value, peer] if self.rank == 0 else [peer, value]

    def gather_bytes(self, mine: bytes, sizes: list[int]) -> list[bytes]:
        return [mine, PEER_STATE] if self.rank == 0 else [PEER_STATE, mine]

    def emit(self, event: str, **fields) -> None:
        self.events.append((event, fields))

    def common(self, **changes) -> dict:
        return dict(rank=self.rank, workers=2, gather=self.gather, gather_bytes=self.gather_bytes,
                    current_epoch=lambda: self.epoch, emit=self.emit, **changes)


def plain_input(world: World, *, max_state_bytes: int = 1 << 20, **changes) -> EpochInput:
    return EpochInput(path=ITERATOR_STATE, reason="iterator state up to the bound", max_state_bytes=max_state_bytes,
                      dataset=world.dataset, **world.common(**changes))


def manifest(*, step_in_epoch: int, extra: dict, world_size: int = 2) -> Manifest:
    return Manifest(schema_version=1, run_id="run-1", epoch=1, step_in_epoch=step_in_epoch, global_step=100 + step_in_epoch,
                    world_size=world_size, tf_version="2.21.0", created_at="2026-01-02T03:04:05.678+00:00",
                    files={"ckpt.index": FileEntry(10, SHA)}, weights_sha256=SHA, extra=extra)


def take(iterator, count: int) -> list[int]:
    return [int(next(iterator)) for _ in range(count)]


def position(blob: bytes, epoch: int, start: int) -> int:
    """The element a fresh iterator of World's pipeline yields next once ``blob`` is restored
    into it. (Not the bytes: tf.data injects a prefetch whose buffered elements are part of the
    state, so two serializations of one position may differ with how far the buffer filled.)"""
    iterator = iter(with_symbolic(tf.data.Dataset.range(epoch * STEPS + start, (epoch + 1) * STEPS), True))
    restore_iterator(iterator, blob)
    return int(next(iterator))


# ------------------------------------------------------------------ the path
def test_for_recipe_takes_the_path_reentry_path_chooses():
    def dataset(input_context, epoch, seed, start_step=0):
        return tf.data.Dataset.range(1)

    recipe = Recipe(name="r", source="r.py", build_model=None, build_optimizer=None, loss=None, dataset=dataset)
    world = World()
    epoch_input = EpochInput.for_recipe(recipe, dataset=world.dataset, replicas_per_worker=1, max_state_bytes=10,
                                        **world.common())
    assert (epoch_input.path, epoch_input.reason, epoch_input.plain) == (START_STEP, "dataset takes start_step", False)


def test_a_fit_script_skips_and_its_one_iterator_is_never_retired_or_kept(tmp_path):
    world, asked, source_iterator = World(), [], iter(range(5))

    def source(epoch: int, start: int):
        asked.append((epoch, start))
        return source_iterator

    epoch_input = EpochInput.for_fit_script(source, **world.common())
    assert epoch_input.plan_reentry(manifest(step_in_epoch=7, extra={}), tmp_path) == (
        SKIP, "a fit script's input skips to the position")
    assert epoch_input.iterator(1, 7) is source_iterator
    epoch_input.retire(source_iterator, 1)
    epoch_input.keep(source_iterator)
    assert asked == [(1, 7)] and world.built == []
    assert epoch_input.reaper.retired == 0
    assert epoch_input.state_to_save(1, 8) == ({}, {}) and world.gathered == []


def test_exactly_one_of_dataset_and_source():
    world = World()
    with pytest.raises(ValueError, match="expected exactly one"):
        EpochInput(path=SKIP, reason="", max_state_bytes=0, **world.common())
    with pytest.raises(ValueError, match="expected exactly one"):
        EpochInput(path=SKIP, reason="", max_state_bytes=0, dataset=world.dataset, source=lambda e, s: None,
                   **world.common())


# ------------------------------------------------------------------ restore
def test_a_checkpoint_at_an_epoch_boundary_has_nothing_to_reenter(tmp_path):
    epoch_input = plain_input(World())
    assert epoch_input.plan_reentry(manifest(step_in_epoch=0, extra={}), tmp_path) == (
        EPOCH_START, "the checkpoint is at an epoch boundary")


def test_a_path_other_than_iterator_state_is_reported_as_chosen(tmp_path):
    world = World()
    epoch_input = EpochInput(path=START_STEP, reason="dataset takes start_step", max_state_bytes=100,
                             dataset=world.dataset, **world.common())
    assert epoch_input.plan_reentry(manifest(step_in_epoch=5, extra={}), tmp_path) == (START_STEP,
                                                                                      "dataset takes start_step")
    assert take(epoch_input.iterator(1, 5), 2) == [105, 106]
    assert world.built == [(1, 5, None)]  # the distributed input


def test_a_checkpoint_without_a_state_skips(tmp_path):
    epoch_input = plain_input(World())
    assert epoch_input.plan_reentry(manifest(step_in_epoch=5, extra={}), tmp_path) == (
        SKIP, "the checkpoint holds no iterator state (it was larger than the bound, or not saved)")


def test_states_of_another_worker_count_skip(tmp_path):
    epoch_input = plain_input(World())
    saved = {"iterator_state": {"world_size": 3, "epoch": 1, "entry_step": 0, "bytes": [1, 1, 1]}}
    assert epoch_input.plan_reentry(manifest(step_in_epoch=5, extra=saved, world_size=3), tmp_path) == (
        SKIP, "the iterator state was saved by 3 workers; 2 resume (another sharding)")


def test_a_restored_state_continues_the_saved_pipeline_from_its_entry_step(tmp_path):
    # The saved pipeline was entered at step 2 of epoch 1 and had yielded 5 batches (steps 2..6).
    saved_iterator = iter(tf.data.Dataset.range(1 * STEPS + 2, 2 * STEPS))
    assert take(saved_iterator, 5) == [102, 103, 104, 105, 106]
    blob = serialize_iterator(saved_iterator)
    (tmp_path / state_file(1)).write_bytes(blob)
    world = World(rank=1)
    epoch_input = plain_input(world)
    saved = {"iterator_state": {"world_size": 2, "epoch": 1, "entry_step": 2, "bytes": [len(blob), len(blob)]}}
    assert epoch_input.plan_reentry(manifest(step_in_epoch=7, extra=saved), tmp_path) == (
        ITERATOR_STATE, f"restores this worker's {len(blob)}-byte explicit (buffered elements) tf.data iterator state")
    assert take(epoch_input.iterator(1, 7), 3) == [107, 108, 109]
    assert world.built == [(1, 2, (1, 2))]  # built from the saved entry step, this worker's own pipeline
    assert world.symbolic == [False]  # as it was saved: a manifest without "symbolic" holds an explicit state
    # The state served that epoch once: the next epoch (or a second entry) is built from its start step.
    assert take(epoch_input.iterator(2, 0), 1) == [200]
    assert world.built[-1] == (2, 0, (1, 2))


def test_a_state_captured_before_the_checkpoints_step_replays_the_batches_between(tmp_path):
    # A memory-tier snapshot at step 9 carried the capture of step 6 (entered at step 2).
    saved_iterator = iter(tf.data.Dataset.range(1 * STEPS + 2, 2 * STEPS))
    take(saved_iterator, 4)  # steps 2..5 consumed: it yields 106 next
    blob = serialize_iterator(saved_iterator)
    (tmp_path / state_file(1)).write_bytes(blob)
    epoch_input = plain_input(World(rank=1))
    saved = {"iterator_state": {"world_size": 2, "epoch": 1, "entry_step": 2, "at_step": 6, "bytes": [len(blob)] * 2}}
    assert epoch_input.plan_reentry(manifest(step_in_epoch=9, extra=saved), tmp_path) == (
        ITERATOR_STATE, f"restores this worker's {len(blob)}-byte explicit (buffered elements) tf.data iterator "
                        "state of step 6 and replays 3 batches")
    assert take(epoch_input.iterator(1, 9), 2) == [109, 110]  # 106..108 replayed, not trained
    for at_step in (10, -1):  # past the checkpoint's step, or before the epoch: never trusted
        saved["iterator_state"]["at_step"] = at_step
        assert epoch_input.plan_reentry(manifest(step_in_epoch=9, extra=saved), tmp_path) == (
            SKIP, f"the iterator state names step {at_step} of the epoch; the checkpoint is at 9")


def test_a_snapshot_between_captures_carries_the_newest_capture_of_its_iterator():
    world = World(peer_size=len(PEER_STATE))
    epoch_input = plain_input(world)
    iterator = epoch_input.iterator(1, 0)
    take(iterator, 4)
    assert epoch_input.state_to_save(1, 4, capture=False) == ({}, {})  # nothing captured yet
    assert not epoch_input.captured
    files, extra = epoch_input.state_to_save(1, 4)
    gathered = len(world.gathered)
    take(iterator, 3)
    assert epoch_input.captured
    # No collective, nothing serialized: the capture of step 4, which says so.
    assert epoch_input.state_to_save(1, 7, capture=False) == (files, extra)
    assert extra["iterator_state"]["at_step"] == 4 and len(world.gathered) == gathered
    epoch_input.retire(iterator, 1)
    assert not epoch_input.captured  # a new epoch's iterator starts without one
    take(epoch_input.iterator(2, 0), 2)
    assert epoch_input.state_to_save(2, 2, capture=False) == ({}, {})


def test_a_restored_state_of_another_epoch_is_dropped(tmp_path):
    blob = serialize_iterator(iter(tf.data.Dataset.range(3)))
    (tmp_path / state_file(0)).write_bytes(blob)
    world = World()
    epoch_input = plain_input(world)
    saved = {"iterator_state": {"world_size": 2, "epoch": 0, "entry_step": 2, "bytes": [len(blob)] * 2}}
    assert epoch_input.plan_reentry(manifest(step_in_epoch=7, extra=saved), tmp_path)[0] == ITERATOR_STATE
    assert take(epoch_input.iterator(1, 7), 1) == [107]
    assert world.built == [(1, 7, (0, 2))] * 2  # the symbolic probe, then the iterator (no state to restore)
    assert world.symbolic == [True, True]


# --------------------------------------------------------------------- save
def test_the_chief_gets_every_workers_state_and_the_size_is_reported_once():
    world = World(peer_size=len(PEER_STATE))
    epoch_input = plain_input(world)
    iterator = epoch_input.iterator(1, 3)
    take(iterator, 4)
    files, extra = epoch_input.state_to_save(1, 7)
    assert (sorted(files), files["iterator-1.bin"]) == (["iterator-0.bin", "iterator-1.bin"], PEER_STATE)
    assert position(files["iterator-0.bin"], 1, 3) == 107  # this worker's own state, where it stood
    sizes = [len(files["iterator-0.bin"]), len(PEER_STATE)]
    assert extra == {"iterator_state": {"world_size": 2, "epoch": 1, "entry_step": 3, "at_step": 7, "bytes": sizes,
                                        "symbolic": True}}
    assert world.events == [("iterator_state_sized", {"group": True, "bytes": sizes, "max_bytes": 1 << 20,
                                                      "kept": True, "symbolic": True})]
    take(iterator, 1)
    files, extra = epoch_input.state_to_save(1, 8)
    assert position(files["iterator-0.bin"], 1, 3) == 108 and len(world.events) == 1
    assert epoch_input.path == ITERATOR_STATE


def test_a_worker_other_than_the_chief_records_no_files():
    world = World(rank=1)
    epoch_input = plain_input(world)
    take(epoch_input.iterator(0, 0), 2)
    files, extra = epoch_input.state_to_save(0, 2)
    assert files == {} and extra["iterator_state"]["world_size"] == 2


def test_nothing_is_saved_at_an_epoch_boundary_or_off_the_path():
    world = World()
    epoch_input = plain_input(world)
    epoch_input.iterator(0, 0)
    assert epoch_input.state_to_save(0, 0) == ({}, {})
    skipping = EpochInput(path=SKIP, reason="", max_state_bytes=100, dataset=world.dataset, **world.common())
    skipping.iterator(0, 0)
    assert skipping.state_to_save(0, 4) == ({}, {})
    assert world.gathered == []  # no collective either: every worker takes the same branch


def test_a_state_over_the_bound_turns_the_path_into_skip_for_the_attempt():
    world = World(peer_size=5000)
    epoch_input = plain_input(world, max_state_bytes=4096)
    take(epoch_input.iterator(0, 0), 2)
    assert epoch_input.state_to_save(0, 2) == ({}, {})
    assert (epoch_input.path, epoch_input.reason, epoch_input.plain) == (
        SKIP, "the iterator state (5000 bytes) is larger than --max-iterator-state-bytes 4096", False)
    assert [(name, fields["kept"]) for name, fields in world.events] == [("iterator_state_sized", False)]
    assert epoch_input.state_to_save(0, 4) == ({}, {}) and len(world.gathered) == 1
    assert epoch_input.iterator(1, 0) is not None and world.built[-1] == (1, 0, None)  # distributed again


def test_a_state_that_grew_past_the_bound_after_it_was_measured_is_left_out_of_that_save():
    world = World(peer_size=10)
    epoch_input = plain_input(world, max_state_bytes=4096)
    take(epoch_input.iterator(0, 0), 2)
    assert epoch_input.state_to_save(0, 2)[1] != {}
    world.peer_size = 5000
    assert epoch_input.state_to_save(0, 4) == ({}, {})
    assert epoch_input.path == ITERATOR_STATE and len(world.events) == 1  # measured once; the path stays


def test_a_pipeline_that_cannot_be_saved_on_a_peer_turns_the_path_into_skip():
    world = World(peer_size=-1)
    epoch_input = plain_input(world)
    take(epoch_input.iterator(0, 0), 2)
    assert epoch_input.state_to_save(0, 2) == ({}, {})
    reason = "the tf.data pipeline of rank(s) [1] cannot be saved: a stateful op such as py_function"
    assert (epoch_input.path, epoch_input.reason) == (SKIP, reason)
    assert world.events == [("iterator_state_sized", {"group": True, "bytes": [world.gathered[0], -1],
                                                      "max_bytes": 1 << 20, "kept": False, "reason": reason,
                                                      "symbolic": True})]


def test_this_workers_unsaveable_pipeline_is_reported_with_tensorflows_message():
    world = World()

    def stateful(epoch: int, start_step: int, worker, symbolic):
        return tf.data.Dataset.range(10).map(lambda i: tf.py_function(lambda x: x, [i], tf.int64))

    epoch_input = EpochInput(path=ITERATOR_STATE, reason="", max_state_bytes=100, dataset=stateful, **world.common())
    take(epoch_input.iterator(0, 0), 1)
    assert epoch_input.state_to_save(0, 1) == ({}, {})
    assert world.gathered == [-1]
    [(_, fields)] = world.events  # not symbolic either: a position would not restore the op's state
    assert fields["symbolic"] is False and "EagerPyFunc is stateful" in fields["not_symbolic"]
    assert epoch_input.reason.startswith("the tf.data pipeline of rank(s) [0, 1] cannot be saved (")
    assert "EagerPyFunc is stateful" in epoch_input.reason


# ----------------------------------------------------------------- symbolic
def test_a_restored_symbolic_state_rebuilds_its_pipeline_symbolic(tmp_path):
    saved_iterator = iter(with_symbolic(tf.data.Dataset.range(1 * STEPS + 2, 2 * STEPS), True))
    take(saved_iterator, 5)
    blob = serialize_iterator(saved_iterator)
    (tmp_path / state_file(0)).write_bytes(blob)
    world = World()
    epoch_input = plain_input(world)
    saved = {"iterator_state": {"world_size": 2, "epoch": 1, "entry_step": 2, "bytes": [len(blob)] * 2,
                                "symbolic": True}}
    assert epoch_input.plan_reentry(manifest(step_in_epoch=7, extra=saved), tmp_path) == (
        ITERATOR_STATE, f"restores this worker's {len(blob)}-byte symbolic (positions) tf.data iterator state")
    assert take(epoch_input.iterator(1, 7), 2) == [107, 108]
    assert world.symbolic == [True]


def test_a_symbolic_state_holds_positions_not_the_buffered_elements():
    # range -> map -> batch(8) -> unbatch of 4 KB elements: after 3 elements, an explicit state
    # holds the rest of the current batch (5 x 4 KB), a symbolic one the positions.
    def dataset(epoch: int, start_step: int, worker, symbolic):
        noise = tf.data.Dataset.range(start_step, STEPS).map(lambda i: tf.random.stateless_uniform([1024], [i, 0]))
        pipeline = noise.batch(8).unbatch()  # 4 KB of noise per element: nothing to compress
        return with_symbolic(pipeline, symbolic)

    def saved_bytes(*, symbolic: bool) -> tuple[bool, int]:
        world = World(peer_size=1)
        epoch_input = EpochInput(path=ITERATOR_STATE, reason="", max_state_bytes=1 << 20, dataset=dataset,
                                 **world.common())
        if not symbolic:  # as after a refused try (next test)
            epoch_input._symbolic = False
        iterator = epoch_input.iterator(0, 0)
        [next(iterator) for _ in range(3)]
        files, extra = epoch_input.state_to_save(0, 3)
        return extra["iterator_state"]["symbolic"], len(files["iterator-0.bin"])

    (symbolic, positions), (explicit, buffered) = saved_bytes(symbolic=True), saved_bytes(symbolic=False)
    assert (symbolic, explicit) == (True, False)
    assert positions < 2048 and buffered > 5 * 4096


def test_a_dataset_without_symbolic_checkpointing_is_saved_explicitly_and_says_why():
    world = World(peer_size=1)

    def cached(epoch: int, start_step: int, worker, symbolic):
        world.symbolic.append(symbolic)
        return with_symbolic(tf.data.Dataset.range(start_step, STEPS).cache(), symbolic)

    epoch_input = EpochInput(path=ITERATOR_STATE, reason="", max_state_bytes=100, dataset=cached, **world.common())
    take(epoch_input.iterator(0, 0), 2)
    assert world.symbolic == [True, False]  # a probe tried, TensorFlow refused: built explicit
    assert epoch_input.state_to_save(0, 2) == ({}, {})  # the cache's state is over 100 bytes
    [(name, fields)] = world.events
    assert (name, fields["symbolic"], fields["not_symbolic"]) == (
        "iterator_state_sized", False, "CacheDatasetV2 does not support symbolic checkpointing.")
    assert epoch_input.reason.endswith(
        "; it holds buffered elements because CacheDatasetV2 does not support symbolic checkpointing.")


def test_a_symbolic_state_that_holds_data_anyway_is_saved_explicitly():
    """A shuffle buffer is saved symbolically too: no gain (digits_cnn's pipeline ran 3.8x
    slower symbolic), so a probe over SYMBOLIC_MAX_BYTES builds the attempt explicit."""
    import numpy as np

    from resilient_train.runner.input.reentry import SYMBOLIC_MAX_BYTES

    world = World(peer_size=1)
    data = np.random.default_rng(0).standard_normal((STEPS, 1000))

    def shuffled(epoch: int, start_step: int, worker, symbolic):
        world.symbolic.append(symbolic)
        rows = tf.data.Dataset.from_tensor_slices(data[start_step:])  # (noise: no compression shrinks it)
        return with_symbolic(rows.shuffle(STEPS, seed=1), symbolic)  # 100 rows of 8 KB buffered

    epoch_input = EpochInput(path=ITERATOR_STATE, reason="", max_state_bytes=1 << 20, dataset=shuffled,
                             **world.common())
    iterator = epoch_input.iterator(0, 0)
    next(iterator), next(iterator)
    assert world.symbolic == [True, False]  # the probe was symbolic, the iterator explicit
    files, extra = epoch_input.state_to_save(0, 2)
    assert extra["iterator_state"]["symbolic"] is False and len(files["iterator-0.bin"]) > SYMBOLIC_MAX_BYTES
    [(name, fields)] = world.events
    assert (name, fields["symbolic"]) == ("iterator_state_sized", False)
    assert fields["not_symbolic"].startswith("its symbolic state holds data (") and fields["not_symbolic"].endswith(
        f" bytes after one element, over {SYMBOLIC_MAX_BYTES}): the explicit one is no larger and its pipeline "
        "runs faster")


# ---------------------------------------------------------------------- end
def test_a_retired_epoch_is_handed_to_the_reaper_and_saves_no_state_after():
    world = World()
    epoch_input = plain_input(world)
    iterator = epoch_input.iterator(0, 0)
    take(iterator, 3)
    epoch_input.retire(iterator, 0)
    del iterator
    assert epoch_input.reaper.wait_idle(10)
    assert (epoch_input.reaper.retired, epoch_input.reaper.torn_down) == (2, 2)  # the symbolic probe's too
    assert epoch_input.state_to_save(0, 3) == ({}, {}) and world.gathered == []


def test_a_kept_iterator_is_not_retired_and_the_preemption_save_still_records_its_state():
    world = World()
    epoch_input = plain_input(world)
    iterator = epoch_input.iterator(0, 0)
    take(iterator, 3)
    epoch_input.keep(iterator)
    del iterator
    assert epoch_input.reaper.retired == 1  # the symbolic probe of the attempt's first iterator only
    files, _ = epoch_input.state_to_save(0, 3)
    assert position(files["iterator-0.bin"], 0, 0) == 3


class _Teardown:
    """Stands in for an iterator whose teardown blocks until ``release`` is set."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def __del__(self) -> None:
        self.release.wait(10)


def test_slow_teardowns_are_reported_with_their_input_and_epoch():
    world = World(epoch=4)
    ticks = iter(range(0, 100, 2))  # on the reaper thread every teardown "takes" 2 s; wait_idle's reads stay at 0

    def clock() -> float:
        return float(next(ticks)) if threading.current_thread().name == "iterator-reaper" else 0.0

    epoch_input = plain_input(world, clock=clock)
    epoch_input.retire(object(), 3)
    epoch_input.retire_evaluation(object())
    assert epoch_input.reaper.wait_idle(10)
    assert world.events == [("input_torn_down", {"input": "train", "epoch": 3, "seconds": 2.0}),
                            ("input_torn_down", {"input": "eval", "epoch": 4, "seconds": 2.0})]


def test_a_fast_teardown_is_not_reported():
    world = World()
    epoch_input = plain_input(world, clock=lambda: 0.0)
    epoch_input.retire(object(), 0)
    assert epoch_input.reaper.wait_idle(10) and world.events == []


def test_a_wait_for_room_in_the_reaper_is_reported_with_the_current_epoch():
    world, release = World(epoch=6), threading.Event()
    epoch_input = plain_input(world, max_pending_teardowns=1)
    blocked = _Teardown(release)
    epoch_input.retire(blocked, 5)
    del blocked
    timer = threading.Timer(0.2, release.set)
    timer.start()
    epoch_input.retire(object(), 6)  # waits until the first teardown is done
    timer.join()
    assert epoch_input.reaper.wait_idle(10)
    waits = [fields for name, fields in world.events if name == "input_teardown_waited"]
    assert len(waits) == 1 and waits[0]["epoch"] == 6 and waits[0]["waited_s"] > 0
