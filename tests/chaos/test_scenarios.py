"""The catalogue's coverage, seeded planning, the nemesis' triggers and ops, the attempt-scoped faultfs shim.

The catalogue's files, their format and validation: test_catalogue.py."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from resilient_train.chaos import catalogue
from resilient_train.chaos.harness import JobSpec, _fault_env
from resilient_train.chaos.nemesis import EventReader, FaultState, Nemesis, corrupt_newest
from resilient_train.chaos.scenarios import ExternalFault, StorageFaults, Trigger, WorkerFault, plan, random_scenario
from resilient_train.checkpoint import CheckpointStore

REQUIRED_OPS = {"sigkill_worker", "sigterm_worker", "sigkill_supervisor", "sigterm_supervisor",
                "corrupt_newest", "sigkill_during_upload", "throttle_worker"}


CATALOGUE_DIR = Path(__file__).resolve().parents[2] / "chaos" / "scenarios"  # this clone's, whatever the environment
CATALOGUE = catalogue.load_catalogue(CATALOGUE_DIR)


def by_name(name: str):
    return catalogue.by_name(name, CATALOGUE_DIR)


def test_the_catalogue_covers_every_nemesis_op_and_has_unique_names() -> None:
    names = [s.name for s in CATALOGUE]
    assert len(names) == len(set(names))
    ops = {f.op for s in CATALOGUE for f in s.faults if isinstance(f, ExternalFault)}
    assert ops == REQUIRED_OPS
    storage = {k for s in CATALOGUE for f in s.faults if isinstance(f, StorageFaults) for k, _ in f.spec}
    assert {"transient_rate", "stop_after_files", "latency_s"} <= storage
    assert any(len(s.faults) >= 3 for s in CATALOGUE)  # several faults in one run
    hangs = {f.point for s in CATALOGUE for f in s.faults if isinstance(f, WorkerFault) and f.hangs}
    assert hangs == {"input", "after_step"}  # hang-input, hang-collective


def test_the_seeds_experiment_is_exact() -> None:
    seed = by_name("kill-chief-at-7")
    assert seed.overrides == {"save_every_steps": 1}
    assert seed.faults == (WorkerFault("after_commit", 7, rank=0, attempt=1, signal="SIGKILL"),)
    assert seed.expect_restored == (7,)


def test_plan_resolves_random_choices_from_the_seed_only() -> None:
    scenario = by_name("kill-random-worker")
    plans = {seed: plan(scenario, seed, workers=4) for seed in range(20)}
    assert plans[3] == plan(scenario, 3, workers=4)
    ranks = {p.faults[0].rank for p in plans.values()}
    nths = {p.faults[0].trigger.nth for p in plans.values()}
    assert ranks <= {0, 1, 2, 3} and len(ranks) > 1
    assert nths <= {1, 2, 3} and len(nths) > 1


def test_plan_refuses_a_rank_outside_the_job() -> None:
    with pytest.raises(ValueError, match="rank=1 with workers=1"):
        plan(by_name("sigterm-worker"), 0, workers=1)


def test_random_scenarios_are_reproducible() -> None:
    first = [random_scenario(random.Random(5), i, total_steps=30, save_every=5) for i in range(1)]
    rng_a, rng_b = random.Random(11), random.Random(11)
    a = [random_scenario(rng_a, i, total_steps=30, save_every=5) for i in range(10)]
    b = [random_scenario(rng_b, i, total_steps=30, save_every=5) for i in range(10)]
    assert a == b and first
    for scenario in a:
        commits = [f for f in scenario.faults if isinstance(f, WorkerFault) and "commit" in f.point]
        assert all(f.global_step % 5 == 0 and f.global_step < 30 for f in commits)


def test_fault_env_arms_worker_faults_and_attempt_scoped_storage_faults() -> None:
    faults = (WorkerFault("after_step", 8, rank=0), StorageFaults.of(attempts=(1,), stop_after_files=4),
              StorageFaults.of(attempts=None, latency_s=0.01))
    env = _fault_env(faults, {"RT_FAULTFS": "{}", "PYTHONPATH": "/x"})
    assert json.loads(env["RT_FAULTS"]) == [
        {"point": "after_step", "global_step": 8, "rank": 0, "attempt": 1, "signal": "SIGKILL"}]
    slow = _fault_env((WorkerFault("slow", 0, rank=1, factor=3),), {})
    assert json.loads(slow["RT_FAULTS"]) == [
        {"point": "slow", "global_step": 0, "rank": 1, "attempt": 1, "signal": "SIGKILL", "factor": 3}]
    assert json.loads(env["RT_CHAOS_FAULTFS"]) == {"1": {"stop_after_files": 4}, "*": {"latency_s": 0.01}}
    assert "RT_FAULTFS" not in env
    assert env["PYTHONPATH"] == "/x"  # faultfs reads the attempt's entry itself (test_faultfs.py)


def test_hang_scenarios_plan_the_rank_the_checker_expects() -> None:
    for name, point in (("hang-input", "input"), ("hang-collective", "after_step")):
        planned = {seed: plan(by_name(name), seed, workers=3) for seed in range(12)}
        ranks = {p.faults[0].rank for p in planned.values()}
        assert ranks == {0, 1, 2}
        for p in planned.values():
            [fault] = p.faults
            assert (fault.point, fault.signal, fault.attempt) == (point, "HANG", 1)
            assert p.expected_hangs == {1: fault.rank}
            assert p.overrides == {"hang_timeout": 10}
        assert {p.input_faults for p in planned.values()} == {point == "input"}


def test_an_input_fault_must_hang() -> None:
    with pytest.raises(ValueError, match="point='input' with signal='SIGKILL'"):
        WorkerFault("input", 3)


def test_soak_scenarios_never_draw_a_hang_or_an_input_fault() -> None:
    rng = random.Random(3)
    faults = [f for i in range(200) for f in random_scenario(rng, i, total_steps=30, save_every=5).faults
              if isinstance(f, WorkerFault)]
    assert faults and not any(f.hangs or f.point in ("input", "before_join") for f in faults)


def test_event_reader_waits_for_a_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    reader = EventReader(path)
    assert reader.read_new() == []
    path.write_text('{"event": "a"}\n{"event": "b", ')
    assert reader.read_new() == [{"event": "a"}]
    with open(path, "a") as handle:
        handle.write('"x": 1}\n')
    assert reader.read_new() == [{"event": "b", "x": 1}]


class _Job:
    """A run dir the test appends events and step markers to, like a live job."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.events = root / "events.jsonl"

    def ev(self, **record: object) -> None:
        with open(self.events, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def step(self, attempt: int, step: int) -> None:
        (self.root / f"attempt-{attempt}").mkdir(exist_ok=True)
        (self.root / f"attempt-{attempt}" / "step-0.txt").write_text(f"{step:<20}\n")


def _nemesis(tmp_path: Path, faults: list[ExternalFault], kills: list[tuple[int, int]]) -> Nemesis:
    return Nemesis(tmp_path, faults, storage_url=str(tmp_path / "ckpts"), steps_per_epoch=10,
                   rng=random.Random(0), supervisor_pid=lambda: 4242, kill=lambda pid, sig: kills.append((pid, sig)))


def test_a_mid_epoch_kill_waits_for_the_nth_commit_and_a_step_past_it(tmp_path: Path) -> None:
    job, kills = _Job(tmp_path), []
    nemesis = _nemesis(tmp_path, [ExternalFault("sigkill_worker", Trigger(nth=2), rank=1)], kills)
    job.ev(event="worker_started", rank=0, pid=100, attempt=1, role="supervisor")
    job.ev(event="worker_started", rank=1, pid=101, attempt=1, role="supervisor")
    job.ev(event="checkpoint_committed", global_step=5, attempt=1, role="chief")
    job.step(1, 7)
    assert nemesis.poll() == [] and kills == []
    job.ev(event="checkpoint_committed", global_step=10, attempt=1, role="chief")
    job.step(1, 10)
    assert nemesis.poll() == [] and kills == []  # step 10 is an epoch end, not mid-epoch
    job.step(1, 11)
    done = nemesis.poll()
    assert kills == [(101, signal.SIGKILL)]
    assert done[0]["reached_step"] == 11 and done[0]["trigger_step"] == 10
    assert nemesis.poll() == [] and len(kills) == 1  # once
    injected = [json.loads(line) for line in job.events.read_text().splitlines()][-1]
    assert injected["event"] == "chaos_fault_injected" and injected["pid"] == 101


def test_an_attempt_scoped_trigger_ignores_other_attempts_and_a_missed_fault_is_reported(tmp_path: Path) -> None:
    job, kills = _Job(tmp_path), []
    nemesis = _nemesis(tmp_path, [ExternalFault("sigterm_supervisor", Trigger(nth=1, attempt=2, mid_epoch=False))], kills)
    job.ev(event="worker_started", rank=0, pid=100, attempt=1, role="supervisor")
    job.ev(event="checkpoint_committed", global_step=5, attempt=1, role="chief")
    nemesis.poll()
    nemesis.finish()
    assert kills == []
    assert nemesis.results()[0]["state"] == FaultState.MISSED.value


def test_corrupt_newest_flips_one_byte_and_verify_names_exactly_that_file(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpts"), emit=lambda *a, **k: None)
    for step in (5, 10):
        local = tmp_path / f"local-{step}"
        local.mkdir()
        (local / "ckpt.index").write_bytes(b"i" * 10)
        (local / "ckpt.data-00000-of-00001").write_bytes(b"d" * 64)
        store.commit(local, run_id="r", epoch=0, step_in_epoch=step, global_step=step, world_size=2,
                     weights_sha256="ab" * 32, tf_version="2.21")
    before = (tmp_path / "ckpts" / "ckpt-000000000010" / "ckpt.data-00000-of-00001").read_bytes()
    done = corrupt_newest(str(tmp_path / "ckpts"), random.Random(1))
    after = (tmp_path / "ckpts" / "ckpt-000000000010" / "ckpt.data-00000-of-00001").read_bytes()
    assert [i for i in range(len(before)) if before[i] != after[i]] == [done["offset"]]
    assert done["global_step"] == 10 and done["file"] == "ckpt.data-00000-of-00001"
    assert done["verify_exit"] == 1 and done["verify_exact"]
    assert done["verify_bad"] == ["10: corrupt: sha256 mismatch in ckpt.data-00000-of-00001"]


def test_job_spec_key_depends_on_the_parameters_and_the_recipe_bytes(tmp_path: Path) -> None:
    recipe = tmp_path / "r.py"
    recipe.write_text("DEFAULTS = {'epochs': 2, 'steps_per_epoch': 4, 'save_every_steps': 2}\n")
    spec = JobSpec(str(recipe))
    assert spec.resolved().total_steps == 8
    assert spec.key() == JobSpec(str(recipe), epochs=2).key()  # same resolved parameters
    assert spec.key() != JobSpec(str(recipe), save_every_steps=1).key()
    key = spec.key()
    recipe.write_text("DEFAULTS = {'epochs': 2, 'steps_per_epoch': 4, 'save_every_steps': 2}\n# edited\n")
    assert spec.key() != key


def test_never_joins_plans_the_rank_the_checker_expects_and_stalled_storage_its_attempt() -> None:
    planned = {seed: plan(by_name("never-joins"), seed, workers=3) for seed in range(12)}
    assert {p.faults[0].rank for p in planned.values()} == {0, 1, 2}
    for p in planned.values():
        [fault] = p.faults
        assert (fault.point, fault.global_step, fault.attempt, fault.hangs) == ("before_join", 0, 1, False)
        assert p.expected_unreachable == {1: fault.rank} and p.expected_hangs == {} and p.stalled_attempts == ()
        assert p.overrides == {"startup_timeout": 30}
    stalled = plan(by_name("stalled-storage"), 0, workers=2)
    assert stalled.stalled_attempts == (1,) and stalled.expected_unreachable == {}
    assert stalled.overrides == {"storage_timeout": 1}
    assert plan(by_name("storage-slow"), 0, workers=2).stalled_attempts == ()  # latency is no stall


def test_a_before_join_fault_is_at_step_0_and_does_not_hang() -> None:
    with pytest.raises(ValueError, match="point='before_join' with global_step=3, signal='SIGKILL'; expected global_step=0"):
        WorkerFault("before_join", 3)
    with pytest.raises(ValueError, match="point='before_join' with global_step=0, signal='HANG'"):
        WorkerFault("before_join", 0, signal="HANG")


def test_job_timeouts_become_flags_and_stay_out_of_the_reference_key(tmp_path: Path) -> None:
    recipe = tmp_path / "r.py"
    recipe.write_text("DEFAULTS = {'epochs': 2, 'steps_per_epoch': 4, 'save_every_steps': 2}\n")
    spec = JobSpec(str(recipe)).with_overrides({"storage_timeout": 1, "startup_timeout": 30})
    argv = spec.argv(tmp_path / "run", "/ckpts")
    assert argv[argv.index("--storage-timeout") + 1] == "1" and argv[argv.index("--startup-timeout") + 1] == "30"
    assert "--hang-timeout" not in argv and "--startup-timeout" not in JobSpec(str(recipe)).argv(tmp_path, "/c")
    assert spec.key() == JobSpec(str(recipe)).key()


def test_ps_scenarios_plan_ranks_of_the_ps_cluster_and_run_under_the_ps_strategy(tmp_path: Path) -> None:
    ps_kill = plan(by_name("ps-kill"), 0, workers=by_name("ps-kill").ranks(2))
    assert ps_kill.parameter_server and ps_kill.ranks(2) == 4  # coordinator, 1 ps, 2 workers
    assert ps_kill.faults == (ExternalFault("sigkill_worker", Trigger(nth=2), rank=1),)
    worker_kill = by_name("ps-worker-kill")
    ranks = {plan(worker_kill, seed, workers=worker_kill.ranks(2)).faults[0].rank for seed in range(12)}
    assert ranks == {2, 3}  # a worker, never the coordinator or the ps
    recipe = tmp_path / "r.py"
    recipe.write_text("DEFAULTS = {'epochs': 3, 'steps_per_epoch': 10, 'save_every_steps': 5}\n")
    spec = JobSpec(str(recipe)).with_overrides(ps_kill.overrides)
    argv = spec.argv(tmp_path / "run", "/ckpts")
    assert argv[argv.index("--strategy") + 1:argv.index("--strategy") + 4] == ["parameter-server", "--ps", "1"]
    assert spec.resolved().total_steps == 100 and spec.key() != JobSpec(str(recipe)).key()
    assert "--strategy" not in JobSpec(str(recipe)).argv(tmp_path, "/c")


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_throttle_stops_and_continues_the_worker_until_it_exits_and_leaves_it_continued(monkeypatch) -> None:
    from resilient_train.chaos import nemesis as nemesis_module
    from resilient_train.chaos.nemesis import Throttle

    monkeypatch.setattr(nemesis_module, "_children", lambda pid: [pid + 1])  # one child, listed every second
    clock, sent, alive = _FakeClock(), [], {101: True}

    def kill(pid: int, sig: int) -> None:
        if pid == 101 and not alive[101]:
            raise ProcessLookupError(pid)
        sent.append((pid, sig))
        if len([s for s in sent if s == (101, signal.SIGCONT)]) == 3:
            alive[101] = False  # the worker exits after the third continue
    throttle = Throttle(101, 0.05, 0.05, kill=kill, sleep=clock.sleep, clock=clock)
    throttle.run()
    stop, cont = signal.SIGSTOP, signal.SIGCONT
    assert sent == [(101, stop), (102, stop), (101, cont), (102, cont)] * 3 + [(102, cont)]
    assert (throttle.cycles, clock.now) == (3, pytest.approx(0.3))
    sent.clear()
    stopped = Throttle(7, 0.05, 0.05, kill=lambda pid, sig: sent.append((pid, sig)), sleep=clock.sleep, clock=clock)
    stopped._stopped.set()  # finish() before the first cycle: it still leaves the worker continued
    stopped.run()
    assert sent == [(7, cont)]


def test_the_nemesis_throttles_the_ranks_pid_once_and_finish_ends_it(tmp_path: Path, monkeypatch) -> None:
    from resilient_train.chaos import nemesis as nemesis_module

    started = []
    monkeypatch.setattr(nemesis_module.Throttle, "start", lambda self: started.append(self) or self)
    monkeypatch.setattr(nemesis_module.Throttle, "stop", lambda self: started.remove(self))
    job, kills = _Job(tmp_path), []
    fault = ExternalFault("throttle_worker", Trigger(event="first_step", mid_epoch=False), rank=1, stop_ms=30, run_ms=70)
    nemesis = _nemesis(tmp_path, [fault], kills)
    job.ev(event="worker_started", rank=1, pid=101, attempt=1, role="supervisor")
    job.ev(event="first_step", global_step=1, attempt=1, role="chief")
    [done] = nemesis.poll()
    assert (done["op"], done["rank"], done["pid"], done["stop_ms"], done["run_ms"]) == ("throttle_worker", 1, 101, 30, 70)
    assert [(t.pid, t.stop_s, t.run_s) for t in started] == [(101, 0.03, 0.07)] and kills == []
    assert fault.describe() == ("throttle_worker rank 1 (30 ms stopped / 70 ms running) after 1st first_step of "
                                "attempt 1")
    nemesis.finish()
    assert started == []


@pytest.mark.parametrize("kwargs", [{"stop_ms": 0}, {"run_ms": 2.5}, {"stop_ms": True}])
def test_a_throttles_duty_cycle_is_whole_milliseconds(kwargs) -> None:
    with pytest.raises(ValueError, match="expected milliseconds, an integer >= 1"):
        ExternalFault("throttle_worker", **kwargs)


def test_the_harness_asks_the_throttled_rank_to_be_named_after_the_throttle() -> None:
    from resilient_train.chaos.harness import _throttle_named

    fault = {"op": "throttle_worker", "rank": 1, "attempt": 1, "state": "done"}
    injected = {"event": "chaos_fault_injected", "op": "throttle_worker", "rank": 1, "attempt": 1,
                "ts": "2026-11-29T10:00:05.000+00:00"}
    named = {"event": "straggler_detected", "rank": 1, "attempt": 1, "ts": "2026-11-29T10:00:20.000+00:00"}
    assert _throttle_named(fault, [injected, named])
    assert not _throttle_named(fault, [injected, dict(named, rank=0)])  # another rank
    assert not _throttle_named(fault, [injected, dict(named, ts="2026-11-29T10:00:04.000+00:00")])  # before it
    assert not _throttle_named(fault, [named])  # never throttled
