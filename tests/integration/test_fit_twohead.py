"""Two inputs, two outputs, a loss dict with loss_weights, per-output metrics; class_weight and
weighted_metrics; AUC, Precision and Recall (issue 46 items 3 and 4).

tests/recipes/fit_twohead.py is the keras.io form on scikit-learn's breast cancer set: inputs
``{"clinical", "lab"}``, outputs ``{"risk", "prog"}``, ``loss={...}``, ``loss_weights={...}``,
``metrics={"risk": ["accuracy", AUC()], "prog": ["mae"]}``, ``fit(x, y, batch_size=64, epochs=4,
validation_data=...)`` and a CSVLogger; ``FIT_HEADS=1`` is the risk head alone with
``Precision()``, ``Recall(thresholds=0.7)``, ``weighted_metrics=["accuracy"]`` (logged as
``weighted_accuracy``: weighed by the class weights) and ``class_weight={0: 2.0, 1: 0.5}``.

On ONE worker, unshuffled (``FIT_SHUFFLE=0``: plain Keras' permutation is not the runner's), the
History and the CSV log carry plain Keras ``model.fit``'s names (``risk_loss``, ``prog_mae``,
``val_risk_accuracy``...) and values to float32 relative 1e-6: the runner sums the weighted
losses per example and averages (Keras averages each, then sums), and its epoch values are
float64 means of the per-step float32 values (Keras' ``Mean`` sums in float32). Measured: 1e-7.
AUC, Precision, Recall and the weighted accuracy (summed states: runner/keras_recipes/metric_states.py)
are bit for bit.

On TWO workers, shuffled (one reference run per module), the chief killed right after a mid-epoch commit ends as the
uninterrupted run: same digest, same CSV bytes, same per-output numbers in every
``epoch_finished`` (the resumed epoch's AUC from the confusion counts the mid-epoch checkpoint
carried), the same History on every worker. So does a SIGTERM inside an epoch and a re-run
(slow: RT_SLOW=1).
"""

import csv
import json
import signal
import subprocess
import sys

import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.harness import REPO, environment, run_job, run_job_until

SCRIPT = str(REPO / "tests/recipes/fit_twohead.py")  # absolute: run from the test's out dir
FIELDS = ("epoch", "global_step", "loss", "metrics", "val_loss", "val_metrics", "val_examples")
TWO_HEADS_KEYS = ["loss", "prog_loss", "prog_mae", "risk_accuracy", "risk_auc", "risk_loss", "val_loss",
                  "val_prog_loss", "val_prog_mae", "val_risk_accuracy", "val_risk_auc", "val_risk_loss"]
ONE_HEAD_KEYS = ["accuracy", "loss", "precision", "recall", "val_accuracy", "val_loss", "val_precision", "val_recall",
                 "val_weighted_accuracy", "weighted_accuracy"]
SUMMED = ("risk_auc", "val_risk_auc", "precision", "val_precision", "recall", "val_recall", "weighted_accuracy",
          "val_weighted_accuracy")  # metric_states.py


def after_fit(out_dir):
    lines = (json.loads(line) for line in (out_dir / "after_fit.jsonl").read_text().splitlines())
    return sorted(lines, key=lambda line: line["task"])


