"""The supervisor's run loop driven through its seams: fake processes, clock and sleep.

No TensorFlow and no real waiting: each fake worker follows a script (exit at time t,
or on a signal), and the test asserts the exact signals, times, events and exit code.
"""

from __future__ import annotations

import io
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from resilient_train.checkpoint import CheckpointStore
from resilient_train.job.config import JobConfig
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_PREEMPTED, RestartNotPlacedError
from resilient_train.job.recipe import recipe_name
from resilient_train.supervisor.launchers import Launcher
from resilient_train.supervisor.launchers.local import LocalLauncher
from resilient_train.supervisor.policy import RestartPolicy, RestartTracker
from resilient_train.supervisor.signals import NoSignals
from resilient_train.supervisor.supervisor import Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class FakeProcess:
    pid: int
    clock: FakeClock
    exit_at: float | None = None          # exits by itself at this time ...
    exit_code: int = 0                     # ... with this code
    on_sigterm: int | None = None          # code to exit with when SIGTERMed (None: ignore)
    signals: list[tuple[str, float]] = field(default_factory=list)
    returncode: int | None = None
    on_exit: Callable[[int], None] | None = None  # told the exit code once, as a real chief commits

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_at is not None and self.clock.now >= self.exit_at:
            self.returncode = self.exit_code
            if self.on_exit is not None:
                self.on_exit(self.returncode)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append((signal.Signals(sig).name, round(self.clock.now - 1000.0, 3)))
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL:
            self.returncode = -signal.SIGKILL
        elif sig == signal.SIGTERM and self.on_sigterm is not None:
            self.returncode = self.on_sigterm


def commit_completed(storage: Path, recipe: str) -> None:
    """What a real chief does before exiting 0: commit the final, ``completed`` checkpoint."""
    local = storage.parent / "fake-ckpt"
    local.mkdir(exist_ok=True)
    (local / "weights").write_bytes(b"w")
    CheckpointStore(str(storage)).commit(
        local, run_id="fake", epoch=1, step_in_epoch=0, global_step=10, world_size=2,
        weights_sha256="0" * 64, tf_version="fake", extra={"completed": True, "recipe": recipe_name(recipe)},
    )


class FakeSpawner:
    """Hands out scripted processes in order; remembers each call's env.

    A chief (rank 0) that exits 0 commits a completed checkpoint first, as a real one does,
    unless its script says ``"commits": False``.
    """

    def __init__(self, clock: FakeClock, scripts: list[dict], storage: Path | None = None, recipe: str = "") -> None:
        self.clock = clock
        self.scripts = list(scripts)
        self.storage = storage
        self.recipe = recipe
        self.calls: list[dict] = []
        self.processes: list[FakeProcess] = []

    def __call__(self, argv, env, log_path: Path) -> FakeProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("fake worker log line\n")
        script = dict(self.scripts.pop(0))
        commits = script.pop("commits", True)
        process = FakeProcess(pid=4000 + len(self.processes), clock=self.clock, **script)
        if commits and json.loads(env["TF_CONFIG"])["task"]["index"] == 0 and self.storage is not None:
            process.on_exit = lambda code: code == 0 and commit_completed(self.storage, self.recipe)
        if process.exit_at is not None:  # scripts give seconds after the spawn
            process.exit_at += self.clock.now
        self.calls.append({"argv": argv, "env": env})
        self.processes.append(process)
        return process


