"""Sharded saves with real workers: each worker uploads its share, the chief commits, and a
kill -9 of a worker then a gang restart, each worker reading only its own share from the store
(read-once restore), ends with the exact weights of an unsharded run.

The in-process proofs (the files are one standard TF checkpoint; plain
``tf.train.Checkpoint.restore`` reads them) are tests/runner/state/test_sharded_save.py;
the store's contract (records, waiting, fencing) is tests/checkpoint/test_shares.py.
"""

import pytest

from resilient_train.checkpoint import CheckpointStore
from resilient_train.checkpoint.shares import data_file_name
from tests.integration.harness import run_job
from tests.integration.test_storage_e2e import storage_flags

WIDE = "recipes/wide_mlp.py"
# 64 -> 128 -> 128 -> 64 -> 10: kernels of 2, 4 and 2 units (x3 with Adam's slots), which two
# shares split evenly by bytes (~0.2 MB of state); one step per call, so the kill lands at 13.
WIDE_FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "16", "--save-every-steps", "4",
              "--steps-per-execution", "1", "--set", "features=64", "--set", "width=128")
SHARES = [data_file_name("ckpt", k, 2) for k in range(2)]


# Attempt 2's ranks restore as on hosts without the chief's host cache (a replaced node), so
# their restore reads from the store, which restore_read counts.
OTHER_HOSTS = [{"point": "other_host", "global_step": 0, "rank": rank, "attempt": 2} for rank in (0, 1)]


def test_each_worker_uploads_its_share_and_a_killed_worker_resumes_exactly(tmp_path):
    reference = run_job(WIDE, tmp_path / "reference", *WIDE_FLAGS, "--sharded-save", "off")
    assert reference.returncode == 0, reference.output
    assert [(e["sharded"], e["reason"]) for e in reference.named("sharded_save")] == [(False, "--sharded-save off")]

    job = run_job(WIDE, tmp_path / "run", *WIDE_FLAGS, "--sharded-save", "on",
                  faults=[{"point": "after_step", "global_step": 13, "rank": 1}, *OTHER_HOSTS])
    assert job.returncode == 0, job.output
    assert [(e["attempt"], e["sharded"], e["shards"]) for e in job.named("sharded_save")] == [(1, True, 2), (2, True, 2)]
    assert [g["root_cause_rank"] for g in job.named("gang_restart")] == [1]
    committed = [e for e in job.named("checkpoint_committed") if e["attempt"] == 1]
    assert committed[-1]["global_step"] in (10, 12)  # 12 unless the kill beat its shares' commit (10: an epoch end)
    # persist_s spans the local write and the commit that commit_s times (benchmarks/sharded_save_capped.py)
    assert all(e["persist_s"] >= e["commit_s"] for e in job.named("checkpoint_committed"))
    assert all(e["persist_s"] >= e["upload_s"] for e in job.named("checkpoint_share_uploaded"))
    assert [r["global_step"] for r in job.named("restored")] == [committed[-1]["global_step"]]
    # Read once: each rank read the index, the small files and its own share from the store, and
    # got the other share from its peer; the checkpoint's bytes were read about once, not twice.
    reads = sorted((e for e in job.named("restore_read")), key=lambda e: e["rank"])
    size = committed[-1]["size"]
    assert [(e["rank"], e["global_step"], e["read_once"]) for e in reads] == [
        (0, committed[-1]["global_step"], True), (1, committed[-1]["global_step"], True)]
    assert [e["source"] for e in job.named("checkpoint_fetched") if e["attempt"] == 2] == ["read_once"] * 2
    shares_bytes = sum(e["peer_bytes"] for e in reads)  # each share sent once, to the rank without it
    assert all(e["peer_bytes"] > 0.4 * shares_bytes for e in reads)
    assert sum(e["store_bytes"] for e in reads) == 2 * size - shares_bytes < 1.1 * size
    # Rank 1 uploaded its own share of every committed checkpoint of attempt 2.
    uploaded = {(e["global_step"], e["file"]) for e in job.named("checkpoint_share_uploaded") if e["attempt"] == 2}
    saves = [step for step in range(committed[-1]["global_step"] + 1, 21) if step % 4 == 0 or step % 10 == 0]
    assert sorted(uploaded) == [(step, SHARES[1]) for step in saves]
    assert [e["global_step"] for e in job.named("checkpoint_committed") if e["attempt"] == 2] == saves
    assert job.summary["weights_sha256"] == reference.summary["weights_sha256"]

    manifest = CheckpointStore(str(tmp_path / "run" / "checkpoints")).latest_manifest()
    assert manifest is not None and manifest.global_step == 20
    assert manifest.extra["sharded_save"]["writers"] == {SHARES[0]: 0, SHARES[1]: 1}
    sizes = [manifest.files[name].size for name in SHARES]
    assert all(abs(size - sum(sizes) / 2) <= 0.1 * sum(sizes) / 2 for size in sizes), sizes


@pytest.mark.s3
@pytest.mark.slow  # the default test above covers the sharded path on a local store; RT_SLOW=1 runs it on S3
def test_s3_worker_killed_while_uploading_its_share_leaves_the_previous_checkpoint(tmp_path, s3_server):
    reference = run_job(WIDE, tmp_path / "reference", *WIDE_FLAGS, "--sharded-save", "off")
    assert reference.returncode == 0, reference.output
    job = run_job(WIDE, tmp_path / "run", *WIDE_FLAGS, "--sharded-save", "on", *storage_flags(s3_server),
                  faults=[{"point": "mid_upload", "global_step": 8, "rank": 1}, *OTHER_HOSTS])
    assert job.returncode == 0, job.output
    committed = [e for e in job.named("checkpoint_committed") if e["attempt"] == 1]
    assert [e["global_step"] for e in committed] == [4]
    assert [r["global_step"] for r in job.named("restored")] == [4]  # 8: its share uploaded, never recorded
    # Read once from S3: the two ranks' reads add up to the checkpoint and the small files once more.
    reads = job.named("restore_read")
    assert sorted((e["rank"], e["read_once"]) for e in reads) == [(0, True), (1, True)]
    assert sum(e["store_bytes"] for e in reads) == 2 * committed[0]["size"] - sum(e["peer_bytes"] for e in reads)
    assert job.named("worker_failed")[0]["signal"] == "SIGKILL"
    assert job.summary["weights_sha256"] == reference.summary["weights_sha256"]
    manifest = CheckpointStore(s3_server.url_prefix, s3_server.storage_options).latest_manifest()
    assert manifest is not None and manifest.extra["sharded_save"]["writers"] == {SHARES[0]: 0, SHARES[1]: 1}


@pytest.mark.slow  # the default test above covers the sharded path; this adds the memory tier's rescue
def test_a_rescue_stops_the_chiefs_wait_for_a_dead_workers_share(tmp_path):
    reference = run_job(WIDE, tmp_path / "reference", *WIDE_FLAGS, "--sharded-save", "off")
    assert reference.returncode == 0, reference.output
    job = run_job(WIDE, tmp_path / "run", *WIDE_FLAGS, "--sharded-save", "on", tier_default=True,
                  faults=[{"point": "after_step", "global_step": 13, "rank": 1}])
    assert job.returncode == 0, job.output
    assert job.named("rescue_skipped") == []
    (rescued,) = job.named("rescue_committed")
    assert [r["global_step"] for r in job.named("restored")] == [rescued["global_step"]]
    assert job.summary["weights_sha256"] == reference.summary["weights_sha256"]
