"""The Ray launcher's pure logic, without Ray: storage rule, addresses, the file pump."""

from __future__ import annotations

import json

import pytest

from resilient_train.cli import main as cli_main
from resilient_train.job.config import JobConfig
from resilient_train.errors import EXIT_USAGE, ConfigError
from resilient_train.rundir import events
from resilient_train.rundir.events import read_events
from resilient_train.supervisor.launchers._slot import FileChunk, SlotReport, _Pump, apply_chunks
from resilient_train.supervisor.launchers.ray import (
    check_storage,
    is_loopback,
    job_for_nodes,
    placement_strategy,
    ray_address,
    unique_addresses,
)


def job(**values) -> JobConfig:
    return JobConfig(recipe="recipes/digits_cnn.py", run_dir="runs/x", launcher="ray", **values)


@pytest.mark.parametrize("storage", ["runs/x/checkpoints", "/mnt/ckpt", "file:///mnt/ckpt"])
def test_local_storage_is_refused_unless_shared(storage):
    with pytest.raises(ConfigError, match="not reachable from other nodes.*s3://.*--storage-shared"):
        check_storage(job(storage=storage))
    check_storage(job(storage=storage, storage_shared=True))


def test_memory_storage_is_refused_even_when_called_shared():
    with pytest.raises(ConfigError, match="memory:// lives in one process"):
        check_storage(job(storage="memory://ckpt", storage_shared=True))


def test_object_storage_needs_no_flag():
    check_storage(job(storage="s3://bucket/prefix"))


def test_nodes_get_absolute_recipe_and_storage_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("")
    node_job = job_for_nodes(JobConfig(recipe="r.py", run_dir="run", storage="ck", storage_shared=True))
    assert (node_job.recipe, node_job.storage) == (str(tmp_path / "r.py"), str(tmp_path / "ck"))
    assert job_for_nodes(job(storage="s3://b/p")).storage == "s3://b/p"
    assert job_for_nodes(JobConfig(recipe="some.module", storage="s3://b/p")).recipe == "some.module"


def test_ray_address_flag_then_environment_then_auto():
    assert ray_address(job(ray_address="10.0.0.1:6379"), {"RAY_ADDRESS": "x:1"}) == "10.0.0.1:6379"
    assert ray_address(job(), {"RAY_ADDRESS": "x:1"}) == "x:1"
    assert ray_address(job(), {}) == "auto"


@pytest.mark.parametrize(
    "address, loopback",
    [("127.0.0.1:6379", True), ("localhost:1", True), ("ray://127.0.0.1:10001", True),
     ("10.1.2.3:6379", False), ("auto", False)],
)
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def test_strategies_and_config_validation():
    assert (placement_strategy("spread"), placement_strategy("pack")) == ("SPREAD", "PACK")
    with pytest.raises(ConfigError, match=r"ray_strategy='strict'; expected one of \['spread', 'pack'\]"):
        job(ray_strategy="strict")
    with pytest.raises(ConfigError, match="cpus_per_worker=0; expected a number of CPUs > 0"):
        job(cpus_per_worker=0)


def test_duplicate_addresses_are_detected():
    assert unique_addresses(["127.0.0.1", "127.0.0.1"], [5000, 5001])
    assert not unique_addresses(["127.0.0.1", "127.0.0.1"], [5000, 5000])
    assert unique_addresses(["10.0.0.1", "10.0.0.2"], [5000, 5000])


