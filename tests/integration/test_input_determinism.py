"""Exact resume with unseeded randomness in dataset(), and the resume check.

The runner reseeds TensorFlow, NumPy's and Python's global generators from (seed, epoch)
before each dataset() call, so a recipe whose shuffle() has no seed resumes bit-exactly in
epoch 1, and one that adds np.random / random noise resumes bit-exactly at an epoch
boundary (issue 36). Input the runner cannot make deterministic (a generator with its own
entropy) is detected after the restore, mid-epoch or at an epoch boundary: an
input_mismatch event and a console line, or exit 3 with --strict-resume.
"""

import pytest

from tests.integration.conftest import DIGITS_FLAGS
from tests.integration.harness import recipe_variant as variant, run_job

FLAGS = ("--workers", "1", "--epochs", "3", "--steps-per-epoch", "10", "--global-batch-size", "4",
         "--save-every-steps", "5", "--max-restarts", "2")
KILL_IN_EPOCH_1 = [{"point": "after_commit", "global_step": 15, "rank": 0}]  # epoch 1, step_in_epoch 5



def unseeded_shuffle(tmp_path):
    return variant(tmp_path, "unseeded", "ds.shuffle(len(features), seed=seed * 1000 + epoch)", "ds.shuffle(len(features))")


def entropy_order(tmp_path):
    # np.random.default_rng() without a seed: OS entropy, which no reseeding reaches.
    return variant(tmp_path, "entropy_order", "features = np.tile(",
                   "order = np.random.default_rng().permutation(24)\n    features = np.tile(")


def test_unseeded_shuffle_killed_in_epoch_1_ends_with_the_reference_digest(tmp_path):
    recipe = unseeded_shuffle(tmp_path)
    reference = run_job(recipe, tmp_path / "reference", *FLAGS)
    assert reference.returncode == 0, reference.output
    killed = run_job(recipe, tmp_path / "killed", *FLAGS, faults=KILL_IN_EPOCH_1)
    assert killed.returncode == 0, killed.output
    assert [(r["epoch"], r["global_step"]) for r in killed.named("restored")] == [(1, 15)]
    assert killed.named("input_mismatch") == []
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]


def test_input_the_runner_cannot_seed_is_reported_after_the_restore(tmp_path):
    recipe = entropy_order(tmp_path)
    (tmp_path / "entropy_order.py").write_text(
        (tmp_path / "entropy_order.py").read_text().replace(
            "ds = tf.data.Dataset.from_tensor_slices((features, labels))",
            "ds = tf.data.Dataset.from_tensor_slices((features[order], labels[order]))"))
    job = run_job(recipe, tmp_path / "run", *FLAGS, faults=KILL_IN_EPOCH_1)
    assert job.returncode == 0, job.output
    mismatches = job.named("input_mismatch")
    assert [(m["epoch"], m["checkpoint"], m["strict"]) for m in mismatches] == [(1, "ckpt-000000000015", False)]
    assert mismatches[0]["expected_sha256"] != mismatches[0]["found_sha256"]

    strict = run_job(recipe, tmp_path / "strict", *FLAGS, "--strict-resume", faults=KILL_IN_EPOCH_1)
    assert strict.returncode == 3, strict.output
    assert "the first batch of epoch 1 differs from the one recorded" in strict.summary["root_cause"]["message"]
    assert "(--strict-resume)" in strict.output


# Issue 36: noise drawn in dataset() from an unseeded generator, at 2 workers, killed right
# after the epoch-end checkpoint of epoch 0 is committed: the restart restores exactly at
# the boundary (epoch 1, step 0), where no batch is skipped and no mid-epoch check ran.
NOISY = "tests/recipes/noisy_digits.py"
NOISY_FLAGS = (*DIGITS_FLAGS, "--workers", "2", "--max-restarts", "1")
KILL_AT_EPOCH_END = [{"point": "after_commit", "global_step": 10, "rank": 0}]  # ckpt 10: epoch 1, step 0