def make(tmp_path: Path, scripts: list[dict], *, launcher_from: Callable[..., Launcher] | None = None,
         **job_kwargs) -> tuple[Supervisor, FakeSpawner, FakeClock, io.StringIO]:
    """``launcher_from(launcher, job=, spawner=, clock=)``: the launcher the supervisor gets instead
    of the LocalLauncher over the fake spawner (a wrapper, or one of the test's own)."""
    clock = FakeClock()
    out = io.StringIO()
    job = JobConfig(
        recipe="recipes/linear_regression.py",
        run_dir=str(tmp_path / "run"),
        warm_standby=False,
        **job_kwargs,
    )
    spawner = FakeSpawner(clock, scripts, storage=tmp_path / "run" / "checkpoints", recipe=job.recipe)
    launcher: Launcher = LocalLauncher(job, spawner=spawner)
    if launcher_from is not None:
        launcher = launcher_from(launcher, job=job, spawner=spawner, clock=clock)
    supervisor = Supervisor(job, out=out, launcher=launcher, clock=clock.time, sleep=clock.sleep, backoff_initial_s=0.25)
    return supervisor, spawner, clock, out


def events(tmp_path: Path, name: str) -> list[dict]:
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == name]


def run_states(tmp_path: Path) -> list[tuple[str, str, int | None]]:
    return [(e["from"], e["to"], e["attempt"]) for e in events(tmp_path, "run_state")]


def test_tf_config_and_gpu_slices_per_rank(tmp_path):
    supervisor, spawner, _, _ = make(tmp_path, [{"exit_at": 0.0}, {"exit_at": 0.0}], gpus_per_worker=2)
    assert supervisor.run() == EXIT_OK
    configs = [json.loads(call["env"]["TF_CONFIG"]) for call in spawner.calls]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    assert [call["env"]["CUDA_VISIBLE_DEVICES"] for call in spawner.calls] == ["0,1", "2,3"]
    assert [call["env"]["RT_ATTEMPT"] for call in spawner.calls] == ["1", "1"]
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "succeeded", 1),
    ]


def test_without_gpus_cuda_visible_devices_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    supervisor, spawner, _, _ = make(tmp_path, [{"exit_at": 0.0}, {"exit_at": 0.0}])
    assert supervisor.run() == EXIT_OK
    assert ["CUDA_VISIBLE_DEVICES" in call["env"] for call in spawner.calls] == [False, False]


def test_failed_non_chief_chief_gets_teardown_grace_then_sigkill(tmp_path):
    scripts = [{"exit_at": None}, {"exit_at": 0.5, "exit_code": -signal.SIGKILL}]
    # Without the memory tier: no rescue request before the teardown (tests/supervisor/test_rescue.py).
    supervisor, spawner, clock, out = make(tmp_path, scripts, max_restarts=0, snapshot_every="off")
    assert supervisor.run() == EXIT_FAILURE
    chief = spawner.processes[0]
    (term, term_at), (kill, kill_at) = chief.signals
    assert (term, kill) == ("SIGTERM", "SIGKILL")
    assert 0.5 <= term_at <= 0.55  # within one 50 ms poll of the death
    assert 3.0 <= kill_at - term_at <= 3.05  # the 3 s teardown grace
    assert [e["rank"] for e in events(tmp_path, "worker_failed")] == [1, 0]
    assert len(events(tmp_path, "restart_budget_exhausted")) == 1
    assert "root cause: worker 1" in out.getvalue() and "killed by SIGKILL" in out.getvalue()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["attempts"], summary["root_cause"]["rank"]) == ("failed", 1, 1)
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "stopping", 1), ("stopping", "failed", 1),
    ]
    stopping, failed = events(tmp_path, "run_state")[2:]
    assert stopping["reason"] == "worker 1 exited abnormally"
    assert failed["reason"] == events(tmp_path, "restart_budget_exhausted")[0]["reason"]
    assert failed["reason"].startswith("restart budget exhausted: attempt 1 failed")


def test_dead_chief_means_the_others_are_killed_at_once(tmp_path):
    scripts = [{"exit_at": 0.5, "exit_code": -signal.SIGKILL}, {"exit_at": None}]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=0, snapshot_every="off")  # no rescue asked
    assert supervisor.run() == EXIT_FAILURE
    (term, term_at), (kill, kill_at) = spawner.processes[1].signals
    assert (term, kill) == ("SIGTERM", "SIGKILL") and term_at == kill_at and 0.5 <= term_at <= 0.55