def csv_rows(out_dir):
    with open(out_dir / "training_log.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def run_script(run_dir, out_dir, *flags, env=None, **kwargs):
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_job(SCRIPT, run_dir, *flags, env={"FIT_SCRIPT_OUT": str(out_dir), **(env or {})}, cwd=out_dir, **kwargs)


def plain_keras(out_dir, heads):
    out_dir.mkdir(parents=True)
    proc = subprocess.run([sys.executable, SCRIPT], cwd=out_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=180, env=environment(FIT_PLAIN="1", FIT_SHUFFLE="0", FIT_HEADS=heads,
                                                                  FIT_SCRIPT_OUT=str(out_dir)))
    assert proc.returncode == 0, proc.stdout
    return out_dir


@pytest.mark.parametrize("heads", ["2", pytest.param("1", marks=pytest.mark.slow)])  # "1": the one-head case test_fit_arrays.py covers
def test_one_worker_gives_plain_keras_names_and_values(tmp_path, heads):
    reference = plain_keras(tmp_path / "plain", heads)
    job = run_script(tmp_path / "run", tmp_path / "out", "--workers", "1", "--no-warm-standby",
                     env={"FIT_SHUFFLE": "0", "FIT_HEADS": heads})
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 4 * 8
    [ours], [theirs] = after_fit(tmp_path / "out"), after_fit(reference)
    expected_keys = TWO_HEADS_KEYS if heads == "2" else ONE_HEAD_KEYS
    assert sorted(ours["history"]) == sorted(theirs["history"]) == expected_keys
    for name, values in theirs["history"].items():
        assert ours["history"][name] == pytest.approx(values, rel=1e-6), name
        if name in SUMMED:  # float32 sums of the same float32 shares, Keras' own result(): bit for bit
            assert ours["history"][name] == values, name
    ours_rows, their_rows = csv_rows(tmp_path / "out"), csv_rows(reference)
    assert [list(row) for row in ours_rows] == [list(row) for row in their_rows]  # the same columns, in order
    for ours_row, their_row in zip(ours_rows, their_rows):
        assert {k: float(v) for k, v in ours_row.items()} == pytest.approx(
            {k: float(v) for k, v in their_row.items()}, rel=1e-6)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The two-worker uninterrupted run (shuffled), and its out dir."""
    root = tmp_path_factory.mktemp("twohead")
    job = run_script(root / "run", root / "out", "--save-every-steps", "5")
    assert job.returncode == 0, job.output
    finished = [{name: e[name] for name in FIELDS} for e in job.named("epoch_finished")]
    assert [e["global_step"] for e in finished] == [8, 16, 24, 32]
    assert sorted(finished[0]["metrics"]) == ["prog_loss", "prog_mae", "risk_accuracy", "risk_auc", "risk_loss"]
    assert {e["val_examples"] for e in finished} == {57}
    return job, root / "out"


@pytest.mark.slow  # a chief's kill resumed exactly: tests/integration/test_fit_script.py and test_fit_arrays.py; two heads' names and values: the one-worker test
def test_two_workers_kill_chief_mid_epoch_end_as_the_uninterrupted_run(tmp_path, reference):
    reference, ref_out = reference
    ref_finished = [{name: e[name] for name in FIELDS} for e in reference.named("epoch_finished")]
    # The chief dies right after committing step 10 (epoch 1, step 2); the group restores it.
    killed = run_script(tmp_path / "run", tmp_path / "out", "--save-every-steps", "5",
                        faults=[{"point": "after_commit", "global_step": 10, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    [restored] = killed.named("restored")
    assert (restored["global_step"], restored["input_reentry"]) == (10, "indexed")
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (tmp_path / "out/training_log.csv").read_bytes() == (ref_out / "training_log.csv").read_bytes()
    finished = [{name: e[name] for name in FIELDS} for e in killed.named("epoch_finished")]
    assert finished[-3:] == ref_finished[1:]
    lines = after_fit(tmp_path / "out")
    assert [line["task"] for line in lines] == [0, 1]
    assert lines == after_fit(ref_out)


@pytest.mark.slow
def test_two_workers_sigterm_mid_epoch_saves_and_the_rerun_ends_as_the_uninterrupted_run(tmp_path, reference):
    """A SIGTERM inside an epoch: every worker stops at the same step, saves it (the AUC's
    counts so far with it) and exits 143; the re-run loses no step and ends as the reference."""
    reference, ref_out = reference
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    epoch_0_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 0 for e in events)  # noqa: E731
    preempted = run_job_until(SCRIPT, tmp_path / "run", "--save-every-steps", "5", "--steps-per-execution", "1",
                              when=epoch_0_done, cwd=out_dir, action=lambda proc, events: proc.send_signal(signal.SIGTERM),
                              env={"FIT_SCRIPT_OUT": str(out_dir), "FIT_STEP_DELAY_S": "0.3"})
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 8 < stop["global_step"] < 32 and stop["global_step"] % 8 != 0, stop  # inside an epoch
    rerun = run_script(tmp_path / "run", out_dir, "--save-every-steps", "5", "--steps-per-execution", "1")
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (out_dir / "training_log.csv").read_bytes() == (ref_out / "training_log.csv").read_bytes()
    assert after_fit(out_dir) == after_fit(ref_out)


@pytest.mark.slow  # summed states resumed: the two-head kill test above (AUC); class_weight and weighted_metrics' values: the one-worker test
def test_one_head_class_weight_weighted_metrics_kill_chief_mid_epoch_end_as_the_uninterrupted_run(tmp_path):
    """FIT_HEADS=1 (Precision, Recall(thresholds=0.7), weighted_metrics=["accuracy"], class_weight)
    on two workers: killed after the commit of step 10 (epoch 1), it ends with the uninterrupted
    run's digest, CSV bytes and History (the weighted accuracy's sums from the checkpoint)."""
    env = {"FIT_HEADS": "1"}
    reference = run_script(tmp_path / "ref/run", tmp_path / "ref/out", "--save-every-steps", "5", env=env)
    assert reference.returncode == 0, reference.output
    killed = run_script(tmp_path / "run", tmp_path / "out", "--save-every-steps", "5", env=env,
                        faults=[{"point": "after_commit", "global_step": 10, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [(r["global_step"], r["input_reentry"]) for r in killed.named("restored")] == [(10, "indexed")]
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    ref_rows = csv_rows(tmp_path / "ref/out")
    assert sorted(ref_rows[0]) == sorted(["epoch", *ONE_HEAD_KEYS])
    assert (tmp_path / "out/training_log.csv").read_bytes() == (tmp_path / "ref/out/training_log.csv").read_bytes()
    assert after_fit(tmp_path / "out") == after_fit(tmp_path / "ref/out")