def test_cli_refuses_local_storage_before_any_worker(tmp_path, capsys):
    code = cli_main(["run", "recipes/digits_cnn.py", "--launcher", "ray", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert err.startswith("resilient-train: error: Received storage=") and len(err.strip().splitlines()) == 1
    assert "--storage-shared" in err and "Traceback" not in err
    assert [e["event"] for e in read_events(tmp_path / "run" / "events.jsonl")] == ["storage_claimed", "run_started"]


def test_pump_sends_only_new_bytes_whole_event_lines_and_replaced_markers(tmp_path):
    node, home = tmp_path / "node", tmp_path / "home"
    (node / "attempt-1").mkdir(parents=True)
    pump = _Pump(node)
    first = {"event": "first_step", "global_step": 1}
    (node / "events.jsonl").write_text(json.dumps(first) + "\n" + '{"event": "tor')
    (node / "attempt-1" / "worker-0.log").write_text("hello\n")
    (node / "attempt-1" / "step-0.txt").write_text("3   \n")
    (node / "attempt-1" / "job.json").write_text("{}")
    chunks = pump.collect()
    assert sorted(c.path for c in chunks) == ["attempt-1/step-0.txt", "attempt-1/worker-0.log", "events.jsonl"]
    apply_chunks(home, chunks)

    with open(node / "events.jsonl", "a") as handle:
        handle.write('n"}\n')
    with open(node / "attempt-1" / "worker-0.log", "a") as handle:
        handle.write("world\n")
    (node / "attempt-1" / "step-0.txt").write_text("10  \n")
    apply_chunks(home, pump.collect())
    assert pump.collect() == ()  # nothing new

    assert [e["event"] for e in read_events(home / "events.jsonl")] == ["first_step", "torn"]
    assert (home / "attempt-1" / "worker-0.log").read_text() == "hello\nworld\n"
    assert (home / "attempt-1" / "step-0.txt").read_text() == "10  \n"
    assert not (home / "attempt-1" / "job.json").exists()


def test_replaced_chunk_overwrites_and_appended_chunk_appends(tmp_path):
    apply_chunks(tmp_path, [FileChunk("attempt-2/error-1.json", b"{}"), FileChunk("attempt-2/worker-1.log", b"a")])
    apply_chunks(tmp_path, [FileChunk("attempt-2/error-1.json", b"{\"x\": 1}", replace=True),
                            FileChunk("attempt-2/worker-1.log", b"b")])
    assert (tmp_path / "attempt-2" / "error-1.json").read_text() == '{"x": 1}'
    assert (tmp_path / "attempt-2" / "worker-1.log").read_text() == "ab"


class _ActorDied(Exception):
    pass


class _FakeRay:
    """Just enough of the ray module for RayLauncher.start: refs are thunks."""

    class exceptions:
        RayActorError = _ActorDied

        class GetTimeoutError(TimeoutError):
            pass

    def get(self, refs, timeout=None):
        return [ref() for ref in refs] if isinstance(refs, list) else refs()

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs), []  # a thunk is always ready: calling it answers or raises

    def kill(self, actor, no_restart=True):
        actor.killed = True


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return lambda: self.fn(*args)


class _FakeSlotActor:
    def __init__(self, dead: bool, port: int):
        self.killed = False
        self.free_port = _Method(lambda host: self._alive() or port)
        self.starts = []  # (attempt, seed) of each start
        self.start = _Method(lambda job_json, rank, attempt, env, seed: self._alive() or self._start(rank, attempt, seed))
        self.where = _Method(lambda: ("node-new", "127.0.0.2"))
        self.close = _Method(lambda final: self._alive() or ())
        self.dead = dead

    def _start(self, rank, attempt, seed):
        self.starts.append((attempt, seed))
        return {"pid": 100 * attempt + rank, "standby": attempt > 1}

    def _alive(self):
        if self.dead:
            raise _ActorDied("The actor died because its node has died.")


def test_a_slot_that_died_between_attempts_is_placed_anew_once(tmp_path):
    from resilient_train.supervisor.launchers import ray as ray_launcher
    from resilient_train.supervisor.launchers.api import WorkerSpec

    launcher = ray_launcher.RayLauncher(job(storage="s3://b/p"), ray_module=_FakeRay())
    placements = [[_FakeSlotActor(False, 5000), _FakeSlotActor(True, 5001)],
                  [_FakeSlotActor(False, 5002), _FakeSlotActor(False, 5003)]]
    placed = []

    def place(count, *, run_id):
        actors = placements[len(placed)]
        placed.append(actors)
        launcher._slots = [ray_launcher._SlotState(a, f"node-{i}", "127.0.0.1") for i, a in enumerate(actors)]

    launcher._place = place
    specs = [WorkerSpec(rank, 2, launcher.job, {"RT_RUN_ID": "r"}, tmp_path) for rank in (0, 1)]
    handles = launcher.start(specs)
    assert [h.pid for h in handles] == [200, 201]
    assert len(placed) == 2 and all(a.killed for a in placed[0]) and not any(a.killed for a in placed[1])


def test_slots_dying_on_both_placements_is_a_clean_error(tmp_path):
    from resilient_train.supervisor.launchers import ray as ray_launcher
    from resilient_train.supervisor.launchers.api import WorkerSpec

    launcher = ray_launcher.RayLauncher(job(storage="s3://b/p"), ray_module=_FakeRay())

    def place(count, *, run_id):
        launcher._slots = [ray_launcher._SlotState(_FakeSlotActor(True, 5000 + i), f"n{i}", "127.0.0.1") for i in range(2)]

    launcher._place = place
    specs = [WorkerSpec(rank, 1, launcher.job, {"RT_RUN_ID": "r"}, tmp_path) for rank in (0, 1)]
    with pytest.raises(ConfigError, match="Ray slot actors died twice while starting workers: The actor died"):
        launcher.start(specs)


def _launcher_placing(tmp_path, placements):
    """A RayLauncher whose ``_place`` hands out ``placements`` in order (an exception: raised)."""
    from resilient_train.supervisor.launchers import ray as ray_launcher
    from resilient_train.supervisor.launchers.api import WorkerSpec

    launcher = ray_launcher.RayLauncher(job(storage="s3://b/p"), ray_module=_FakeRay())

    def place(count, *, run_id):
        placement = placements.pop(0)
        if isinstance(placement, Exception):
            raise placement
        launcher._slots = [ray_launcher._SlotState(a, f"node-{i}", "127.0.0.1") for i, a in enumerate(placement)]

    launcher._place = place

    def specs(attempt):
        return [WorkerSpec(rank, attempt, launcher.job, {"RT_RUN_ID": "r"}, tmp_path) for rank in (0, 1)]

    return launcher, specs


def test_no_placement_for_the_first_attempt_is_a_usage_error(tmp_path):
    from resilient_train.supervisor.launchers.ray import RayPlacementError

    reason = RayPlacementError("Ray could not place 2 workers with {'CPU': 64.0} each (spread) within 3 s")
    launcher, specs = _launcher_placing(tmp_path, [reason])
    with pytest.raises(RayPlacementError, match="with {'CPU': 64.0} each"):
        launcher.start(specs(1))


def test_no_placement_for_a_restart_is_a_launch_error_naming_rays_reason(tmp_path):
    from resilient_train.errors import RestartNotPlacedError
    from resilient_train.supervisor.launchers.ray import RayPlacementError

    reason = RayPlacementError("Ray could not place 2 workers with {'CPU': 2.0} each (spread) within 3 s: no node took ...")
    first = [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)]
    launcher, specs = _launcher_placing(tmp_path, [first])
    handles = launcher.start(specs(1))
    handles[1].lost, handles[1].returncode = "node lost", -9  # what pump() records for a lost node

    def replace(indices, *, run_id):
        assert indices == [1]
        raise reason

    launcher._replace = replace
    with pytest.raises(RestartNotPlacedError) as raised:
        launcher.start(specs(2))
    assert not isinstance(raised.value, ConfigError)
    assert str(raised.value) == f"could not place 2 workers: {reason}"


