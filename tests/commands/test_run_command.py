"""The page ``run`` writes after its supervisor returns (commands/run.py): its path on stdout, or
one line on stderr when it cannot be written, and the run's exit code either way; and the
stderr filter that keeps TensorFlow's start-up chatter off ``export`` (commands/tf_stderr.py).
tests/integration/test_run_page.py runs both for real."""

from __future__ import annotations

import json
import os

import pytest

from resilient_train.cli import main as cli_main
from resilient_train.commands import run as run_command
from resilient_train.commands.tf_stderr import tensorflow_chatter_filtered
from resilient_train.job.config import JobConfig
from resilient_train.supervisor import supervisor as supervisor_module


def _job(tmp_path) -> JobConfig:
    return JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), warm_standby=False)


def test_the_page_is_written_and_its_path_printed(tmp_path, capsys):
    job = _job(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text(json.dumps(
        {"event": "run_started", "ts": "2026-01-01T00:00:00+00:00", "workers": 1}) + "\n")
    run_command.write_page_after_run(job)
    assert capsys.readouterr() == (f"Page: {tmp_path}/run/report.html\n", "")
    assert (tmp_path / "run" / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_a_page_that_cannot_be_written_is_one_line_and_keeps_the_exit_code(tmp_path, capsys, monkeypatch):
    import resilient_train.commands.run_report as run_report_module

    def stopped(self):  # a stopped run: its event log exists, its page cannot be written
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "events.jsonl").write_text("")
        return 143

    def full(run_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(supervisor_module.Supervisor, "run", stopped)
    monkeypatch.setattr(run_report_module, "write_report_page", full)
    code = cli_main(["run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 143
    assert "Page:" not in out
    assert err == (f"resilient-train: the run's page was not written ([Errno 28] No space left on device); "
                   f"`resilient-train report {tmp_path}/run` draws it\n")


def test_no_page_where_no_run_started(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(supervisor_module.Supervisor, "run", lambda self: 2)  # refused before its first event
    code = cli_main(["run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert (code, "Page:" in out, "page" in err) == (2, False, False)


@pytest.mark.parametrize("tail", [b"\n", b""])  # a last line with or without its newline
def test_tensorflow_chatter_is_dropped_and_every_other_line_kept_in_order(capfd, tail):
    with tensorflow_chatter_filtered():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                    b"I0000 00:00:1.5 3962 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
                    b"not be used.\nresilient-train export: a line of ours\n")
        os.write(2, b"E0000 00:00:1.6 3962 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
                    b"Traceback (most recent call last):" + tail)
    assert capfd.readouterr().err == "resilient-train export: a line of ours\nTraceback (most recent call last):" + \
        tail.decode()


@pytest.mark.parametrize("value, line", [
    ('[{"point": "nan_los", "global_step": 6}]',
     "RT_FAULTS point 'nan_los'; expected one of ("),
    ('[{"point": "nan_loss", "global_step": 6, "attempt": "every"}]',
     "RT_FAULTS fault 1: received attempt='every'; expected an integer >= 1 or 'all' (every attempt: a poisoned batch)"),
    ('[{"point": "nan_loss", "step": 6}]',
     "RT_FAULTS fault 1: unknown key 'step'; accepted: point, global_step, rank, attempt, signal, factor"),
    ("{point: nan_loss}", "RT_FAULTS is not JSON ("),
])
def test_a_bad_fault_plan_in_the_environment_is_one_line_and_exit_2_before_anything_starts(
        tmp_path, capsys, monkeypatch, value, line):
    started = []
    monkeypatch.setattr(supervisor_module.Supervisor, "run", lambda self: started.append(1) or 0)
    monkeypatch.setenv("RT_FAULTS", value)
    code = cli_main(["run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert (code, started, out) == (2, [], "")
    assert err.startswith(f"resilient-train: error: {line}") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_poisoned_batch_in_the_environment_is_accepted_and_reaches_the_supervisor(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(supervisor_module.Supervisor, "run", lambda self: started.append(os.environ["RT_FAULTS"]) or 0)
    value = '[{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": "all"}]'
    monkeypatch.setenv("RT_FAULTS", value)
    assert cli_main(["run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run")]) == 0
    assert started == [value]