def test_gang_restart_after_a_failure_then_success(tmp_path):
    scripts = [
        {"exit_at": 1.0, "exit_code": -signal.SIGKILL}, {"exit_at": None, "on_sigterm": 1},  # attempt 1
        {"exit_at": 2.0}, {"exit_at": 2.0},                                                 # attempt 2
    ]
    supervisor, spawner, clock, _ = make(tmp_path, scripts, max_restarts=2)
    assert supervisor.run() == EXIT_OK
    restarts = events(tmp_path, "gang_restart")
    assert [(r["attempt"], r["root_cause_rank"]) for r in restarts] == [(2, 0)]
    assert restarts[0]["backoff_s"] == 0.0  # the first failure of a streak restarts at once
    assert [c["env"]["RT_ATTEMPT"] for c in spawner.calls] == ["1", "1", "2", "2"]
    ports = [json.loads(c["env"]["TF_CONFIG"])["cluster"]["worker"] for c in spawner.calls]
    assert ports[0] == ports[1] and ports[2] == ports[3]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["attempts"], summary["restarts"]) == ("completed", 2, 1)
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "stopping", 1),
        ("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "running", 2),
        ("running", "succeeded", 2),
    ]
    assert events(tmp_path, "run_state")[3]["reason"] == restarts[0]["reason"]


def test_a_worker_preempted_restarts_without_spending_the_budget(tmp_path):
    scripts = [
        {"exit_at": 1.0, "exit_code": EXIT_PREEMPTED}, {"exit_at": 1.2, "exit_code": EXIT_PREEMPTED},
        {"exit_at": 2.0}, {"exit_at": 2.0},
    ]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=0)
    assert supervisor.run() == EXIT_OK
    # the peer of a preempted worker is saving the agreed step: it is not signalled
    assert spawner.processes[1].signals == []
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["preemptions"], summary["restarts"], summary["attempts"]) == (1, 0, 2)
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "stopping", 1),
        ("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "running", 2),
        ("running", "succeeded", 2),
    ]


def test_supervisor_sigterm_is_forwarded_and_exit_code_is_143(tmp_path):
    scripts = [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED}]
    supervisor, spawner, clock, _ = make(tmp_path, scripts)
    original_sleep = clock.sleep

    def sleep_then_signal(seconds: float) -> None:
        original_sleep(seconds)
        if clock.now - 1000.0 >= 1.0:
            supervisor.stop.request("SIGTERM")  # what the signal handler records

    supervisor.group.sleep = sleep_then_signal
    assert supervisor.run() == EXIT_PREEMPTED
    assert [p.signals[0][0] for p in spawner.processes] == ["SIGTERM", "SIGTERM"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "preempted"
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "stopping", 1), ("stopping", "preempted", 1),
    ]
    assert [e.get("reason") for e in events(tmp_path, "run_state")][2:] == ["stop requested (SIGTERM)"] * 2