def test_a_lost_slot_is_replaced_alone_and_the_survivor_keeps_its_actor(tmp_path):
    first = [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)]
    launcher, specs = _launcher_placing(tmp_path, [first])
    handles = launcher.start(specs(1))
    handles[1].lost, handles[1].returncode = "node lost", -9
    new = _FakeSlotActor(False, 5002)
    launcher._group = object()
    launcher._new_actor = lambda index, run_id: new if index == 1 else pytest.fail(f"slot {index} replaced")
    handles = launcher.start(specs(2))
    assert [s.actor for s in launcher._slots] == [first[0], new]
    assert (first[0].killed, first[1].killed, new.killed) == (False, True, False)
    assert [(h.pid, h.standby) for h in handles] == [(200, True), (201, True)]
    assert [launcher.describe(h)["node"] for h in handles] == ["node-0", "node-new"]
    assert [attempt for attempt, _ in first[0].starts] == [1, 2] and new.starts == [(2, ())]


def _rewrite(path, data: bytes) -> None:
    """What runner/outputs/tensorboard.py does to truncate an event file: a new file renamed over it."""
    tmp = path.with_name(path.name + ".rewrite")
    tmp.write_bytes(data)
    tmp.replace(path)


def test_pump_brings_back_tensorboard_appended_or_rewritten_and_the_model_but_no_temp_files(tmp_path):
    node, home = tmp_path / "node", tmp_path / "home"
    board = node / "tensorboard" / "events.out.tfevents.100.host"
    board.parent.mkdir(parents=True)
    board.write_bytes(b"r1r2")
    (node / "tensorboard" / ".events.out.tfevents.100.host.tmp-1a2b3c4d").write_bytes(b"half")  # a replacing() temp
    (node / "model" / "saved_model" / "variables").mkdir(parents=True)
    (node / "model" / "saved_model" / "variables" / "variables.data").write_bytes(b"weights")
    (node / "model" / "export.json").write_text("{}")
    (node / ".model.partial-x").mkdir()
    (node / ".model.partial-x" / "model.keras").write_bytes(b"half an export")
    pump = _Pump(node)
    first = pump.collect()
    assert sorted((c.path, c.replace) for c in first) == [
        ("model/export.json", True),
        ("model/saved_model/variables/variables.data", True),
        ("tensorboard/events.out.tfevents.100.host", False),
    ]
    apply_chunks(home, first)

    with open(board, "ab") as handle:
        handle.write(b"r3")
    appended = pump.collect()
    assert [(c.path, c.data, c.replace) for c in appended] == [("tensorboard/events.out.tfevents.100.host", b"r3", False)]
    apply_chunks(home, appended)
    assert (home / "tensorboard" / "events.out.tfevents.100.host").read_bytes() == b"r1r2r3"

    _rewrite(board, b"r1r2")  # a resumed chief dropped the step past its restore point
    apply_chunks(home, pump.collect())
    assert (home / "tensorboard" / "events.out.tfevents.100.host").read_bytes() == b"r1r2"
    assert pump.collect() == ()
    assert (home / "model" / "saved_model" / "variables" / "variables.data").read_bytes() == b"weights"
    assert sorted(p.name for p in home.iterdir()) == ["model", "tensorboard"]
    assert [p.name for p in (home / "tensorboard").iterdir()] == ["events.out.tfevents.100.host"]


