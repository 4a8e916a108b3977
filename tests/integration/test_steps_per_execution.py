"""N steps per compiled call change nothing a user can observe but speed.

N=1, N=3 and auto (the default, used by the reference run) train the same weights.

Same weights_sha256 as one step per call, the same committed steps, exact resume after
kills in the middle of a call, at a save point and at an epoch end, and zero lost steps
on preemption. DIGITS_FLAGS: 2 epochs x 10 steps, a save every 4 steps; with N=3 the
calls end at global steps 3, 4, 7, 8, 10 | 13, 16, 19, 20 (never across a save point or
an epoch end).
"""

import os
import signal

import pytest

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until, worker_pids
from resilient_train.errors import EXIT_PREEMPTED

N3 = ("--steps-per-execution", "3")
SLOW_DIGITS = "tests/recipes/slow_digits.py"


def committed_steps(job, attempt=None):
    return [e["global_step"] for e in job.named("checkpoint_committed") if attempt is None or e["attempt"] == attempt]


def reached(job, attempt):
    return next(e["global_step"] for e in job.named("attempt_reached") if e["attempt"] == attempt)


@pytest.mark.parametrize("steps_per_execution", [pytest.param("1", marks=pytest.mark.slow), "3"])  # 1: slow, a variant
def test_n_steps_per_call_trains_the_same_weights_and_commits_the_same_steps(tmp_path, digits_reference,
                                                                           steps_per_execution):
    """The reference ran with the default (auto: the chief sizes calls by time)."""
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, "--steps-per-execution", steps_per_execution)
    assert job.returncode == 0, job.output
    assert job.summary["weights_sha256"] == digits_reference
    assert committed_steps(job) == [4, 8, 10, 12, 16, 20]
    assert [e["global_step"] for e in job.named("epoch_finished")] == [10, 20]


@pytest.mark.parametrize(
    "fault, mode, call_end",
    [
        # step 6 is inside the call 4 -> 7: the fault fires at that call's end (sync saves,
        # so step 4 is surely committed before that call starts)
        ({"point": "after_step", "global_step": 6, "rank": 0}, "sync", 7),
        # a save point: the call ends exactly at 8, which is committed before the kill
        pytest.param({"point": "after_commit", "global_step": 8, "rank": 0}, "async", 8, marks=pytest.mark.slow),
        # the epoch end (10) on the non-chief: the chief may or may not have committed 10
        pytest.param({"point": "after_step", "global_step": 10, "rank": 1}, "async", 10, marks=pytest.mark.slow),
    ],
    ids=["mid-call", "save-point", "epoch-end"],
)
def test_kills_at_every_kind_of_call_boundary_resume_exactly(tmp_path, digits_reference, fault, mode, call_end):
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, *N3, "--checkpoint-mode", mode, faults=[fault])
    assert job.returncode == 0, job.output
    assert [g["attempt"] for g in job.named("gang_restart")] == [2]
    assert reached(job, 1) >= call_end
    # async saves: the kill may beat the newest background commit, never the one before
    restored = [r["global_step"] for r in job.named("restored")]
    assert len(restored) == 1 and restored[0] == committed_steps(job, 1)[-1]
    assert restored[0] in (4, 8, 10) and restored[0] <= call_end
    if mode == "sync":
        assert restored[0] == max(s for s in (4, 8, 10) if s <= call_end)
    assert committed_steps(job, 2) == [s for s in (4, 8, 10, 12, 16, 20) if s > restored[0]]
    assert job.summary["weights_sha256"] == digits_reference
    assert job.summary["lost_steps"] == reached(job, 1) - restored[0]


@pytest.mark.slow  # test_supervisor.py's SIGTERM to a worker, with auto-sized calls
def test_sigterm_with_n_steps_per_call_loses_no_step(tmp_path, digits_reference):
    def after_first_commit(events):
        return any(e["event"] == "checkpoint_committed" for e in events)

    job = run_job_until(
        SLOW_DIGITS, tmp_path / "run", *DIGITS_FLAGS, *N3,
        when=after_first_commit,
        action=lambda proc, events: os.kill(worker_pids(events)[1], signal.SIGTERM),
    )
    assert job.returncode == 0, job.output
    preempted = job.named("preempted")
    assert len(preempted) == 1
    exits = {e["rank"]: e.get("exit_code") for e in job.named("worker_exited") if e["attempt"] == 1}
    assert exits == {0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}
    assert committed_steps(job, 1)[-1] == preempted[0]["global_step"]  # the agreed call end was saved
    assert [r["global_step"] for r in job.named("restored")] == [preempted[0]["global_step"]]
    assert (job.summary["lost_steps"], job.summary["preemptions"]) == (0, 1)
    assert job.summary["weights_sha256"] == digits_reference


@pytest.mark.slow  # test_resume.py's external SIGKILL of the chief, with auto-sized calls
def test_external_sigkill_of_the_chief_mid_call_resumes_exactly(tmp_path, digits_reference):
    """A real kill lands wherever the chief is, almost always inside a 3-step call
    (0.45 s with the slow recipe); whatever it hit, the rerun restores the newest commit."""

    def first_commit(events):
        return any(e["event"] == "checkpoint_committed" for e in events)

    def kill_chief(proc, events):
        os.kill(worker_pids(events)[0], signal.SIGKILL)

    job = run_job_until(SLOW_DIGITS, tmp_path / "run", *DIGITS_FLAGS, *N3, when=first_commit, action=kill_chief)
    assert job.returncode == 0, job.output
    restored = [r["global_step"] for r in job.named("restored")]
    assert restored == [committed_steps(job, 1)[-1]]
    assert job.summary["weights_sha256"] == digits_reference
