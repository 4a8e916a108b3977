"""Real jobs on a real S3 server (SeaweedFS) and on a faulty store."""

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import REPO, run_job


def storage_flags(target):
    flags = ["--storage", target.url_prefix]
    for key, value in target.storage_options.items():
        if isinstance(value, dict):
            flags += [f"--storage-option={key}.{k}={v}" for k, v in value.items()]
        else:
            flags += [f"--storage-option={key}={value}"]
    return flags


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