def test_a_new_chief_slot_is_seeded_with_the_supervisors_tensorboard_and_does_not_send_it_back(tmp_path):
    from resilient_train.supervisor.launchers._slot import Slot, seed_chunks

    home = tmp_path / "home"
    (home / "tensorboard").mkdir(parents=True)
    (home / "tensorboard" / "events.out.tfevents.100.host").write_bytes(b"r1r2r3")
    slot = Slot(str(tmp_path / "node"), 0, python="/bin/true")  # the "worker" exits 0 at once
    slot.start(job(storage="s3://b/p").to_json(), 0, 2, {}, seed_chunks(home))
    seeded = slot.run_dir / "tensorboard" / "events.out.tfevents.100.host"
    assert seeded.read_bytes() == b"r1r2r3"
    assert [c.path for c in slot.poll().chunks if c.path.startswith("tensorboard/")] == []
    _rewrite(seeded, b"r1")  # the chief truncates to its restore point
    assert [(c.path, c.data, c.replace) for c in slot.poll().chunks] == [
        ("tensorboard/events.out.tfevents.100.host", b"r1", True)
    ]
    slot.close()


def test_closing_slots_returns_unsent_files_and_the_last_one_removes_the_nodes_run_dir(tmp_path):
    from resilient_train.supervisor.launchers._slot import Slot

    base = tmp_path / "resilient-train-ray" / "run-id"
    slots = [Slot(str(base), index, python="/bin/true") for index in (0, 1)]
    (base / "local" / "host-cache").mkdir()
    (slots[0].run_dir / "model").mkdir()
    (slots[0].run_dir / "model" / "export.json").write_text("{}")
    rest = slots[0].close(final=True)
    assert [(c.path, c.data) for c in rest] == [("model/export.json", b"{}")]
    assert sorted(p.name for p in base.iterdir()) == ["local", "slot-1"]  # slot 1 still uses the node dir
    slots[1].close()
    assert (base / "local" / "host-cache").is_dir()  # between attempts: the host cache stays
    slots = [Slot(str(base), 1, python="/bin/true")]
    assert slots[0].close(final=True) == ()
    assert not base.exists()


def test_slots_that_do_not_answer_on_a_restart_fail_the_run_not_the_cli(tmp_path):
    from resilient_train.errors import RestartNotPlacedError

    first = [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)]
    launcher, specs = _launcher_placing(tmp_path, [first])
    launcher.start(specs(1))

    def no_answer(host):
        raise _FakeRay.exceptions.GetTimeoutError("Get timed out")

    first[1].free_port = _Method(no_answer)
    with pytest.raises(RestartNotPlacedError, match=r"^could not place 2 workers: Ray slot actors did not answer within \d+ s"):
        launcher.start(specs(2))


