"""Issue 24 end to end: credentials never on disk or in output, and a private run dir.

A real SeaweedFS S3 gateway that accepts exactly one identity (anonymous requests are
refused, so the credentials are really needed), a real 2-worker job that is killed once and
resumes, then every byte the run wrote (run dir, console, every checkpoint object) is
searched for the credentials.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from resilient_train.checkpoint import CheckpointStore
from tests.integration.harness import run_job
from tests.support.s3server import SeaweedS3

LINEAR = "recipes/linear_regression.py"  # 3 epochs x 10 steps, a save every 5 steps
FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--save-every-steps", "5")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _modes(root: Path) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"dirs": {stat.S_IMODE(root.stat().st_mode)}, "files": set()}
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        found["dirs" if path.is_dir() else "files"].add(stat.S_IMODE(path.stat().st_mode))
    return found


@pytest.mark.s3
def test_credentials_reach_no_file_no_console_no_checkpoint_and_the_run_resumes(tmp_path):
    access_key = f"RTAK{uuid.uuid4().hex[:16].upper()}"
    secret_key = f"rt-secret-{uuid.uuid4().hex}"
    with SeaweedS3(tmp_path / "weed", access_key=access_key, secret_key=secret_key) as server:
        import s3fs

        anonymous = s3fs.S3FileSystem(anon=True, skip_instance_cache=True,
                                      client_kwargs={"endpoint_url": server.endpoint_url})
        with pytest.raises(PermissionError):  # the credentials are needed: no anonymous access
            anonymous.pipe_file(f"{server.bucket}/anon-probe", b"x")

        storage = f"s3://{server.bucket}/secure"
        endpoint = f"client_kwargs.endpoint_url={server.endpoint_url}"
        job = run_job(
            LINEAR, tmp_path / "run", *FLAGS, "--storage", storage, "--storage-option", endpoint,
            "--storage-option", f"key={access_key}", "--storage-option", f"secret={secret_key}",
            faults=[{"point": "after_commit", "global_step": 10, "rank": 0, "attempt": 1, "signal": "SIGKILL"}],
        )
        assert job.returncode == 0, job.output
        assert [r["global_step"] for r in job.named("restored")] == [10]  # killed once, resumed from S3
        assert job.summary["restarts"] == 1

        store = CheckpointStore(storage, server.storage_options)
        manifest = store.latest_manifest()
        assert manifest is not None and manifest.global_step == 20
        assert job.summary["weights_sha256"] == manifest.weights_sha256

        job_json = json.loads((tmp_path / "run" / "attempt-2" / "job.json").read_text())
        assert job_json["storage_options"] == {"client_kwargs": {"endpoint_url": server.endpoint_url},
                                               "key": "***", "secret": "***"}
        assert job.output.count("resilient-train: warning: --storage-option key, secret on the command line") == 1

        secrets = (access_key.encode(), secret_key.encode())
        leaks = [str(p) for p in _files(tmp_path / "run") if any(s in p.read_bytes() for s in secrets)]
        assert leaks == []
        assert not any(s.decode() in job.output for s in secrets)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options)
        objects = [path for path in fs.find(storage)]
        assert len(objects) > 10  # manifests, variables, OWNER/fence records
        assert [o for o in objects if any(s in fs.cat_file(o) for s in secrets)] == []

        # The same job with the credentials where the warning points (the backend's own
        # environment variables): nothing on the command line, the same weights exactly.
        again = run_job(
            LINEAR, tmp_path / "again", *FLAGS, "--storage", f"s3://{server.bucket}/env", "--storage-option", endpoint,
            env={"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
        )
        assert again.returncode == 0, again.output
        assert again.summary["weights_sha256"] == job.summary["weights_sha256"]
        assert "warning" not in again.output

    assert _modes(tmp_path / "run") == {"dirs": {0o700}, "files": {0o600}}  # private by default


def test_run_dir_mode_0750_shares_the_run_with_the_group(tmp_path):
    job = run_job(LINEAR, tmp_path / "team", "--epochs", "1", "--steps-per-epoch", "5", "--run-dir-mode", "0750")
    assert job.returncode == 0, job.output
    assert _modes(tmp_path / "team") == {"dirs": {0o750}, "files": {0o640}}
    assert oct(os.stat(tmp_path / "team" / "events.jsonl").st_mode & 0o777) == "0o640"