def test_workers_exiting_0_without_a_completed_checkpoint_is_not_success(tmp_path):
    # e.g. memory:// storage: each worker's checkpoints live in its own process
    scripts = [{"exit_at": 1.0, "commits": False}, {"exit_at": 1.0}]
    supervisor, _, _, out = make(tmp_path, scripts, max_restarts=0)
    assert supervisor.run() == EXIT_FAILURE
    [incomplete] = events(tmp_path, "attempt_incomplete")
    assert (incomplete["attempt"], incomplete["storage"]) == (1, str(tmp_path / "run" / "checkpoints"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["weights_sha256"], summary["root_cause"]["type"]) == ("failed", None, "IncompleteRun")
    assert "workers exited 0 but no completed checkpoint is in storage" in out.getvalue()
    assert "Run completed" not in out.getvalue()


def test_a_frozen_worker_is_the_root_cause_that_stopped_responding(tmp_path, monkeypatch):
    """SIGSTOP on worker 1: the chief fails out of its collective (secondary), the supervisor
    SIGKILLs the frozen worker, and the root cause says it stopped responding."""
    from resilient_train.rundir.errorfile import record_exception

    class UnavailableError(Exception):
        pass

    monkeypatch.setattr("resilient_train.supervisor.topology.is_frozen", lambda pid: pid == 4001)
    scripts = [{"exit_at": 0.5, "exit_code": EXIT_FAILURE}, {"exit_at": None}]
    supervisor, spawner, _, out = make(tmp_path, scripts, max_restarts=0)
    spawn = spawner.__call__

    def spawn_and_record_the_chiefs_peer_error(argv, env, log_path):
        process = spawn(argv, env, log_path)
        if len(spawner.processes) == 1:  # the chief fails out of its collective
            record_exception(log_path.parent, 0, UnavailableError("Collective ops is aborted by: peer"), global_step=7)
        return process

    supervisor.launcher.spawner = spawn_and_record_the_chiefs_peer_error
    assert supervisor.run() == EXIT_FAILURE
    assert "root cause: worker 1 (pid 4001) stopped responding (process stopped, e.g. SIGSTOP; " \
           "the supervisor SIGKILLed it) at global_step 7" in out.getvalue()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["root_cause"]["exit"].startswith("stopped responding")


class _LauncherLosingItsPlacement(LocalLauncher):
    """A launcher whose restart finds no placement (the node is gone, no spare).

    Attempt 1's chief "reaches" step 11 (its step marker) before rank 1 is killed.
    """

    def start(self, specs):
        if specs[0].attempt > 1:
            raise RestartNotPlacedError("could not place 2 workers: no node has {'CPU': 2.0} free")
        (specs[0].attempt_dir / "step-0.txt").write_text("11\n")
        return super().start(specs)


def test_a_restart_that_cannot_be_placed_fails_the_run_keeping_the_last_commit(tmp_path):
    clock, out = FakeClock(), io.StringIO()
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), warm_standby=False)
    storage = tmp_path / "run" / "checkpoints"
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "weights").write_bytes(b"w")
    CheckpointStore(str(storage)).commit(
        local, run_id="fake", epoch=0, step_in_epoch=8, global_step=8, world_size=2,
        weights_sha256="1" * 64, tf_version="fake", extra={"recipe": recipe_name(job.recipe)},
    )
    scripts = [{"exit_at": None, "on_sigterm": 1}, {"exit_at": 1.0, "exit_code": -signal.SIGKILL}]
    launcher = _LauncherLosingItsPlacement(job, spawner=FakeSpawner(clock, scripts))
    supervisor = Supervisor(job, out=out, launcher=launcher, clock=clock.time, sleep=clock.sleep)

    assert supervisor.run() == EXIT_FAILURE
    assert [e["attempt"] for e in events(tmp_path, "gang_restart")] == [2]
    failed = events(tmp_path, "launch_failed")
    assert [(e["attempt"], e["launcher"]) for e in failed] == [(2, "local")]
    assert failed[0]["reason"] == "could not place 2 workers: no node has {'CPU': 2.0} free"
    finished = events(tmp_path, "run_finished")
    assert [(e["status"], e["global_step"]) for e in finished] == [("failed", 8)]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["global_step"], summary["weights_sha256"]) == ("failed", 8, "1" * 64)
    assert summary["root_cause"] == {
        "rank": None, "pid": None, "exit": "not started", "type": "RestartNotPlacedError",
        "message": "could not place 2 workers: no node has {'CPU': 2.0} free", "global_step": 11, "attempt": 2,
    }
    assert "Stopping: attempt 2 could not start: could not place 2 workers" in out.getvalue()
    assert run_states(tmp_path)[-3:] == [("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "failed", 2)]


def test_injected_signals_tracker_and_store_are_the_ones_used(tmp_path):
    """A stop signal through the injected installer, backoffs from the injected tracker."""
    clock, out = FakeClock(), io.StringIO()
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), warm_standby=False, max_restarts=5)
    scripts = [
        {"exit_at": 1.0, "exit_code": 1}, {"exit_at": None, "on_sigterm": 1},                           # attempt 1 fails
        {"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED},  # attempt 2
    ]
    spawner = FakeSpawner(clock, scripts, storage=tmp_path / "run" / "checkpoints", recipe=job.recipe)
    signals = NoSignals()
    lookups: list[str] = []

    class CountingStore(CheckpointStore):
        def latest_manifest(self, *args, **kwargs):
            lookups.append("latest")
            return super().latest_manifest(*args, **kwargs)

    tracker = RestartTracker(RestartPolicy(max_restarts=1, backoff_initial_s=2.0, backoff_max_s=30.0, backoff_jitter_s=0.0))

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(spawner.processes) == 4 and signals.callback is not None:
            signals.callback("SIGTERM")  # what the installed SIGTERM handler calls

    supervisor = Supervisor(job, out=out, launcher=LocalLauncher(job, spawner=spawner), store=CountingStore(job.storage),
                            tracker=tracker, signals=signals, clock=clock.time, sleep=sleep)
    assert supervisor.run() == EXIT_PREEMPTED
    assert signals.callback is None  # restored on the way out
    assert [e["source"] for e in events(tmp_path, "preemption_requested")] == ["supervisor:SIGTERM"]
    assert [e["backoff_s"] for e in events(tmp_path, "gang_restart")] == [2.0]  # the injected policy, no jitter
    assert tracker.restarts == 1 and lookups  # the injected store answered the completion checks
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "stopping", 1),
        ("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "running", 2),
        ("running", "stopping", 2), ("stopping", "preempted", 2),
    ]