@pytest.mark.parametrize(
    "resources, bundle, expected",
    [
        ({"CPU": 4.0}, {"CPU": 1.0}, 4),
        ({"CPU": 4.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, 1),
        ({"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0}, 0),
        ({"CPU": 1.5}, {"CPU": 2.0}, 0),
    ],
)
def test_bundles_on_counts_what_a_node_holds(resources, bundle, expected):
    from resilient_train.supervisor.launchers.ray import bundles_on

    assert bundles_on(resources, bundle) == expected


# ------------------------------------------------------------------ every Ray call on a slot
def _ray_deaths():
    """One of each death ray.exceptions reports on a call to an actor (the real classes)."""
    exceptions = pytest.importorskip("ray.exceptions")
    return [
        exceptions.ActorDiedError(),
        exceptions.ActorUnavailableError("The actor is temporarily unavailable: node unreachable", None),
        exceptions.RayActorError(error_msg="The actor died because its node has died."),
        exceptions.NodeDiedError("the node died"),
        exceptions.WorkerCrashedError(),
        exceptions.ObjectLostError("ab" * 14, None, ""),
        exceptions.ActorPlacementGroupRemoved(),
        exceptions.ActorUnschedulableError("no node can hold the bundle"),
    ]


class _RealErrorsRay(_FakeRay):
    """_FakeRay with the real ray.exceptions, and a cluster of ``alive`` nodes of 1 CPU."""

    def __init__(self, alive=("node-0", "node-1")):
        import ray.exceptions

        self.exceptions = ray.exceptions
        self.alive = list(alive)
        self.killed = []

    def kill(self, actor, no_restart=True):
        self.killed.append(actor)

    def nodes(self):
        return [{"NodeID": n, "Alive": True, "Resources": {"CPU": 1.0}} for n in self.alive]

    def is_initialized(self):
        return True


class _Refusing:
    """An actor method whose ``.remote()`` raises at once (Ray already knows the actor dead)."""

    def __init__(self, error):
        self.error = error

    def remote(self, *args):
        raise self.error


def _dead_actor(error):
    """A slot actor whose every call answers ``error`` (raised by ray.get, as Ray does)."""
    def die(*args):
        raise error
    actor = _FakeSlotActor(False, 0)
    for method in ("free_port", "start", "where", "close", "poll", "signal", "prestart_standby"):
        setattr(actor, method, _Method(die))
    return actor


@pytest.mark.parametrize("death", _ray_deaths(), ids=lambda e: type(e).__name__)
def test_every_death_ray_reports_on_a_slot_call_is_that_slot_lost(death):
    from resilient_train.supervisor.launchers.ray import RayLauncher, _SlotsLost

    launcher = RayLauncher(job(storage="s3://b/p"), ray_module=_RealErrorsRay())
    asked = []
    refs = {0: lambda: asked.append(0) or "answer", 1: _Method(lambda: (_ for _ in ()).throw(death)).remote()}
    with pytest.raises(_SlotsLost) as raised:
        launcher._answers(refs, timeout=5)
    assert (raised.value.slots, raised.value.cause) == ([1], death)


def test_a_slot_that_does_not_answer_in_time_is_a_timeout_not_a_loss():
    import ray.exceptions

    from resilient_train.supervisor.launchers.ray import RayLauncher

    fake = _RealErrorsRay()
    fake.wait = lambda refs, num_returns=1, timeout=None: ([], list(refs))
    launcher = RayLauncher(job(storage="s3://b/p"), ray_module=fake)
    with pytest.raises(ray.exceptions.GetTimeoutError, match=r"slots \[0\] did not answer within 5 s"):
        launcher._answers({0: lambda: "never"}, timeout=5)


def test_an_error_of_the_slots_own_code_is_not_a_loss():
    from resilient_train.supervisor.launchers.ray import RayLauncher

    launcher = RayLauncher(job(storage="s3://b/p"), ray_module=_RealErrorsRay())
    with pytest.raises(OSError, match="disk full"):
        launcher._answers({0: _Method(lambda: (_ for _ in ()).throw(OSError("disk full"))).remote()}, timeout=5)


@pytest.fixture
def removed_groups(monkeypatch):
    """The placement groups _release removes (Ray's remove_placement_group, faked)."""
    import importlib

    module = importlib.import_module("ray.util.placement_group")  # ray.util's attribute is the function
    removed = []
    monkeypatch.setattr(module, "remove_placement_group", removed.append)
    return removed


def _launcher_on(tmp_path, fake, actors, *, workers="2"):
    """A RayLauncher whose slots are ``actors`` (on node-<i>), in a fake placement group;
    the test fakes ``_new_actor`` and ``_place`` where it needs them."""
    from resilient_train.supervisor.launchers import ray as ray_launcher
    from resilient_train.supervisor.launchers.api import WorkerSpec

    min_workers = 1 if workers == "1:2" else None
    launcher = ray_launcher.RayLauncher(job(storage="s3://b/p", workers=2, min_workers=min_workers), ray_module=fake)
    launcher._slots = [ray_launcher._SlotState(a, f"node-{i}", "127.0.0.1") for i, a in enumerate(actors)]
    launcher._group = object()

    def specs(attempt, size=2):
        return [WorkerSpec(rank, attempt, launcher.job, {"RT_RUN_ID": "r"}, tmp_path) for rank in range(size)]

    return launcher, specs


def test_the_replacement_of_a_lost_chief_that_dies_on_its_dead_node_is_placed_anew(tmp_path, removed_groups):
    """Issue 30: the chief's node died; Ray put the replacement slot on that node's bundle
    before declaring the node dead, so its ``where`` answers ActorDiedError: a lost slot, and
    the attempt is placed anew (a spare here), not an error of the run."""
    import ray.exceptions

    fake = _RealErrorsRay(alive=("node-1", "node-2"))
    first = [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)]
    launcher, specs = _launcher_on(tmp_path, fake, first)
    handles = launcher._start_on_slots(specs(1))
    launcher._started = True
    handles[0].lost, handles[0].returncode = "slot actor lost", -9
    death = ray.exceptions.ActorDiedError()
    doomed = _dead_actor(death)
    launcher._new_actor = lambda index, run_id: doomed if index == 0 else pytest.fail(f"slot {index} replaced")
    placed = [_FakeSlotActor(False, 5002), _FakeSlotActor(False, 5003)]

    def place(count, *, run_id):
        assert count == 2
        from resilient_train.supervisor.launchers.ray import _SlotState
        launcher._slots = [_SlotState(a, f"node-{i + 1}", "127.0.0.1") for i, a in enumerate(placed)]

    launcher._place = place
    handles = launcher.start(specs(2))
    assert [h.pid for h in handles] == [200, 201]
    assert [s.actor for s in launcher._slots] == placed
    assert doomed in fake.killed and first[1] in fake.killed  # the first placement released whole
    assert len(removed_groups) == 1


@pytest.mark.parametrize("lost_slot", [0, 1])
def test_an_elastic_run_whose_replacement_slot_dies_asks_the_supervisor_for_a_smaller_size_at_once(
    tmp_path, lost_slot, removed_groups
):
    """The same death on a 2-node cluster with no spare: once Ray lists one node alive, a
    new placement of 2 cannot come, so start fails at once (the supervisor shrinks to 1)."""
    import ray.exceptions

    from resilient_train.errors import RestartNotPlacedError

    fake = _RealErrorsRay(alive=("node-0", "node-1"))
    first = [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)]
    launcher, specs = _launcher_on(tmp_path, fake, first, workers="1:2")
    handles = launcher._start_on_slots(specs(1))
    launcher._started = True
    handles[lost_slot].lost, handles[lost_slot].returncode = "slot actor lost", -9

    def new_actor(index, run_id):
        assert index == lost_slot
        fake.alive.remove(f"node-{lost_slot}")  # Ray declares the node dead while the actor waits there
        return _dead_actor(ray.exceptions.ActorDiedError())

    launcher._new_actor = new_actor
    with pytest.raises(RestartNotPlacedError) as raised:
        launcher.start(specs(2))
    assert str(raised.value) == "could not place 2 workers: Ray could not place 2 workers with {'CPU': 1.0} each: the alive nodes hold 1"
    assert launcher._slots == [] and len(removed_groups) == 1  # released: the smaller attempt places anew


def test_a_poll_that_answers_a_node_death_reports_the_worker_lost_with_its_node(tmp_path):
    import ray.exceptions

    from resilient_train.supervisor.launchers.ray import RayHandle

    fake = _RealErrorsRay(alive=("node-0",))
    launcher, _ = _launcher_on(tmp_path, fake, [_FakeSlotActor(False, 5000), _dead_actor(ray.exceptions.ActorDiedError())])
    launcher._handles = {0: RayHandle(launcher, 0, 100, False), 1: RayHandle(launcher, 1, 101, False)}
    launcher._slots[0].actor.poll = _Method(lambda wait_s: SlotReport(None))
    launcher.pump()  # sends the polls
    launcher.pump()  # takes the answers
    assert [(h.returncode, h.lost) for h in launcher._handles.values()] == [(None, None), (-9, "node lost")]


def test_an_unreachable_actor_on_a_node_listed_alive_is_polled_again_until_ray_declares_the_node_dead(tmp_path):
    """CI stop 58: the killed node's raylet stopped answering before the GCS declared it
    dead; the poll's ActorUnavailableError was taken as a death of the actor alone ("slot
    actor lost", no node_lost). Now the slot is polled again, and the death Ray reports once
    the node is declared dead names the node."""
    import ray.exceptions

    from resilient_train.supervisor.launchers.ray import RayHandle

    fake = _RealErrorsRay(alive=("node-0", "node-1"))
    answers = iter([ray.exceptions.ActorUnavailableError("node unreachable", None),
                    ray.exceptions.ActorUnavailableError("node unreachable", None),
                    ray.exceptions.ActorDiedError()])
    flaky = _FakeSlotActor(False, 5001)
    flaky.poll = _Method(lambda wait_s: (_ for _ in ()).throw(next(answers)))
    launcher, _ = _launcher_on(tmp_path, fake, [_FakeSlotActor(False, 5000), flaky])
    launcher._slots[0].actor.poll = _Method(lambda wait_s: SlotReport(None))
    launcher._handles = {0: RayHandle(launcher, 0, 100, False), 1: RayHandle(launcher, 1, 101, False)}
    events.configure(tmp_path / "events.jsonl", console=None)
    seen = []
    for _ in range(5):  # send, unavailable, send, unavailable, send
        launcher.pump()
        seen.append(launcher._handles[1].lost)
    fake.alive.remove("node-1")  # the GCS declares the node dead
    launcher.pump()  # ActorDiedError
    assert seen == [None] * 5
    assert (launcher._handles[1].returncode, launcher._handles[1].lost) == (-9, "node lost")
    lost = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "node_lost"]
    assert [(e["node"], e["error"]) for e in lost] == [("node-1", "ActorDiedError")]


