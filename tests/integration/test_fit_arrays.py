"""A model.fit script on NumPy arrays, with validation, survives a kill -9 of the chief mid-epoch exactly.

tests/recipes/fit_arrays.py is the keras.io form (issue 46 items 1-2): ``fit(x[:1500], y[:1500],
batch_size=64, epochs=8, shuffle=True, validation_data=(x[1500:], y[1500:]))`` on scikit-learn's
digits, with EarlyStopping on ``val_loss`` and a CSVLogger, run by 2 workers. An epoch is
1500 // 64 = 23 global batches of a new permutation (the last 28 examples of each epoch's order are
left out: docs/keras.md). Uninterrupted (the module's one reference run) EarlyStopping on
``val_loss`` ends it after epoch STOP_EPOCH of 8. Killed right after a mid-epoch commit and
re-run by the supervisor, it must re-enter the epoch's index range at the step (input_reentry
``indexed``) and end as the reference: same digest, same CSV bytes, same ``val_`` numbers in every
``epoch_finished``, same early-stop epoch, the same History after fit() on every worker.
(slow) So must a SIGTERM inside epoch 2 and a re-run.

With ``FIT_ARRAYS_SPLIT=1`` it is ``fit(x, y, batch_size=64, epochs=1, validation_split=0.2)``:
Keras holds out the last 1797 - floor(1797 * 0.8) = 360 examples before shuffling, and the
script's evaluate() of exactly those after fit gives the epoch's val_loss to the last digit.
"""

import json
import signal

import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.harness import REPO, run_job, run_job_until

SCRIPT = str(REPO / "tests/recipes/fit_arrays.py")  # absolute: run from the test's out dir
STEPS_PER_EPOCH = 23  # 1500 // 64
STOP_EPOCH = 6  # EarlyStopping's last epoch (0-based) in the reference: val_loss fell by less than 0.1
VAL_FIELDS = ("epoch", "global_step", "loss", "metrics", "val_loss", "val_metrics", "val_examples")


def after_fit_lines(out_dir):
    path = out_dir / "after_fit.jsonl"
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda line: line["task"])


def run_script(run_dir, out_dir, *flags, env=None, **kwargs):
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_job(SCRIPT, run_dir, *flags, env={"FIT_SCRIPT_OUT": str(out_dir), **(env or {})}, cwd=out_dir, **kwargs)


def epochs_finished(job):
    return [{name: event[name] for name in VAL_FIELDS} for event in job.named("epoch_finished")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The script's uninterrupted run (one per module)."""
    root = tmp_path_factory.mktemp("fit_arrays")
    job = run_script(root / "run", root / "out", "--save-every-steps", "10")
    assert job.returncode == 0, job.output
    assert job.summary["status"] == "completed"
    assert [e["epoch"] for e in job.named("training_stopped")] == [STOP_EPOCH]
    finished = epochs_finished(job)
    assert [e["global_step"] for e in finished] == [STEPS_PER_EPOCH * (e + 1) for e in range(STOP_EPOCH + 1)]
    assert {e["val_examples"] for e in finished} == {297}  # every held-out digit, each worker its share
    lines = after_fit_lines(root / "out")
    assert [line["task"] for line in lines] == [0, 1]
    assert lines[0]["history"]["val_loss"] == [e["val_loss"] for e in finished]  # History got the val_ logs
    assert lines[0]["history"] == lines[1]["history"]
    return job, root / "out"


def test_arrays_kill_chief_mid_epoch_reenter_at_the_step_and_end_as_the_reference(tmp_path, reference):
    ref_job, ref_out = reference
    # The chief dies right after committing step 30 (epoch 1, step 7); the group restores it.
    killed = run_script(tmp_path / "run", tmp_path / "out", "--save-every-steps", "10",
                        faults=[{"point": "after_commit", "global_step": 30, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    [restored] = killed.named("restored")
    assert (restored["global_step"], restored["input_reentry"]) == (30, "indexed")
    assert killed.summary["weights_sha256"] == ref_job.summary["weights_sha256"]
    assert (tmp_path / "out/training_log.csv").read_bytes() == (ref_out / "training_log.csv").read_bytes()
    # The last attempt's epoch_finished events (epochs 1.. re-run) carry the reference's numbers.
    ref_finished, finished = epochs_finished(ref_job), epochs_finished(killed)
    assert finished[-(STOP_EPOCH):] == ref_finished[1:]
    assert [e["epoch"] for e in killed.named("training_stopped")] == [STOP_EPOCH]
    assert after_fit_lines(tmp_path / "out") == after_fit_lines(ref_out)


@pytest.mark.slow
def test_arrays_sigterm_mid_epoch_saves_and_the_rerun_stops_early_at_the_references_epoch(tmp_path, reference):
    # The kill test above covers the indexed re-entry and EarlyStopping's restored state on the
    # default suite; this one a SIGTERM inside epoch 2 (each batch slowed by a callback: the
    # arithmetic is the same): every worker saves the same step, exits 143, and the re-run
    # re-enters there, loses nothing and stops at the reference's epoch with its CSV bytes.
    ref_job, ref_out = reference
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    flags = ("--save-every-steps", "10", "--steps-per-execution", "1")
    env = {"FIT_SCRIPT_OUT": str(out_dir), "FIT_STEP_DELAY_S": "0.2"}
    epoch_1_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 1 for e in events)  # noqa: E731
    preempted = run_job_until(SCRIPT, tmp_path / "run", *flags, when=epoch_1_done, cwd=out_dir, env=env,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 2 * STEPS_PER_EPOCH < stop["global_step"] < 3 * STEPS_PER_EPOCH, stop  # inside epoch 2
    rerun = run_script(tmp_path / "run", out_dir, *flags, env={"FIT_STEP_DELAY_S": "0.2"})
    assert rerun.returncode == 0, rerun.output
    assert [(r["global_step"], r["input_reentry"]) for r in rerun.named("restored")] == [(stop["global_step"], "indexed")]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == ref_job.summary["weights_sha256"]
    assert (out_dir / "training_log.csv").read_bytes() == (ref_out / "training_log.csv").read_bytes()
    assert epochs_finished(rerun) == epochs_finished(ref_job)
    assert [e["epoch"] for e in rerun.named("training_stopped")] == [STOP_EPOCH]
    assert after_fit_lines(out_dir) == after_fit_lines(ref_out)


def test_validation_split_holds_out_the_last_fifth_before_shuffling(tmp_path):
    job = run_script(tmp_path / "run", tmp_path / "out", env={"FIT_ARRAYS_SPLIT": "1"})
    assert job.returncode == 0, job.output
    [finished] = job.named("epoch_finished")
    assert (finished["global_step"], finished["val_examples"]) == (1437 // 64, 360)  # trains on 1437, holds out 360
    for line in after_fit_lines(tmp_path / "out"):
        # evaluate() of x[1437:] after fit is the epoch's validation, to the last digit; x[:360] is not.
        assert line["evaluate_held_out"] == {"loss": finished["val_loss"], **finished["val_metrics"]}
        assert line["evaluate_first"]["loss"] != finished["val_loss"]