def test_a_run_already_complete_goes_from_preparing_to_succeeded(tmp_path):
    supervisor, _, _, _ = make(tmp_path, [{"exit_at": 0.0}, {"exit_at": 0.0}])
    assert supervisor.run() == EXIT_OK
    again, spawner, _, out = make(tmp_path, [])
    assert again.run() == EXIT_OK
    assert spawner.calls == [] and "already completed at global step 10" in out.getvalue()
    assert run_states(tmp_path)[-1] == ("preparing", "succeeded", None)
    assert "run_state" not in out.getvalue()


# ------------------------------------------------------------------ hangs
_MAIN_IN_TF = (
    'Current thread 0x0000000000000001 (most recent call first):\n'
    '  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute\n'
    '  File "/repo/resilient_train/runner/training/loop.py", line 430 in _run_call\n'
    '  File "<frozen runpy>", line 88 in _run_code\n\n'
)
_READING = (
    'Thread 0x0000000000000002 (most recent call first):\n'
    '  File "/home/me/input_hang.py", line 47 in _read\n'
    '  File "/venv/lib/python3.11/site-packages/tensorflow/python/ops/script_ops.py", line 268 in __call__\n\n'
)


def hanging_spawner(spawner: FakeSpawner, hung_attempts: set[int], step: int = 3):
    """Workers of ``hung_attempts`` finish ``step`` steps, then make no progress while alive;
    on SIGUSR1 each appends a faulthandler dump (rank 1's has a thread in recipe code)."""
    spawn = spawner.__call__

    def __call__(argv, env, log_path):
        process = spawn(argv, env, log_path)
        attempt, rank = int(env["RT_ATTEMPT"]), json.loads(env["TF_CONFIG"])["task"]["index"]
        if attempt in hung_attempts:
            attempt_dir = log_path.parent
            (attempt_dir / f"step-{rank}.txt").write_text(f"{step}\n")
            (attempt_dir / f"phase-{rank}.txt").write_text("train 0 0\n")
            stacks = attempt_dir / f"stacks-{rank}.txt"
            stacks.write_text(f"# resilient-train stacks: rank {rank} pid {process.pid} main thread 0x{1:016x}\n")
            record = process.send_signal

            def send_signal(sig: int) -> None:
                record(sig)
                if sig == signal.SIGUSR1:
                    with open(stacks, "a") as handle:
                        handle.write(_MAIN_IN_TF + (_READING if rank == 1 else ""))

            process.send_signal = send_signal
        return process

    return __call__