def test_an_actor_unreachable_past_the_grace_is_lost_although_its_node_is_listed_alive(tmp_path):
    import ray.exceptions

    from resilient_train.supervisor.launchers import ray as ray_launcher

    clock = [1000.0]
    fake = _RealErrorsRay(alive=("node-0",))
    unreachable = _FakeSlotActor(False, 5000)
    unreachable.poll = _Refusing(ray.exceptions.ActorUnavailableError("node unreachable", None))
    launcher, _ = _launcher_on(tmp_path, fake, [unreachable])
    launcher.clock = lambda: clock[0]
    launcher._handles = {0: ray_launcher.RayHandle(launcher, 0, 100, False)}
    launcher.pump()
    clock[0] += ray_launcher.UNAVAILABLE_GRACE_S - 0.5
    launcher.pump()
    assert launcher._handles[0].returncode is None
    clock[0] += 0.5
    launcher.pump()
    assert (launcher._handles[0].returncode, launcher._handles[0].lost) == (-9, "slot actor lost")


def test_a_poll_ray_refuses_at_once_reports_the_worker_lost(tmp_path):
    import ray.exceptions

    from resilient_train.supervisor.launchers.ray import RayHandle

    fake = _RealErrorsRay(alive=("node-0", "node-1"))
    dead = _FakeSlotActor(False, 5001)
    dead.poll = _Refusing(ray.exceptions.ActorDiedError())
    launcher, _ = _launcher_on(tmp_path, fake, [_FakeSlotActor(False, 5000), dead])
    launcher._slots[0].actor.poll = _Method(lambda wait_s: SlotReport(None))
    launcher._handles = {0: RayHandle(launcher, 0, 100, False), 1: RayHandle(launcher, 1, 101, False)}
    assert (launcher._handles[1].poll(), launcher._handles[1].lost) == (-9, "slot actor lost")
    assert launcher._handles[0].returncode is None



