"""One owner per run dir (supervisor.lock) and per storage (OWNER.json), with real runs."""

from __future__ import annotations

import json
import signal

from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE
from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job, run_job_until


def test_a_second_run_on_the_same_run_dir_exits_2_naming_the_holder(tmp_path, digits_reference):
    run_dir = tmp_path / "run"
    second = {}

    def start_a_second_run(proc, events):
        second["job"] = run_job(DIGITS, run_dir, *DIGITS_FLAGS, timeout=120)
        second["holder_pid"] = proc.pid

    first = run_job_until(
        DIGITS, run_dir, *DIGITS_FLAGS,
        when=lambda events: any(e["event"] == "worker_started" for e in events),
        action=start_a_second_run,
    )
    refused = second["job"]
    assert refused.returncode == EXIT_USAGE, refused.output
    assert refused.output.startswith(
        f"resilient-train: error: run dir {run_dir} is in use by another resilient-train run "
        f"(pid {second['holder_pid']} on host "
    )
    assert "pass another --run-dir" in refused.output
    assert len(refused.output.strip().splitlines()) == 2
    # The first run was not disturbed: one run_started, its own digest, exit 0.
    assert first.returncode == EXIT_OK, first.output
    assert len(first.named("run_started")) == 1
    assert first.summary["weights_sha256"] == digits_reference
    holder = json.loads((run_dir / "supervisor.lock").read_text())
    assert (holder["pid"], holder["run_id"]) == (second["holder_pid"], first.summary["run_id"])


def test_another_run_on_an_owned_storage_exits_2_unless_forced(tmp_path, digits_reference):
    storage = tmp_path / "shared-storage"
    flags = (*DIGITS_FLAGS, "--storage", str(storage))
    owner = run_job_until(
        DIGITS, tmp_path / "owner", *flags,
        when=lambda events: any(e["event"] == "checkpoint_committed" for e in events),
        action=lambda proc, events: proc.send_signal(signal.SIGTERM),
    )
    assert owner.returncode == EXIT_PREEMPTED, owner.output
    owner_id = owner.summary["run_id"]
    assert json.loads((storage / "OWNER.json").read_text())["run_id"] == owner_id
    committed = sorted(p.name for p in storage.glob("ckpt-*"))

    refused = run_job(DIGITS, tmp_path / "other", *flags)
    assert refused.returncode == EXIT_USAGE, refused.output
    assert refused.output.startswith(
        f"resilient-train: error: checkpoint storage {storage} belongs to run {owner_id} "
        f"(run dir {tmp_path / 'owner'} on "
    )
    assert "Pass --force-storage to take it over" in refused.output
    assert refused.named("worker_started") == []
    assert sorted(p.name for p in storage.glob("ckpt-*")) == committed

    taken = run_job(DIGITS, tmp_path / "other", *flags, "--force-storage")
    assert taken.returncode == EXIT_OK, taken.output
    [claimed] = taken.named("storage_claimed")
    assert (claimed["previous_run_id"], claimed["forced"]) == (owner_id, True)
    # It resumed the owner's checkpoints and finished exactly; its chief is generation 2.
    assert [e["global_step"] for e in taken.named("restored")] == [int(committed[-1][5:])]
    assert [e["generation"] for e in taken.named("generation_claimed")] == [2]
    assert taken.summary["weights_sha256"] == digits_reference
    assert json.loads((storage / "OWNER.json").read_text())["run_id"] == taken.summary["run_id"]