def test_a_group_without_progress_is_hung_its_stuck_rank_named_then_restarted(tmp_path):
    scripts = [{"exit_at": None}, {"exit_at": None}, {"exit_at": 2.0}, {"exit_at": 2.0}]
    supervisor, spawner, _, out = make(tmp_path, scripts, max_restarts=1, hang_timeout=5, snapshot_every="off")
    supervisor.launcher.spawner = hanging_spawner(spawner, {1})
    assert supervisor.run() == EXIT_OK
    assert run_states(tmp_path) == [
        ("preparing", "starting", 1), ("starting", "running", 1), ("running", "hung", 1), ("hung", "stopping", 1),
        ("stopping", "restarting", 1), ("restarting", "starting", 2), ("starting", "running", 2),
        ("running", "succeeded", 2),
    ]
    hung, stopping = events(tmp_path, "run_state")[2:4]
    [hang] = events(tmp_path, "hang_detected")
    stacks = str(tmp_path / "run" / "attempt-1" / "stacks-1.txt")
    assert hung["reason"] == "no worker made progress for 5 s (allowed 5 s in phase train)"
    assert stopping["reason"] == "hang: rank 1 made no progress for 5 s"
    assert 5.0 < hang.pop("seconds") <= 5.25  # the first look after the 5 s, markers read every 0.25 s
    assert {k: v for k, v in hang.items() if k not in ("ts", "run_id", "role")} == {
        "event": "hang_detected", "attempt": 1, "rank": 1, "pid": 4001, "global_step": 3, "epoch": 0,
        "step_in_epoch": 3, "timeout_s": 5, "phase": "train", "chosen_by": "in recipe code", "stacks": stacks,
        "where": "main thread in execute.py:53 quick_execute (TensorFlow); recipe code in input_hang.py:47 _read "
                 "(another thread)",
        "steps": {"0": 3, "1": 3},
    }
    # Stacks first (SIGUSR1), then SIGKILL at once: no SIGTERM, no teardown grace for a hung group.
    for process in spawner.processes[:2]:
        (usr1, usr1_at), (kill, kill_at) = process.signals
        assert (usr1, kill) == ("SIGUSR1", "SIGKILL") and 0 < kill_at - usr1_at <= 0.15
    assert [(e["attempt"], e["root_cause_rank"]) for e in events(tmp_path, "gang_restart")] == [(2, 1)]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["restarts"], summary["attempts"]) == ("completed", 1, 2)
    root = summary["root_cause"]
    assert (root["rank"], root["type"], root["global_step"], root["stacks"], root["attempt"]) == (1, "Hang", 3, stacks, 1)
    assert "hang: rank 1 made no progress for 5 s at global step 3 (epoch 1, step 3); main thread in " \
           "execute.py:53 quick_execute (TensorFlow); recipe code in input_hang.py:47 _read" in out.getvalue()