def _launcher_polling(tmp_path, poll, close=None):
    """A RayLauncher with one running worker in slot 0, whose ``poll`` (and ``close``) are given;
    the run dir is ``tmp_path/run``."""
    import dataclasses

    from resilient_train.supervisor.launchers.ray import RayHandle

    actor = _FakeSlotActor(False, 5000)
    actor.poll = _Method(poll)
    if close is not None:
        actor.close = _Method(close)
    launcher, _ = _launcher_on(tmp_path, _RealErrorsRay(alive=("node-0",)), [actor])
    launcher.job = dataclasses.replace(launcher.job, run_dir=str(tmp_path / "run"))
    launcher._handles = {0: RayHandle(launcher, 0, 100, False)}
    return launcher


def test_pump_sends_the_next_long_poll_with_each_reply_until_the_exit(tmp_path):
    """Issue 33: no gap between polls; the slot's wait (POLL_INTERVAL_S) replaces the sleep."""
    from resilient_train.supervisor.launchers.ray import POLL_INTERVAL_S

    log = "attempt-1/worker-0.log"
    replies = [SlotReport(None, (FileChunk(log, b"a"),)), SlotReport(3, (FileChunk(log, b"b"),))]
    waits = []
    launcher = _launcher_polling(tmp_path, lambda wait_s: waits.append(wait_s) or replies.pop(0))
    launcher.pump()  # sends the first poll
    launcher.pump()  # takes its reply and sends the next one at once
    assert (waits, launcher._slots[0].pending is not None) == ([POLL_INTERVAL_S], True)
    launcher.pump()  # takes the exit: no poll after it
    assert waits == [POLL_INTERVAL_S, POLL_INTERVAL_S] and launcher._slots[0].pending is None
    assert launcher._handles[0].returncode == 3
    assert (tmp_path / "run" / log).read_bytes() == b"ab"


def test_closing_a_slot_first_takes_in_its_outstanding_poll(tmp_path, removed_groups):
    """The slot marked a poll reply's bytes sent when it answered: a dropped reply loses them."""
    log = "attempt-1/worker-0.log"
    launcher = _launcher_polling(tmp_path, lambda wait_s: SlotReport(None, (FileChunk(log, b"polled "),)),
                                 close=lambda final: (FileChunk(log, b"closed"),))
    launcher.pump()  # a poll is outstanding while the worker runs
    launcher._release(final=True)
    assert (tmp_path / "run" / log).read_bytes() == b"polled closed"
    assert launcher._slots == [] and len(removed_groups) == 1


