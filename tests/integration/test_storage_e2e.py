"""Real jobs on a real S3 server (SeaweedFS) and on a faulty store."""

import json
import os
import subprocess
import sys
import time

import pytest

from resilient_train.cluster.ports import free_ports
from resilient_train.errors import EXIT_FAILURE, EXIT_USAGE

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import REPO, run_job


def storage_flags(target):
    return target.cli_flags()


@pytest.mark.s3
def test_s3_kill_chief_mid_upload_then_resume_exactly(tmp_path, s3_server, digits_reference):
    flags = storage_flags(s3_server)
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, *flags, faults=[{"point": "mid_upload", "global_step": 8, "rank": 0}])
    assert job.returncode == 0, job.output
    first = [e["global_step"] for e in job.named("checkpoint_committed") if e["attempt"] == 1]
    assert first == [4]  # step 8 was being uploaded when the chief died: never committed
    assert [r["global_step"] for r in job.named("restored")] == [4]
    assert job.named("worker_failed")[0]["signal"] == "SIGKILL"
    assert job.summary["weights_sha256"] == digits_reference
    assert job.summary["checkpoint"] == f"{s3_server.url_prefix}/ckpt-000000000020"

    verify = subprocess.run(
        [sys.executable, "-m", "resilient_train", "verify", s3_server.url_prefix, "--json", *flags[2:]],
        cwd=REPO, capture_output=True, text=True,
    )
    report = json.loads(verify.stdout)
    assert verify.returncode == 0, verify.stderr
    assert [c["global_step"] for c in report["checkpoints"]] == [12, 16, 20]  # --keep 3
    assert {c["status"] for c in report["checkpoints"]} == {"ok"}


@pytest.mark.gcs
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RT_SLOW") != "1", reason="the S3 job above covers the default suite; "
                    "RT_SLOW=1 (make test-all) runs the same job on GCS")
def test_gcs_kill_chief_mid_upload_then_resume_exactly(tmp_path, gcs_server, digits_reference):
    job = run_job(DIGITS, tmp_path / "run", *DIGITS_FLAGS, *storage_flags(gcs_server),
                  faults=[{"point": "mid_upload", "global_step": 8, "rank": 0}])
    assert job.returncode == 0, job.output
    committed = [(e["attempt"], e["global_step"]) for e in job.named("checkpoint_committed")]
    assert committed == [(1, 4), (2, 8), (2, 10), (2, 12), (2, 16), (2, 20)]
    assert [r["global_step"] for r in job.named("restored")] == [4]
    assert job.summary["weights_sha256"] == digits_reference
    assert job.summary["checkpoint"] == f"{gcs_server.url_prefix}/ckpt-000000000020"


@pytest.mark.slow  # retries: tests/checkpoint on every backend
def test_transient_storage_faults_at_20_percent_are_retried(tmp_path, digits_reference):
    storage = f"faulty://{tmp_path / 'ckpts'}"
    job = run_job(
        DIGITS, tmp_path / "run", *DIGITS_FLAGS, "--storage", storage,
        env={"RT_FAULTFS": json.dumps({"transient_rate": 0.2, "seed": 11})},
    )
    assert job.returncode == 0, job.output
    retries = job.named("storage_retry")
    assert len(retries) > 0
    assert all(r["try_number"] >= 1 and r["error"] for r in retries)
    assert any(r.get("rank") == 0 and r["op"] == "upload" for r in retries)  # the chief's commits were retried
    assert job.summary["restarts"] == 0
    assert job.summary["weights_sha256"] == digits_reference


def stalled_storage_env(plan: dict) -> dict[str, str]:
    """Storage faults for some attempts only: faulty:// reads RT_CHAOS_FAULTFS with the
    process's RT_ATTEMPT when it is created, so the supervisor and later attempts see a
    healthy store."""
    return {"RT_CHAOS_FAULTFS": json.dumps(plan)}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RT_SLOW") != "1", reason="a second full digits run: RT_SLOW=1 (make test-all); "
                    "tests/checkpoint/test_stalls.py covers retrying through a stall on every backend")
def test_an_upload_that_stalls_is_given_up_and_retried_through(tmp_path, digits_reference):
    # The chief's writes through the wrapper are its uploads, two per checkpoint (on a local
    # disk the generation claim and the fenced manifest are hard links beside it): #2 is
    # step 4's second file, and it never returns (no stall_s: until released, which nobody does).
    job = run_job(
        DIGITS, tmp_path / "run", *DIGITS_FLAGS, "--storage", f"faulty://{tmp_path / 'ckpts'}",
        "--storage-timeout", "2", env=stalled_storage_env({"1": {"stall_write_k": 2}}),
    )
    assert job.returncode == 0, job.output
    (retry,) = job.named("storage_retry")
    assert (retry["rank"], retry["op"], retry["try_number"]) == (0, "upload", 1)
    assert retry["path"].startswith(f"faulty://{tmp_path / 'ckpts'}/ckpt-000000000004/")
    assert retry["error"].endswith(" made no progress for 2 s (storage stalled)")
    assert [e["global_step"] for e in job.named("checkpoint_committed")] == [4, 8, 10, 12, 16, 20]
    assert job.summary["restarts"] == 0
    assert job.summary["weights_sha256"] == digits_reference