@pytest.mark.slow  # the runner's seeding of input it does not own: the unseeded shuffle's kill test above
@pytest.mark.parametrize("noise", [
    "numpy",
    pytest.param("python", marks=pytest.mark.slow),  # the same reseeding (seed_input_rng) as numpy's
])
def test_global_rng_noise_killed_at_an_epoch_boundary_ends_with_the_reference_digest(tmp_path, noise):
    flags = (*NOISY_FLAGS, "--set", f"noise={noise}")
    reference = run_job(NOISY, tmp_path / "reference", *flags)
    assert reference.returncode == 0, reference.output
    killed = run_job(NOISY, tmp_path / "killed", *flags, faults=KILL_AT_EPOCH_END)
    assert killed.returncode == 0, killed.output
    assert [(r["epoch"], r["step_in_epoch"], r["global_step"]) for r in killed.named("restored")] == [(1, 0, 10)]
    assert killed.named("input_mismatch") == []
    # The boundary checkpoint carried epoch 1's digest, taken before the epoch was entered;
    # the resumed attempt's rebuild of epoch 1 found the same one.
    recorded = {e["epoch"]: e["sha256"] for e in reference.named("input_digest")}
    assert [(e["attempt"], e["epoch"], e["sha256"]) for e in killed.named("input_digest")] == [
        (1, 0, recorded[0]), (1, 1, recorded[1]), (2, 1, recorded[1])]
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]


