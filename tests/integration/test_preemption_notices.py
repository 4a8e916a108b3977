"""A cloud preemption notice, served by a loopback metadata server that speaks the provider's
protocol (tests/support/metadata_server.py), ends a run the way SIGTERM does: the group saves
the step it agreed on and exits 143, and a re-run resumes there with zero lost steps. No
signal is sent by anyone."""

from __future__ import annotations

import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.conftest import DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until
from tests.support.metadata_server import MetadataServer

SLOW_DIGITS = "tests/recipes/slow_digits.py"  # digits_cnn, same weights, a delay per step
# 0.6 s per step: 12 s of training, longer than AWS's 5 s between polls after the first commit.
SLOW = ("--set", "step_delay_s=0.6")
KINDS = {"gce": ("preempted", None), "aws": ("spot_terminate", "2026-11-26T12:02:00Z"),
         "azure": ("Preempt", "2026-11-26T12:00:30Z")}


def after_first_commit(events):
    return any(e["event"] == "checkpoint_committed" for e in events)


# aws: RT_SLOW. Its protocol (IMDSv2 token, spot/instance-action) is tested against the same loopback
# server in tests/cluster/notices/test_notices.py; gce and azure (the acknowledgement after the save)
# run this end to end by default.
@pytest.mark.parametrize("provider", ["gce", pytest.param("aws", marks=pytest.mark.slow), "azure"])
def test_a_notice_saves_the_agreed_step_exits_143_and_the_rerun_loses_nothing(provider, tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    with MetadataServer(provider) as server:
        job = run_job_until(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, *SLOW, when=after_first_commit,
                            action=lambda proc, events: server.announce(), env=server.environ())
    assert job.returncode == EXIT_PREEMPTED, job.output
    assert job.summary["status"] == "preempted"

    watched = job.named("preemption_notice_watch")
    assert sorted((e["rank"], e["provider"], e["setting"]) for e in watched) == [(0, provider, "auto"),
                                                                                  (1, provider, "auto")]
    kind, deadline = KINDS[provider]
    # Each worker watches its own node (here both the same server), on its own clock: the
    # first to see the notice votes stop in the next all-reduce, and a peer that polls later
    # (AWS: every 5 s) may see it only after the group agreed, or not before it exits.
    notices = job.named("preemption_notice")
    noticed = {e["rank"] for e in notices}
    assert noticed <= {0, 1} and len(notices) == len(noticed) >= 1  # once per worker that saw it
    assert {(e["provider"], e["kind"], e["action"], e["deadline"]) for e in notices} == {
        (provider, kind, "stop", deadline)}
    # The stop came from the notice: the noticing workers' votes, the supervisor's stop after
    # the fact (its host is doomed); no signal from anyone.
    votes = [e["source"] for e in job.named("preemption_requested") if e["source"].startswith("worker:")]
    others = [e["source"] for e in job.named("preemption_requested") if not e["source"].startswith("worker:")]
    assert others == [f"notice:{provider}"]
    assert 1 <= len(votes) == len(set(votes)) and {int(v.split(":")[1]) for v in votes} <= noticed
    exits = {e["rank"]: (e.get("exit_code"), e.get("signal")) for e in job.named("worker_exited")}
    assert exits == {0: (EXIT_PREEMPTED, None), 1: (EXIT_PREEMPTED, None)}

    preempted = job.named("preempted")
    assert len(preempted) == 1
    step = preempted[0]["global_step"]
    assert 4 <= step < 20  # after the first commit, before the end
    committed = [e["global_step"] for e in job.named("checkpoint_committed")]
    assert committed[-1] == step  # the agreed step was saved
    saved = job.named("preemption_notice_saved")  # by each worker that had its notice before the save returned
    assert {e["rank"] for e in saved} >= {int(v.split(":")[1]) for v in votes}
    assert {(e["provider"], e["kind"], e["global_step"]) for e in saved} == {(provider, kind, step)}
    assert all(e["seconds"] >= 0 for e in saved)
    if provider == "azure":  # acknowledged only after the save, by each worker that reported it
        assert server.acknowledged == [{"StartRequests": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297"}]}] * len(saved)

    rerun = run_job(SLOW_DIGITS, run_dir, *DIGITS_FLAGS, "--set", "step_delay_s=0")  # no metadata server now
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [step]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == digits_reference


def test_a_live_migration_notice_saves_the_agreed_step_and_the_run_goes_on(tmp_path, digits_reference):
    """GCE's MIGRATE_ON_HOST_MAINTENANCE: the machine survives; one agreed save, no stop."""
    flags = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "0")
    with MetadataServer("gce") as server:
        job = run_job_until(SLOW_DIGITS, tmp_path / "run", *flags, *SLOW, when=after_first_commit,
                            action=lambda proc, events: server.set_gce("instance/maintenance-event",
                                                                       "MIGRATE_ON_HOST_MAINTENANCE"),
                            env=server.environ())
    assert job.returncode == 0, job.output
    notices = job.named("preemption_notice")
    assert {(e["provider"], e["kind"], e["action"]) for e in notices} == {("gce", "MIGRATE_ON_HOST_MAINTENANCE", "save")}
    assert job.named("preempted") == [] and job.named("preemption_requested") == []
    committed = [e["global_step"] for e in job.named("checkpoint_committed")]
    assert committed[0] == 10 and committed[-1] == 20  # the epoch ends (--save-every-steps 0)
    assert len(committed) == 3 and 10 < committed[1] < 20  # and the one the notice asked for, mid-epoch
    summary = job.summary
    assert (summary["status"], summary["preemptions"], summary["restarts"], summary["lost_steps"]) == (
        "completed", 0, 0, 0)
    assert summary["weights_sha256"] == digits_reference