@pytest.mark.slow  # a store that goes quiet fails the save and commits nothing on every backend: tests/checkpoint/test_stalls.py
def test_a_store_that_goes_quiet_fails_the_save_and_the_run_resumes_exactly(tmp_path, digits_reference):
    # Attempt 1's chief: writes #1-#4 are step 4's four files (a mid-epoch save: the two
    # checkpoint files and each worker's tf.data iterator state); from #5 on (step 8's first
    # upload) every write stalls for good.
    storage = tmp_path / "ckpts"
    job = run_job(
        DIGITS, tmp_path / "run", *DIGITS_FLAGS, "--storage", f"faulty://{storage}", "--storage-timeout", "1",
        env=stalled_storage_env({"1": {"stall_write_k": 5, "stall_count": 0}}),
    )
    assert job.returncode == 0, job.output
    committed = [(e["attempt"], e["global_step"]) for e in job.named("checkpoint_committed")]
    assert committed == [(1, 4), (2, 8), (2, 10), (2, 12), (2, 16), (2, 20)]
    (failed,) = job.named("checkpoint_failed")
    assert (failed["attempt"], failed["rank"], failed["global_step"]) == (1, 0, 8)
    assert failed["error"].startswith("StorageUnavailableError: upload ")
    assert failed["error"].endswith(" made no progress for 1 s (storage stalled) (the partial upload was removed)")
    assert len([r for r in job.named("storage_retry") if r["attempt"] == 1]) == 4  # 5 tries, 4 retries
    exited = [e for e in job.named("worker_exited") if e["attempt"] == 1 and e["rank"] == 0]
    assert [e["exit_code"] for e in exited] == [EXIT_FAILURE]  # storage unavailable: restartable
    assert [(e["attempt"], e["global_step"]) for e in job.named("restored")] == [(2, 4)]
    assert job.summary["restarts"] == 1
    assert job.summary["weights_sha256"] == digits_reference


# ---------------------------------------------------------------- an unreachable store
# docs/commands.md: one line naming the URL, exit 2, before any worker starts; the storage
# client's own retries against a dead endpoint (s3fs ~10 s a try, gcsfs ~33 s) never run.
UNREACHABLE_WITHIN_S = 20  # the reach check's deadline is 5 s; the rest is Python start-up on a busy host


def run_refused(tmp_path, *flags):
    started = time.monotonic()
    job = run_job("recipes/linear_regression.py", tmp_path / "run", *flags, timeout=120)
    return job, time.monotonic() - started


def assert_refused_before_any_worker(job, seconds, line):
    assert job.returncode == EXIT_USAGE, job.output
    assert job.output.splitlines() == [line]
    assert seconds < UNREACHABLE_WITHIN_S
    assert not (job.run_dir / "attempt-1").exists()
    assert not (job.run_dir / "events.jsonl").exists()  # refused before the supervisor ran: no worker_started


def test_an_s3_endpoint_that_refuses_connections_exits_2_before_any_worker(tmp_path):
    (port,) = free_ports(1)  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    job, seconds = run_refused(tmp_path, "--storage", "s3://bucket/x",
                               f"--storage-option=client_kwargs.endpoint_url={endpoint}")
    assert_refused_before_any_worker(job, seconds, (
        f"resilient-train: error: cannot reach checkpoint storage s3://bucket/x (endpoint {endpoint}): "
        f"127.0.0.1:{port} refused the connection: nothing listens there; check the network and "
        "--storage-option client_kwargs.endpoint_url"))


def test_a_gcs_endpoint_that_cannot_be_reached_exits_2_before_any_worker(tmp_path):
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"  # how tests/support/gcsserver.py points gcsfs at its emulator
    job, seconds = run_refused(tmp_path, "--storage", "gcs://b/x", f"--storage-option=endpoint_url={endpoint}",
                               "--storage-option=token=anon")
    assert_refused_before_any_worker(job, seconds, (
        f"resilient-train: error: cannot reach checkpoint storage gcs://b/x (endpoint {endpoint}): "
        f"127.0.0.1:{port} refused the connection: nothing listens there; check the network and "
        "--storage-option endpoint_url"))


def test_retries_of_the_storage_check_are_shown_on_the_console_as_they_happen(tmp_path):
    # Every operation fails transiently: the supervisor's probe (its first operation on a
    # local store is makedirs) is tried 5 times, then exit 2; each retry is a console line.
    storage = f"faulty://{tmp_path / 'ckpts'}"
    job, _ = run_refused(tmp_path, "--storage", storage, "--storage-option=transient_rate=1.0")
    assert job.returncode == EXIT_USAGE, job.output
    *shown, error = [line.partition("  ")[2] or line for line in job.output.splitlines()]  # HH:MM:SS  text
    cause = f"ConnectionResetError: injected transient fault in makedirs {tmp_path / 'ckpts'}"
    assert [line.rpartition(" in ")[0] for line in shown] == [
        f"storage makedirs of {storage} failed ({cause}); try {n} again" for n in (1, 2, 3, 4)]
    assert error == f"resilient-train: error: makedirs {storage} failed 5 times; last error: {cause}"
    assert [e["try_number"] for e in job.named("storage_retry")] == [1, 2, 3, 4]
    assert job.named("worker_started") == [] and not (job.run_dir / "attempt-1").exists()