@pytest.mark.slow  # the report and --strict-resume of a changed input after a restore: the two tests around it;
# fresh entropy's detection: tests/runner/input/test_check_input.py
def test_fresh_entropy_noise_resumed_at_an_epoch_boundary_is_reported(tmp_path):
    flags = (*NOISY_FLAGS, "--set", "noise=entropy")
    job = run_job(NOISY, tmp_path / "run", *flags, faults=KILL_AT_EPOCH_END)
    assert job.returncode == 0, job.output
    recorded = [e["sha256"] for e in job.named("input_digest") if (e["attempt"], e["epoch"]) == (1, 1)]
    rebuilt = [e["sha256"] for e in job.named("input_digest") if (e["attempt"], e["epoch"]) == (2, 1)]
    assert len(recorded) == len(rebuilt) == 1 and recorded != rebuilt
    assert [{k: m[k] for k in ("epoch", "checkpoint", "expected_sha256", "found_sha256", "strict", "rank", "attempt")}
            for m in job.named("input_mismatch")] == [
        {"epoch": 1, "checkpoint": "ckpt-000000000010", "expected_sha256": recorded[0], "found_sha256": rebuilt[0],
         "strict": False, "rank": 0, "attempt": 2}]
    assert ("epoch 2's input differs from the one recorded with ckpt-000000000010, so the resumed run will not "
            "match an uninterrupted one; training on") in job.output
    assert (job.summary["exact"], job.summary["inexact"]) == (
        False, [{"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}])

    strict = run_job(NOISY, tmp_path / "strict", *flags, "--strict-resume", faults=KILL_AT_EPOCH_END)
    assert strict.returncode == 3, strict.output
    assert [(m["epoch"], m["checkpoint"], m["strict"]) for m in strict.named("input_mismatch")] == [
        (1, "ckpt-000000000010", True)]
    assert "the first batch of epoch 1 differs from the one recorded" in strict.summary["root_cause"]["message"]
    assert "epoch 2's input differs" in strict.output and "stopping (--strict-resume)" in strict.output
    assert strict.summary["exact"] is True  # it stopped before training on: its newest checkpoint is still exact


# Issue 51 item 2: the same noise, killed mid-epoch (rank 0 right after committing global
# step 12 = epoch 1, step 2 of DIGITS_FLAGS' 10-step epochs) and resumed. The resume check
# finds epoch 1's input changed; that was said once mid-run and then the run ended "Run
# completed" with summary.json, verify and a re-run saying nothing of it.
KILL_MID_EPOCH_1 = [{"point": "after_commit", "global_step": 12, "rank": 0}]
NOT_EXACT = "epoch 2's input differed from the one recorded with ckpt-000000000012"


def test_an_inexact_resume_is_said_at_the_end_in_the_summary_by_verify_and_by_a_rerun(tmp_path):
    import json
    import subprocess
    import sys

    from tests.integration.harness import REPO, environment

    flags = (*NOISY_FLAGS, "--set", "noise=entropy")
    job = run_job(NOISY, tmp_path / "run", *flags, faults=KILL_MID_EPOCH_1)
    assert job.returncode == 0, job.output
    assert [(r["epoch"], r["step_in_epoch"], r["global_step"]) for r in job.named("restored")] == [(1, 2, 12)]
    assert [(m["epoch"], m["checkpoint"]) for m in job.named("input_mismatch")] == [(1, "ckpt-000000000012")]
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000012"}

    summary = job.summary
    assert (summary["status"], summary["global_step"], summary["exact"], summary["inexact"]) == (
        "completed", 20, False, [entry])
    [finished] = job.named("run_finished")
    assert (finished["exact"], finished["inexact"]) == (False, [entry])
    lines = job.output.splitlines()
    [final] = [line for line in lines if line.startswith("Run completed")]  # (then Summary:, then the Page: line)
    assert final == (f"Run completed, NOT exact: global step 20, weights_sha256 {summary['weights_sha256']}; "
                         f"not an uninterrupted run's weights: {NOT_EXACT}")

    storage = str(job.run_dir / "checkpoints")
    verify = subprocess.run([sys.executable, "-m", "resilient_train", "verify", storage], cwd=REPO,
                            env=environment(), capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.splitlines()[-1] == f"not exact: global_step 20 is not an uninterrupted run's: {NOT_EXACT}"
    listed = subprocess.run([sys.executable, "-m", "resilient_train", "ls", storage, "--json"], cwd=REPO,
                            env=environment(), capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # The checkpoints the resumed attempt committed carry it; the ones before the resume do not.
    exact = {c["global_step"]: c["exact"] for c in json.loads(listed.stdout)["checkpoints"]}  # (--keep 3 of them)
    assert (exact[16], exact[20]) == (False, False) and all(exact[step] for step in exact if step <= 12), exact

    # A supervisor started again on the finished run dir reads it from storage, not from memory.
    again = run_job(NOISY, tmp_path / "run", *flags)
    assert again.returncode == 0, again.output
    assert (f"already completed, NOT exact at global step 20 (weights_sha256 {summary['weights_sha256'][:16]}...); "
            f"not an uninterrupted run's weights: {NOT_EXACT}; nothing to do.") in again.output
    assert (again.summary["exact"], again.summary["inexact"]) == (False, [entry])


# Only the chief compares the input, but a survivor may commit: the chief killed after the
# mismatch, rank 1 rescues its snapshot of step 16 (memory tier: a snapshot every 3 steps,
# one step per call), and the run goes on from that checkpoint. Rank 1 learnt the chief's
# verdict when the epoch was entered, so the rescued checkpoint, and the final one, say it.
RESCUE_FLAGS = ("--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--workers", "2",
                "--save-every-steps", "50", "--snapshot-every", "3", "--steps-per-execution", "1", "--max-restarts", "2",
                "--set", "noise=entropy")
KILL_THEN_KILL_THE_CHIEF = [{"point": "after_commit", "global_step": 10, "rank": 0},
                            {"point": "after_step", "global_step": 17, "rank": 0, "attempt": 2}]


@pytest.mark.slow  # an inexact resume is said: test_an_inexact_resume_is_said_at_the_end_in_the_summary_by_verify_and_by_a_rerun; rescues: tests/integration/test_rescue.py
def test_a_checkpoint_a_survivor_rescues_after_the_mismatch_says_it_too(tmp_path):
    import json

    job = run_job(NOISY, tmp_path / "run", *RESCUE_FLAGS, faults=KILL_THEN_KILL_THE_CHIEF)
    assert job.returncode == 0, job.output
    assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(10, 2), (16, 3)]
    assert [(m["epoch"], m["checkpoint"], m["attempt"]) for m in job.named("input_mismatch")] == [
        (1, "ckpt-000000000010", 2)]
    assert [(e["global_step"], e["rank"], e["attempt"]) for e in job.named("rescue_committed")] == [(16, 1, 2)]
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}
    rescued = json.loads((job.run_dir / "checkpoints" / "ckpt-000000000016" / "MANIFEST.json").read_text())
    assert (rescued["extra"]["rescue"]["rank"], rescued["extra"]["inexact"]) == (1, [entry])
    assert (job.summary["exact"], job.summary["inexact"]) == (False, [entry])
