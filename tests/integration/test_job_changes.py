"""A re-run on the same run dir after a change: refused with exit 2 and
the change named, unless it is more epochs, which trains on and emits job_changed."""

from tests.integration.harness import run_job

RECIPE = "recipes/linear_regression.py"
FLAGS = ("--workers", "1", "--epochs", "2", "--steps-per-epoch", "5", "--global-batch-size", "4")


def test_changed_seed_is_refused_and_more_epochs_trains_on(tmp_path):
    run_dir = tmp_path / "run"
    first = run_job(RECIPE, run_dir, *FLAGS)
    assert first.returncode == 0, first.output
    assert first.summary["global_step"] == 10

    reseeded = run_job(RECIPE, run_dir, *FLAGS, "--seed", "5")
    assert reseeded.returncode == 2, reseeded.output
    assert "holds a job with other settings (seed 0 -> 5)" in reseeded.output
    assert "--accept-changes" in reseeded.output and "Traceback" not in reseeded.output
    assert sorted(p.name for p in run_dir.glob("attempt-*")) == ["attempt-1"]

    longer = run_job(RECIPE, run_dir, *FLAGS[:2], "--epochs", "3", *FLAGS[4:])
    assert longer.returncode == 0, longer.output
    changed = longer.named("job_changed")
    assert [(c["changes"], c["accepted"]) for c in changed] == [({"epochs": {"was": 2, "now": 3}}, "more epochs")]
    assert [r["global_step"] for r in longer.named("restored")] == [10]
    assert longer.summary["global_step"] == 15
