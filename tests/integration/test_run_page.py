"""What a person is pointed to at the end of a run exists, and reads in their terms (real processes).

recipes/linear_regression.py on one worker, stopped by a SIGTERM to the supervisor once a
checkpoint is committed (exit 143), run again in the same run dir after a pause, to the end.
Each invocation ends with ``Page: RUN_DIR/report.html`` and the file is there (written by the
run command after the supervisor returned, under the run dir's umask); the second page shows
the pause as a gap between runs, no fault band. ``resilient-train export`` of that run's
checkpoints, run as a user runs it (no TF_CPP_MIN_LOG_LEVEL of ours), says one line on stdout
and nothing on stderr: none of TensorFlow's CUDA chatter on this GPU-less machine; nor does
``verify --deep``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from resilient_train.commands.report_page import load_run
from tests.integration.harness import REPO, Job, run_job, run_job_until
from tests.support.page_dom import PageDom

RECIPE = "recipes/linear_regression.py"
PAUSE_S = 3.0


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory) -> tuple[Job, Job, float]:
    run_dir = tmp_path_factory.mktemp("page") / "run"
    first = run_job_until(
        RECIPE, run_dir, "--workers", "1",
        when=lambda events: any(e["event"] == "checkpoint_committed" for e in events),
        action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    page_after_stop = (run_dir / "report.html").read_text()
    time.sleep(PAUSE_S)
    second = run_job(RECIPE, run_dir, "--workers", "1")
    return first, second, page_after_stop


def _dom(text: str) -> PageDom:
    dom = PageDom()
    dom.feed(text)
    return dom


def test_every_run_ends_with_its_page_written(stopped_and_resumed):
    first, second, page_after_stop = stopped_and_resumed
    run_dir = second.run_dir
    assert first.returncode == 143, first.output
    assert second.returncode == 0, second.output
    for job in (first, second):
        assert job.output.splitlines()[-1] == f"Page: {run_dir}/report.html"
        assert job.output.splitlines()[-2] == (f"Summary: {run_dir}/summary.json  Events: {run_dir}/events.jsonl  "
                                               f"Logs: {run_dir}/attempt-*/worker-*.log")
    assert (run_dir / "report.html").stat().st_mode & 0o777 == 0o600  # the run dir's default mode, as summary.json
    stopped = dict(zip(_dom(page_after_stop).cells[0::2], _dom(page_after_stop).cells[1::2]))
    assert (stopped["status"], stopped["invocations"]) == ("preempted", "1")


def test_the_pause_between_the_runs_is_a_gap_not_downtime(stopped_and_resumed):
    _, second, _ = stopped_and_resumed
    dom = _dom((second.run_dir / "report.html").read_text())
    view = load_run(second.run_dir)
    (gap,) = view.gaps()
    assert gap.seconds >= PAUSE_S
    assert gap.after == "Run preempted: stopped by SIGTERM (exit 143)"
    assert [g["data-seconds"] for g in dom.of_class("gap")] == [f"{gap.seconds:.3f}"]
    assert dom.of_class("band") == []  # no restart in either invocation, and a person's stop is no fault
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert rows["stopped between runs"] == f"{gap.seconds:.1f} s"
    account = view.time_account()  # productive training over the time the run was under way
    assert rows["goodput"] == f"{account.seconds['productive'] / (view.wall_seconds() - gap.seconds):.1%}"
    assert account.seconds["between_runs"] == pytest.approx(gap.seconds)
    preempted = next(e for e in view.events if e["event"] == "preempted")
    assert f"saved global step {preempted['global_step']} (epoch {preempted['epoch'] + 1}, step " \
           f"{preempted['step_in_epoch']}) and stopped" in "\n".join(dom.titles)


def _as_a_user(*argv: str) -> subprocess.CompletedProcess:
    """``python -m resilient_train ARGV`` with the user's environment (no TF_CPP_MIN_LOG_LEVEL of ours)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "resilient_train", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_export_says_nothing_of_cuda_on_stderr(stopped_and_resumed, tmp_path):
    _, second, _ = stopped_and_resumed
    out = tmp_path / "model"
    proc = _as_a_user("export", str(second.run_dir / "checkpoints"), "--recipe", RECIPE, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    digest = second.summary["weights_sha256"]
    assert proc.stdout == (f"Exported global step 30 (weights_sha256 {digest}) to {out}: model.keras, saved_model, "
                           f"export.json\n")


def test_verify_deep_says_nothing_of_cuda_on_stderr(stopped_and_resumed):
    _, second, _ = stopped_and_resumed
    proc = _as_a_user("verify", str(second.run_dir / "checkpoints"), "--deep")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[-1].startswith("global_step 30: consistent: ")
