"""SlurmLauncher through its command seam: srun, squeue and scancel are fakes here.

The real engine is exercised in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from resilient_train.job.config import JobConfig
from resilient_train.errors import EXIT_PREEMPTED, ConfigError
from resilient_train.supervisor.launchers import make_launcher
from resilient_train.supervisor.launchers.api import WorkerSpec
from resilient_train.supervisor.launchers.local import LocalLauncher
from resilient_train.supervisor.launchers.slurm import SlurmLauncher
from resilient_train.rundir.layout import AttemptDir
from tests.supervisor.test_supervisor_loop import events, make


class FakeSrun:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            raise subprocess.TimeoutExpired("srun", timeout)
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)

    def kill(self):
        self.returncode = -signal.SIGKILL


class FakeCommands:
    """Records every command; the probe step 'writes' a file for each node in ``shared``."""

    def __init__(self, shared: list[str]) -> None:
        self.shared = shared
        self.ran: list[list[str]] = []
        self.started: list[tuple[list[str], dict]] = []
        self.processes: list[FakeSrun] = []

    def popen(self, argv, env, log_path: Path):
        self.started.append((argv, dict(env)))
        self.processes.append(FakeSrun(5000 + len(self.processes)))
        return self.processes[-1]

    def run(self, argv, env, timeout):
        self.ran.append(argv)
        if argv[0] == "srun":  # the shared-run-dir probe
            for node in self.shared:
                (Path(argv[-1]) / node).touch()
            return subprocess.CompletedProcess(argv, 0, "", "")
        if argv[0] == "squeue":  # every step of the job, whatever --name says (Slurm 22.05.8)
            name = next(a for a in argv if a.startswith("--name=")).split("=", 1)[1]
            return subprocess.CompletedProcess(argv, 0, f"77.0 python\n77.2 rt-attempt-0-dead00\n77.3 {name}\n77.batch batch\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")


SLURM_ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "2", "TF_CONFIG": "{}", "PATH": "/bin"}


def launcher(tmp_path, shared=("n1", "n2"), environ=SLURM_ENV, workers=2):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers=workers, launcher="slurm")
    commands = FakeCommands(list(shared))
    return SlurmLauncher(job, commands=commands, environ=environ, python="py"), commands, job


def specs(job, tmp_path, attempt=1):
    attempt_dir = tmp_path / "run" / f"attempt-{attempt}"
    attempt_dir.mkdir(parents=True, exist_ok=True)
    env = {"RT_ATTEMPT": str(attempt), "RT_RUN_ID": "r1"}
    return [WorkerSpec(rank, attempt, job, env, attempt_dir) for rank in range(job.workers)]


def report_exit(spec: WorkerSpec, code: int) -> None:
    AttemptDir.at(spec.attempt_dir).slurm_exit(spec.rank).write_text(json.dumps({"rank": spec.rank, "exit_code": code}))


def test_make_launcher_picks_slurm(tmp_path):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path), launcher="slurm")
    assert isinstance(make_launcher(job), SlurmLauncher)


def test_outside_an_allocation_is_a_usage_error(tmp_path):
    slurm, _, _ = launcher(tmp_path, environ={"PATH": "/bin"})
    with pytest.raises(ConfigError, match=r"^--launcher slurm runs inside a Slurm allocation \(SLURM_JOB_ID is not set\)"):
        slurm.prepare()


def test_more_workers_than_tasks_is_a_usage_error(tmp_path):
    slurm, _, _ = launcher(tmp_path, workers=4)
    with pytest.raises(ConfigError, match=r"Received --workers 4 but Slurm job 77 has 2 task\(s\); submit with --ntasks=4"):
        slurm.prepare()


def test_run_dir_not_shared_by_every_node_is_refused(tmp_path):
    slurm, commands, _ = launcher(tmp_path, shared=["n1"])
    with pytest.raises(ConfigError, match=r"is not shared with node\(s\) \['n2'\]; --launcher slurm needs --run-dir"):
        slurm.prepare()
    probe = commands.ran[0]
    assert probe[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap"]


def test_each_attempt_is_one_srun_step_with_rotating_ports(tmp_path):
    slurm, commands, job = launcher(tmp_path)
    slurm.prepare()
    first = specs(job, tmp_path, attempt=1)
    handles = slurm.start(first)
    argv, env = commands.started[0]
    attempt_dir = first[0].attempt_dir
    assert argv[:11] == [
        "srun", argv[1], "--nodes=2", "--ntasks=2", "--distribution=block", "--kill-on-bad-exit=0", "--wait=0",
        "--overlap", f"--output={attempt_dir}/worker-%t.log", "--export=ALL", "py",
    ]
    assert argv[1].startswith("--job-name=rt-attempt-1-")
    assert argv[11:] == [
        "-m", "resilient_train.supervisor.launchers.slurm_task", str(attempt_dir), "--",
        "py", "-m", "resilient_train.runner", "--job", str(attempt_dir / "job.json"),
        "--tf-config-from", "slurm", "--port-base", "8888",
    ]
    assert "TF_CONFIG" not in env and env["RT_ATTEMPT"] == "1" and env["SLURM_JOB_ID"] == "77"
    assert [h.pid for h in handles] == [5000, 5000]
    for spec in first:
        report_exit(spec, 0)
    commands.processes[0].returncode = 0
    slurm.start(specs(job, tmp_path, attempt=2))
    assert commands.started[1][0][-1] == "8890"  # base + workers: the old step's ports are not reused


def test_poll_reads_each_task_own_exit_code(tmp_path):
    slurm, commands, job = launcher(tmp_path)
    slurm.prepare()
    attempt = specs(job, tmp_path)
    chief, worker = slurm.start(attempt)
    assert (chief.poll(), worker.poll()) == (None, None)
    report_exit(attempt[1], EXIT_PREEMPTED)
    assert (chief.poll(), worker.poll()) == (None, EXIT_PREEMPTED)
    commands.processes[0].returncode = 1  # srun ended; the chief never reported
    assert chief.poll() == -signal.SIGKILL
    assert "ended without task 0 reporting an exit" in slurm.lost_reason(chief)
    assert slurm.lost_reason(worker) is None


def test_signals_go_to_the_whole_step_once_each(tmp_path):
    slurm, commands, job = launcher(tmp_path)
    slurm.prepare()
    chief, worker = slurm.start(specs(job, tmp_path))
    chief.send_signal(signal.SIGTERM)
    worker.send_signal(signal.SIGTERM)
    worker.send_signal(signal.SIGKILL)
    name = commands.started[0][0][1].split("=", 1)[1]
    assert commands.ran[1:] == [
        ["squeue", "--steps", "--noheader", "--format=%i %j", "--jobs=77", f"--name={name}"],
        ["scancel", "--signal=TERM", "77.3"],
        ["scancel", "--signal=KILL", "77.3"],
    ]


def test_stop_requested_only_for_a_sigterm_from_slurm(tmp_path):
    slurm, _, job = launcher(tmp_path)
    slurm.prepare()
    attempt = specs(job, tmp_path)
    chief, _ = slurm.start(attempt)
    assert slurm.stop_requested() is False
    AttemptDir.at(attempt[0].attempt_dir).slurm_term(1).write_text("n2\n")
    assert slurm.stop_requested() is True
    chief.send_signal(signal.SIGTERM)  # the supervisor's own teardown: not a stop from Slurm
    assert slurm.stop_requested() is False


class StoppingLauncher(LocalLauncher):
    """A local launcher whose engine asks the job to stop once the clock passes ``at``."""

    def __init__(self, job, *, clock, at, **kwargs):
        super().__init__(job, **kwargs)
        self.clock, self.at = clock, at

    def stop_requested(self) -> bool:
        return self.clock.now >= self.at


def test_engine_stop_request_gives_save_and_exit_143_without_restart(tmp_path):
    scripts = [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED}]
    supervisor, spawner, clock, _ = make(tmp_path, scripts, launcher_from=lambda _, *, job, spawner, clock: (
        StoppingLauncher(job, spawner=spawner, clock=clock, at=1001.0)))
    assert supervisor.run() == EXIT_PREEMPTED
    assert [e["source"] for e in events(tmp_path, "preemption_requested")] == ["launcher:local"]
    assert events(tmp_path, "gang_restart") == []
    assert [p.signals[0][0] for p in spawner.processes] == ["SIGTERM", "SIGTERM"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["preemptions"], summary["restarts"]) == ("preempted", 1, 0)


def test_cli_outside_an_allocation_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from resilient_train.cli import main

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    code = main(["run", "recipes/linear_regression.py", "--launcher", "slurm", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "resilient-train: error: --launcher slurm runs inside a Slurm allocation (SLURM_JOB_ID is not set); "
        "submit deploy/slurm/run.sbatch with sbatch, or start it under salloc"
    ]


class AllocationCommands(FakeCommands):
    """``scontrol show job`` answers with the allocation's current node list."""

    def __init__(self, shared, nodelist: str) -> None:
        super().__init__(shared)
        self.nodelist = nodelist

    def run(self, argv, env, timeout):
        if argv[0] == "scontrol":
            self.ran.append(argv)
            return subprocess.CompletedProcess(argv, 0, f"JobId=77 NodeList={self.nodelist} NumNodes=9\n", "")
        return super().run(argv, env, timeout)