def test_a_hang_at_the_same_step_twice_is_a_crash_loop(tmp_path):
    scripts = [{"exit_at": None}] * 4
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=3, hang_timeout=5)
    supervisor.launcher.spawner = hanging_spawner(spawner, {1, 2})
    assert supervisor.run() == EXIT_FAILURE
    assert [s[1] for s in run_states(tmp_path)] == [
        "starting", "running", "hung", "stopping", "restarting", "starting", "running", "hung", "stopping", "failed",
    ]
    assert [e["attempt"] for e in events(tmp_path, "hang_detected")] == [1, 2]
    [loop] = events(tmp_path, "crash_loop_detected")
    assert "hang on rank 1" in loop["reason"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["restarts"] == 1


def test_a_slow_start_gets_the_startup_allowance_not_the_hang_timeout(tmp_path):
    """No step for 30 s of start-up with --hang-timeout 5 is no hang (--startup-timeout 60)."""
    scripts = [{"exit_at": 30.0}, {"exit_at": 30.0}]
    supervisor, _, _, _ = make(tmp_path, scripts, hang_timeout=5, startup_timeout=60)
    assert supervisor.run() == EXIT_OK
    assert events(tmp_path, "hang_detected") == []


def test_the_supervisors_own_store_calls_get_the_jobs_storage_timeout(tmp_path):
    supervisor, _, _, _ = make(tmp_path, [], storage_timeout=7.5)
    assert supervisor.store._retry.stall_timeout_s == 7.5


def test_a_group_that_never_starts_training_names_each_rank_and_its_address(tmp_path):
    """No step within --startup-timeout (a worker that cannot join): the hang line names the
    ranks that never reached training with their TF_CONFIG addresses."""
    scripts = [{"exit_at": None}, {"exit_at": None}]
    supervisor, spawner, _, out = make(tmp_path, scripts, max_restarts=0, hang_timeout=5, startup_timeout=20)
    assert supervisor.run() == EXIT_FAILURE
    addresses = json.loads(spawner.calls[0]["env"]["TF_CONFIG"])["cluster"]["worker"]
    [hang] = events(tmp_path, "hang_detected")
    assert (hang["phase"], hang["timeout_s"], hang["global_step"]) == ("startup", 20, None)
    assert hang["never_trained"] == {"0": addresses[0], "1": addresses[1]}
    started = {e["rank"]: e["address"] for e in events(tmp_path, "worker_started")}
    assert started == {0: addresses[0], 1: addresses[1]}
    line = (f"before its first step of the attempt; no stacks (the worker did not answer SIGUSR1); never reached "
            f"training: rank 0 ({addresses[0]}), rank 1 ({addresses[1]})")
    assert line in out.getvalue()
    root = json.loads((tmp_path / "run" / "summary.json").read_text())["root_cause"]
    assert root["message"].endswith(line)


def test_a_replaced_straggler_restarts_the_group_with_fresh_processes_and_says_what_moved(tmp_path):
    """The chief's straggler marker (runner/health/straggler_replace.py) and the group's agreed save
    (143): the local run is not stopped as for a notice (its host is not going), it restarts, and
    straggler_replaced says the only thing the local launcher changes: fresh processes."""
    def marker(code: int) -> None:
        (tmp_path / "run" / "attempt-1" / "notice-1.json").write_text(json.dumps(
            {"provider": "straggler", "kind": "replace", "host": "127.0.0.1", "rank": 1}))

    scripts = [
        {"exit_at": 1.0, "exit_code": EXIT_PREEMPTED, "commits": False, "on_exit": marker},
        {"exit_at": 1.2, "exit_code": EXIT_PREEMPTED},
        {"exit_at": 2.0}, {"exit_at": 2.0},
    ]
    supervisor, spawner, _, out = make(tmp_path, scripts, max_restarts=0)
    assert supervisor.run() == EXIT_OK
    assert [(e["attempt"], e["rank"], e["host"], e["moved"], e["nodes"], e["launcher"])
            for e in events(tmp_path, "straggler_replaced")] == [(1, 1, "127.0.0.1", "fresh_process", [], "local")]
    assert events(tmp_path, "preemption_requested") == []  # no stop of the run (a notice would: notice:<provider>)
    assert [p.pid for p in spawner.processes] == [4000, 4001, 4002, 4003]  # new processes for attempt 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["preemptions"], summary["restarts"], summary["attempts"]) == (
        "completed", 1, 0, 2)
    assert "rank 1 replaced after the agreed save of global step" in out.getvalue()
