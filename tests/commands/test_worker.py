"""``resilient-train worker``: its arguments are parsed once, by the CLI, then runner.process.worker_main.run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_train.cli import main
from resilient_train.errors import EXIT_OK, EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]


def _exit_as_an_exception(monkeypatch) -> None:
    """In this process, the worker's ``exit_process`` (``os._exit``) raises SystemExit(code) instead."""
    import resilient_train.runner.process.bootstrap as bootstrap

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(bootstrap, "exit_process", fake_exit)


def test_worker_arguments_are_parsed_once_and_reach_run(monkeypatch, tmp_path) -> None:
    import resilient_train.runner.process.worker_main as worker

    calls = []

    def fake_run(job, *, tf_config_from, port_base, environ):
        calls.append((job.recipe, job.run_dir, job.workers, tf_config_from, port_base))
        return EXIT_OK

    def no_second_parse(argv):
        pytest.fail(f"the worker parsed its arguments again: {argv}")

    monkeypatch.setattr(worker, "run", fake_run)
    monkeypatch.setattr(worker, "parse_args", no_second_parse)
    _exit_as_an_exception(monkeypatch)
    with pytest.raises(SystemExit) as left:
        main(["worker", "recipes/linear_regression.py", "--run-dir", str(tmp_path), "--workers", "3",
              "--tf-config-from", "slurm", "--port-base", "7000"])
    assert left.value.code == EXIT_OK
    assert calls == [("recipes/linear_regression.py", str(tmp_path), 3, "slurm", 7000)]


def test_worker_tf_config_error_through_the_cli_is_one_line(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 4}}')
    _exit_as_an_exception(monkeypatch)
    with pytest.raises(SystemExit) as left:
        main(["worker", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run")])
    assert left.value.code == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (
        "resilient-train worker: TF_CONFIG task index 4 is out of range; cluster['worker'] has 1 entries")
    assert not (tmp_path / "run").exists()


def test_worker_job_flag_error_is_the_cli_one_line(capsys, tmp_path) -> None:
    code = main(["worker", "recipes/linear_regression.py", "--run-dir", str(tmp_path), "--workers", "0"])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err.strip() == "resilient-train: error: Received workers=0; expected an integer >= 1"


def test_runner_main_reports_a_missing_job_file_in_one_line(capsys, tmp_path) -> None:
    from resilient_train.runner.process.worker_main import main as runner_main

    code = runner_main(["--job", str(tmp_path / "missing.json")], environ={})
    assert code == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("resilient-train worker: [Errno 2] No such file or directory") and len(err.splitlines()) == 1



def test_the_worker_command_leaves_as_the_runner_does_its_temp_dir_removed(tmp_path) -> None:
    # `resilient-train worker` (the Kubernetes manifests' and workers.sbatch's path) as a real
    # process, one local worker: it exits 0 through bootstrap.exit_process, as
    # `python -m resilient_train.runner` does, so its local/rank-0/tmp (rundir/scratch.py) is gone.
    script = Path(sys.executable).parent / "resilient-train"
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run([str(script), "worker", "recipes/linear_regression.py", "--run-dir", str(run_dir),
                           "--epochs", "1", "--steps-per-epoch", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert (run_dir / "local" / "rank-0").is_dir()
    assert not (run_dir / "local" / "rank-0" / "tmp").exists()
