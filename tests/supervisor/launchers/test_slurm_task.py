"""The per-task wrapper of the Slurm launcher, as a real process (no Slurm needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from resilient_train.rundir.layout import AttemptDir

WRAPPER = [sys.executable, "-m", "resilient_train.supervisor.launchers.slurm_task"]


def test_reports_the_worker_exit_code(tmp_path):
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    child = [sys.executable, "-c", "import sys; sys.exit(3)"]
    result = subprocess.run([*WRAPPER, str(attempt_dir), "--", *child], env={**os.environ, "SLURM_PROCID": "1"}, timeout=60)
    assert result.returncode == 3
    assert json.loads(AttemptDir.at(attempt_dir).slurm_exit(1).read_text())["exit_code"] == 3
    assert not AttemptDir.at(attempt_dir).slurm_term(1).exists()


def test_sigterm_from_slurm_is_recorded_and_the_worker_code_kept(tmp_path):
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    # Slurm signals every process of the step: here, the whole process group.
    child = [
        sys.executable, "-c",
        "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
        "print('ready', flush=True); signal.pause()",
    ]
    wrapper = subprocess.Popen(
        [*WRAPPER, str(attempt_dir), "--", *child],
        env={**os.environ, "SLURM_PROCID": "0"},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert wrapper.stdout.readline() == "ready\n"
    os.killpg(wrapper.pid, signal.SIGTERM)
    assert wrapper.wait(timeout=60) == 143
    assert json.loads(AttemptDir.at(attempt_dir).slurm_exit(0).read_text())["exit_code"] == 143
    assert AttemptDir.at(attempt_dir).slurm_term(0).exists()


def test_a_worker_killed_by_a_signal_is_reported_negative(tmp_path):
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    child = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    result = subprocess.run([*WRAPPER, str(attempt_dir), "--", *child], env={**os.environ, "SLURM_PROCID": "0"}, timeout=60)
    assert result.returncode == 128 + signal.SIGKILL
    assert json.loads(AttemptDir.at(attempt_dir).slurm_exit(0).read_text())["exit_code"] == -signal.SIGKILL