def test_a_signal_names_the_workers_pid():
    from resilient_train.supervisor.launchers.ray import RayHandle, RayLauncher

    launcher = RayLauncher(job(storage="s3://b/p"), ray_module=_RealErrorsRay())
    told = []
    launcher._tell = lambda index, method, *args: told.append((index, method, *args))
    RayHandle(launcher, 1, 4242, False).send_signal(15)
    assert told == [(1, "signal", 15, 4242)]


def test_signals_standbys_and_release_on_a_dead_slot_do_not_raise(tmp_path):
    import ray.exceptions

    from resilient_train.supervisor.launchers.ray import RayHandle

    fake = _RealErrorsRay()
    dead = _dead_actor(ray.exceptions.ActorDiedError())
    dead.signal = dead.prestart_standby = _Refusing(ray.exceptions.ActorDiedError())
    alive = _FakeSlotActor(False, 5000)
    signalled = []
    alive.signal = _Method(lambda sig, pid: signalled.append(sig))
    alive.prestart_standby = _Method(lambda recipe: 1)
    launcher, _ = _launcher_on(tmp_path, fake, [alive, dead])
    launcher._handles = {0: RayHandle(launcher, 0, 100, False), 1: RayHandle(launcher, 1, 101, False)}
    launcher.signal(1, 15)
    launcher.signal(0, 15)
    launcher._prestarted = False
    launcher.job = launcher.job.__class__(**{**launcher.job.__dict__, "warm_standby": True})
    launcher.pump = lambda: None
    launcher.maintain(training=True)
    launcher._group = None
    launcher._release()
    assert fake.killed == [alive, dead] and launcher._slots == []


# ------------------------------------------------------------------ a preemption notice on one node
def _notice(tmp_path, attempt, rank, provider="gce"):
    from resilient_train.rundir.layout import RunDir

    attempt_dir = RunDir(tmp_path).attempt(attempt)
    attempt_dir.path.mkdir(parents=True, exist_ok=True)
    attempt_dir.notice(rank).write_text(json.dumps({"provider": provider, "kind": "preempted", "deadline": None}))
    return attempt_dir


@pytest.fixture
def placed_groups(monkeypatch):
    """The placement groups _place asks Ray for: (bundles, keyword arguments) each."""
    import importlib

    module = importlib.import_module("ray.util.placement_group")
    asked = []

    class Group:
        def ready(self):
            return lambda: None

    def placement_group(bundles, **kwargs):
        asked.append((bundles, kwargs))
        return Group()

    monkeypatch.setattr(module, "placement_group", placement_group)
    monkeypatch.setattr(module, "remove_placement_group", lambda group: None)
    return asked


def test_a_noticed_node_is_avoided_once_left_out_of_capacity_and_of_every_later_placement(tmp_path, placed_groups):
    fake = _RealErrorsRay(alive=("node-0", "node-1", "node-2"))
    launcher, specs = _launcher_on(tmp_path, fake, [_FakeSlotActor(False, 5000), _FakeSlotActor(False, 5001)])
    launcher._start_on_slots(specs(1))
    launcher._started = True
    from resilient_train.rundir.layout import RunDir

    assert launcher.avoid_noticed(RunDir(tmp_path).attempt(1)) == []  # no marker
    attempt_dir = _notice(tmp_path, 1, 1)
    assert launcher.capacity() == 3
    assert launcher.avoid_noticed(attempt_dir) == ["node-1"]
    assert launcher.avoid_noticed(attempt_dir) == []  # once
    assert launcher.capacity() == 2

    launcher._new_actor = lambda index, run_id: _FakeSlotActor(False, 6000 + index)
    handles = launcher.start(specs(2))  # the same size: the slot on node-1 forces a new group
    assert [h.pid for h in handles] == [200, 201]
    assert placed_groups == [([{"CPU": 1.0}] * 2, {"strategy": "SPREAD",
                                                   "bundle_label_selector": [{"ray.io/node-id": "!in(node-1)"}] * 2})]
    assert [s.node_id for s in launcher._slots] == ["node-new", "node-new"]


def test_without_a_notice_placement_has_no_label_selector(tmp_path, placed_groups):
    fake = _RealErrorsRay(alive=("node-0", "node-1"))
    launcher, specs = _launcher_on(tmp_path, fake, [])
    launcher._new_actor = lambda index, run_id: _FakeSlotActor(False, 6000 + index)
    launcher.start(specs(1))
    assert placed_groups == [([{"CPU": 1.0}] * 2, {"strategy": "SPREAD"})]
