"""The stand-in worker (tests/support/standin_worker.py) stays a worker's stand-in.

It runs where the local launcher would run ``python -m resilient_train.runner --job FILE``;
if that command changes, the stand-in must be told, not silently start something else.
(The stand-in writes its markers, events, error file and commits through the real
worker's code; tests/integration/test_supervisor_scale.py runs 64 of them under the real
supervisor.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from resilient_train.cluster import entry_points
from resilient_train.job.config import JobConfig
from resilient_train.supervisor.launchers.api import WorkerSpec
from resilient_train.supervisor.launchers.local import LocalLauncher
from tests.support.standin_worker import SCRIPT, StandinOptions, StandinSpawner, argument_parser


class _Recorder:
    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def __call__(self, argv, env, log_path):
        self.argv.append(argv)
        return type("Handle", (), {"pid": 1000 + len(self.argv)})()


def test_the_local_launchers_worker_command_becomes_the_standins(tmp_path):
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers=2,
                    warm_standby=False)
    recorder = _Recorder()
    options = StandinOptions(steps=9, step_s=0.5, save_every=3, die_at=(1, 4), die_attempt=2)
    launcher = LocalLauncher(job, spawner=StandinSpawner(options, popen=recorder))
    launcher.prepare()
    specs = [WorkerSpec(rank, 1, job, {}, tmp_path / "run") for rank in range(2)]

    launcher.start(specs)

    assert recorder.argv == [
        [sys.executable, str(SCRIPT), "--steps", "9", "--step-s", "0.5", "--save-every", "3", "--die-attempt", "2",
         "--die-at", "1:4", "--job", str(spec.job_path)] for spec in specs]
    assert argument_parser().parse_args(recorder.argv[0][2:]).die_at == (1, 4)


def test_a_worker_command_that_is_not_the_runner_is_refused():
    spawner = StandinSpawner(popen=_Recorder())
    with pytest.raises(ValueError, match=f"expected \\[python, '-m', '{entry_points.WORKER}'"):
        spawner(["python", "-m", "resilient_train.runner.process.warm_standby", "--recipe", "r.py"], {}, Path("log"))


def test_a_bad_die_at_names_the_value():
    with pytest.raises(SystemExit):
        argument_parser().parse_args(["--job", "j.json", "--die-at", "3"])