def test_capacity_is_the_allocations_nodes_times_its_tasks_per_node(tmp_path):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers="1:2",
                    launcher="slurm", global_batch_size=32)
    commands = AllocationCommands(["n1", "n2"], "n[1-2]")
    slurm = SlurmLauncher(job, commands=commands, environ=SLURM_ENV, python="py")
    slurm.prepare()
    assert slurm.capacity() == 2
    commands.nodelist = "n2"  # n1 failed under --no-kill: the allocation shrank
    assert (slurm.capacity(), slurm.nodes) == (1, ["n2"])
    assert ["scontrol", "show", "job", "--oneliner", "77"] in commands.ran


def test_each_step_is_told_the_allocations_nodes_now_not_those_at_the_start(tmp_path):
    """srun checks --nodes against SLURM_JOB_NODELIST: a stale list refuses a grown allocation
    ("Only allocated 1 nodes asked for 2", Slurm 22.05.8)."""
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers="1:2",
                    launcher="slurm", global_batch_size=32)
    environ = {**SLURM_ENV, "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1",
               "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}
    commands = AllocationCommands(["n1"], "n1")
    slurm = SlurmLauncher(job, commands=commands, environ=environ, python="py")
    slurm.prepare()
    commands.nodelist = "n[1-2]"  # grown by an expand merge
    assert slurm.capacity() == 2
    slurm.start(specs(job, tmp_path))
    argv, env = commands.started[0]
    assert argv[2:4] == ["--nodes=2", "--ntasks=2"]
    told = {name: env[name] for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")}
    assert told == {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
                    "SLURM_NNODES": "2"}


def test_an_elastic_run_needs_only_min_tasks(tmp_path):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers="3:4",
                    launcher="slurm", global_batch_size=12)
    slurm = SlurmLauncher(job, commands=FakeCommands(["n1", "n2"]), environ=SLURM_ENV, python="py")
    with pytest.raises(ConfigError, match=r"Received --workers 3:4 but Slurm job 77 has 2 task\(s\)"):
        slurm.prepare()


def test_a_noticed_node_is_excluded_from_every_later_step_and_from_capacity(tmp_path):
    """A task's preemption notice names its node (``host``: SLURMD_NODENAME): the next step
    runs ``--exclude`` of it on the nodes left, and capacity no longer counts it."""
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers="1:2",
                    launcher="slurm", global_batch_size=32)
    commands = AllocationCommands(["n1", "n2"], "n[1-2]")
    slurm = SlurmLauncher(job, commands=commands, environ=SLURM_ENV, python="py")
    slurm.prepare()
    first = specs(job, tmp_path, attempt=1)
    slurm.start(first)
    attempt_dir = AttemptDir.at(first[0].attempt_dir)
    assert slurm.avoid_noticed(attempt_dir) == []
    attempt_dir.notice(0).write_text("{torn")  # names no node: nothing to exclude
    attempt_dir.notice(1).write_text(json.dumps({"provider": "gce", "kind": "preempted", "deadline": None, "host": "n2"}))
    assert slurm.avoid_noticed(attempt_dir) == ["n2"]
    assert slurm.avoid_noticed(attempt_dir) == []  # once
    assert slurm.capacity() == 1
    for spec in first:
        report_exit(spec, EXIT_PREEMPTED)
    commands.processes[0].returncode = 0
    second = specs(job, tmp_path, attempt=2)[:1]
    slurm.start(second)
    argv = commands.started[1][0]
    assert argv[2:5] == ["--nodes=1", "--ntasks=1", "--exclude=n2"]
