"""Real runs through ``resilient-train diff`` and ``verify --deep`` (issue 22).

Three short runs of the linear recipe (2 epochs x 10 steps, a commit every 5 steps): the
reference, the same job with the chief SIGKILLed right after committing step 10 (the gang
restarts and resumes), and the same job with another seed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from resilient_train.errors import EXIT_FAILURE, EXIT_OK

from tests.integration.harness import REPO, environment, run_job

LINEAR = "recipes/linear_regression.py"
FLAGS = ("--epochs", "2")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resilient_train", *args], cwd=REPO, env=environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)


@pytest.mark.slow  # three runs; diff's logic on recorded checkpoints: tests/commands/test_diff.py; a real checkpoint read: the verify --deep test below
def test_diff_names_the_first_commit_for_another_seed_and_nothing_for_a_resumed_run(tmp_path):
    reference = run_job(LINEAR, tmp_path / "reference", *FLAGS)
    assert reference.returncode == 0, reference.output
    commits = [e["global_step"] for e in reference.named("checkpoint_committed")]
    assert commits[:2] == [5, 10] and all(len(e["weights_sha256"]) == 64 for e in reference.named("checkpoint_committed"))
    assert sorted({e["epoch"] for e in reference.named("input_digest")}) == [0, 1]

    resumed = run_job(LINEAR, tmp_path / "resumed", *FLAGS,
                      faults=[{"point": "after_commit", "global_step": 10, "rank": 0}])
    assert resumed.returncode == 0, resumed.output
    assert [r["global_step"] for r in resumed.named("restored")] == [10]
    same = cli("diff", str(reference.run_dir), str(resumed.run_dir), "--json")
    assert same.returncode == EXIT_OK, same.stdout + same.stderr
    record = json.loads(same.stdout)
    assert record["common_steps"] == commits and record["first_divergent_step"] is None
    assert record["last_matching_step"] == commits[-1] and record["first_divergent_epoch"] is None

    itself = cli("diff", str(reference.run_dir), str(reference.run_dir / "checkpoints"))  # events vs manifests
    assert itself.returncode == EXIT_OK, itself.stdout + itself.stderr
    assert itself.stdout.splitlines()[-1] == "identical trajectories"

    seeded = run_job(LINEAR, tmp_path / "seeded", *FLAGS, "--seed", "2")
    assert seeded.returncode == 0, seeded.output
    other = cli("diff", str(reference.run_dir), str(seeded.run_dir), "--json")
    assert other.returncode == EXIT_FAILURE, other.stdout + other.stderr
    record = json.loads(other.stdout)
    assert (record["first_divergent_step"], record["last_matching_step"]) == (5, None)  # the first commit
    assert record["first_divergent_epoch"] == 0
    assert [c["field"] for c in record["fingerprint_changes"]] == ["seed"]


def test_verify_deep_restores_a_real_checkpoint_with_the_recorded_recipe(tmp_path):
    run = run_job(LINEAR, tmp_path / "run", "--epochs", "1")
    assert run.returncode == 0, run.output
    checked = cli("verify", str(run.run_dir / "checkpoints"), "--deep", "--all", "--json")
    assert checked.returncode == EXIT_OK, checked.stdout + checked.stderr
    deep = json.loads(checked.stdout)["deep"]
    assert deep["recipe"] == str(REPO / LINEAR) and deep["recipe_changed"] is False
    committed = {e["global_step"]: e["weights_sha256"] for e in run.named("checkpoint_committed")}
    kept = [c["global_step"] for c in json.loads(checked.stdout)["checkpoints"] if c["status"] == "ok"]
    assert [c["global_step"] for c in deep["checkpoints"]] == kept and kept
    for result in deep["checkpoints"]:
        assert result["consistent"] and result["unexpected"] == [] and result["missing"] == []
        assert result["weights_sha256"]["restored"] == committed[result["global_step"]]
