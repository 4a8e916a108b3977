"""The parameter-server supervisor's per-role handling, driven through its seams (supervisor/ps_supervisor.py).

Fake processes, clock and sleep from test_supervisor_loop.py; ranks are 0 coordinator,
1 ps, 2..3 workers (cluster/ps_cluster.py).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig
from resilient_train.supervisor.launchers.ps_local import ParameterServerLauncher
from resilient_train.supervisor.ps_supervisor import ParameterServerSupervisor
from tests.supervisor.test_supervisor_loop import FakeClock, FakeSpawner, events

SERVER = {"exit_at": None, "on_sigterm": EXIT_OK}  # a ps or worker: serves until SIGTERM, then exits 0


def make(tmp_path: Path, scripts: list[dict], **job_kwargs):
    clock = FakeClock()
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers=2, ps=1,
                    strategy="parameter-server", warm_standby=False, **job_kwargs)
    spawner = FakeSpawner(clock, scripts, storage=tmp_path / "run" / "checkpoints", recipe=job.recipe)
    supervisor = ParameterServerSupervisor(job, out=io.StringIO(), launcher=ParameterServerLauncher(job, spawner=spawner),
                                           clock=clock.time, sleep=clock.sleep, backoff_initial_s=0.25)
    return supervisor, spawner, clock


def summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_one_cluster_of_roles_and_servers_stopped_when_the_coordinator_is_done(tmp_path):
    supervisor, spawner, _ = make(tmp_path, [{"exit_at": 2.0}, SERVER, SERVER, SERVER])
    assert supervisor.run() == EXIT_OK
    configs = [json.loads(call["env"]["TF_CONFIG"]) for call in spawner.calls]
    assert [c["task"] for c in configs] == [{"type": "chief", "index": 0}, {"type": "ps", "index": 0},
                                            {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert [call["argv"][1:3] for call in spawner.calls] == [["-m", "resilient_train.runner.process.ps_roles"]] * 4
    assert [p.signals for p in spawner.processes[1:]] == [[("SIGTERM", 2.05)]] * 3  # the poll that saw the exit
    assert [e["role"] for e in events(tmp_path, "worker_started")] == ["chief", "ps", "worker", "worker"]
    assert (summary(tmp_path)["status"], summary(tmp_path)["worker_restarts"]) == ("completed", 0)


def test_a_dead_worker_is_restarted_in_place_without_a_gang_restart(tmp_path):
    scripts = [{"exit_at": 5.0}, SERVER, SERVER, {"exit_at": 1.0, "exit_code": -9}, SERVER]
    supervisor, spawner, _ = make(tmp_path, scripts)
    assert supervisor.run() == EXIT_OK
    assert len(spawner.calls) == 5
    assert spawner.calls[4]["env"]["TF_CONFIG"] == spawner.calls[3]["env"]["TF_CONFIG"]  # same address and port
    assert spawner.processes[0].signals == []  # the coordinator was never touched
    (restarted,) = events(tmp_path, "worker_restarted")
    assert (restarted["rank"], restarted["attempt"], restarted["previous_exit"], restarted["pid"]) == (3, 1, -9, 4004)
    assert events(tmp_path, "gang_restart") == []
    assert (summary(tmp_path)["status"], summary(tmp_path)["restarts"], summary(tmp_path)["worker_restarts"]) == (
        "completed", 0, 1)


def test_a_worker_dying_past_max_restarts_ends_the_attempt(tmp_path):
    dies = {"exit_at": 1.0, "exit_code": -9}
    scripts = [{"exit_at": None}, SERVER, SERVER, dies, dies, {"exit_at": 1.0}, SERVER, SERVER, SERVER]
    supervisor, spawner, _ = make(tmp_path, scripts, max_restarts=1)
    assert supervisor.run() == EXIT_OK
    assert len(events(tmp_path, "worker_restarted")) == 1
    assert spawner.processes[0].signals[0][0] == "SIGKILL"
    (gang,) = events(tmp_path, "gang_restart")
    assert gang["root_cause_rank"] == 3


def test_a_dead_ps_kills_the_coordinator_at_once_and_restarts_every_role(tmp_path):
    scripts = [{"exit_at": None}, {"exit_at": 1.0, "exit_code": -9}, SERVER, SERVER,
               {"exit_at": 1.0}, SERVER, SERVER, SERVER]
    supervisor, spawner, _ = make(tmp_path, scripts)
    assert supervisor.run() == EXIT_OK
    coordinator = spawner.processes[0]
    assert coordinator.signals == [("SIGKILL", 1.05)]  # the poll that saw the ps die: no grace
    (term_at,) = {p.signals[0] for p in spawner.processes[2:4]}
    assert term_at[0] == "SIGTERM" and term_at[1] > 1.05  # the workers only once the coordinator is gone
    (gang,) = events(tmp_path, "gang_restart")
    assert (gang["attempt"], gang["root_cause_rank"]) == (2, 1)
    first, second = (json.loads(c["env"]["TF_CONFIG"])["cluster"] for c in (spawner.calls[0], spawner.calls[4]))
    assert first != second  # a new attempt: fresh ports
    assert (summary(tmp_path)["restarts"], summary(tmp_path)["root_cause"]["rank"]) == (1, 1)


def test_sigterm_reaches_the_coordinator_first_and_the_servers_only_once_it_is_gone(tmp_path):
    scripts = [{"exit_at": None, "on_sigterm": None}, SERVER, SERVER, SERVER]
    supervisor, spawner, clock = make(tmp_path, scripts, grace_period=2.0)
    original_sleep = clock.sleep

    def sleep_then_signal(seconds: float) -> None:
        original_sleep(seconds)
        if clock.now - 1000.0 >= 1.0:
            supervisor.stop.request("SIGTERM")

    supervisor.group.sleep = sleep_then_signal
    assert supervisor.run() == EXIT_PREEMPTED
    (term, term_at), (kill, kill_at) = spawner.processes[0].signals
    assert (term, kill) == ("SIGTERM", "SIGKILL") and 2.0 <= kill_at - term_at <= 2.05 + 1e-6  # the grace period (one poll)
    assert [p.signals[0][0] for p in spawner.processes[1:]] == ["SIGTERM"] * 3
    assert min(p.signals[0][1] for p in spawner.processes[1:]) > kill_at  # the servers outlived the coordinator
    assert summary(tmp_path)["status"] == "preempted"


def test_the_watchdog_watches_the_coordinator_only(tmp_path):
    supervisor, _, _ = make(tmp_path, [{"exit_at": 2.0}, SERVER, SERVER, SERVER])
    assert supervisor.run() == EXIT_OK
    assert [w.rank for w in supervisor.workers] == [0, 1, 2, 3]
    assert [w.rank for w in supervisor.topology.watched(supervisor.workers)] == [0]


def test_a_coordinator_without_progress_is_hung_named_and_the_attempt_restarted(tmp_path):
    """The coordinator wrote step 7 in phase train, then nothing; the servers write no markers
    at all (they idle by design), so the hang is the coordinator's after --hang-timeout 5,
    not a server's after the start-up allowance."""
    scripts = [{"exit_at": None}, SERVER, SERVER, SERVER, {"exit_at": 1.0}, SERVER, SERVER, SERVER]
    supervisor, spawner, _ = make(tmp_path, scripts, hang_timeout=5, startup_timeout=60)
    spawn = spawner.__call__

    def hanging_coordinator(argv, env, log_path):
        process = spawn(argv, env, log_path)
        if json.loads(env["TF_CONFIG"])["task"]["type"] == "chief" and env["RT_ATTEMPT"] == "1":
            (log_path.parent / "step-0.txt").write_text("7\n")
            (log_path.parent / "phase-0.txt").write_text("train 0 0\n")
        return process

    supervisor.launcher.spawner = hanging_coordinator
    assert supervisor.run() == EXIT_OK
    [hang] = events(tmp_path, "hang_detected")
    assert (hang["attempt"], hang["rank"], hang["global_step"], hang["phase"], hang["steps"]) == (1, 0, 7, "train", {"0": 7})
    assert 5.0 < hang["seconds"] <= 5.25 and "never_trained" not in hang
    coordinator = spawner.processes[0]
    assert [s for s, _ in coordinator.signals] == ["SIGUSR1", "SIGKILL"]  # stacks, then no grace
    assert [p.signals[0][0] for p in spawner.processes[1:4]] == ["SIGTERM"] * 3  # servers: no stack request
    (gang,) = events(tmp_path, "gang_restart")
    assert (gang["attempt"], gang["root_cause_rank"]) == (2, 0)
    root = summary(tmp_path)["root_cause"]
    assert (summary(tmp_path)["status"], root["type"], root["rank"], root["global_step"]) == ("completed", "Hang", 0, 7)
