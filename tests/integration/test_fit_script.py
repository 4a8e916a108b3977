"""An unchanged model.fit script survives a kill -9 of the chief mid-epoch and a SIGTERM exactly.

examples/keras_tutorial.py is the seed notes' multi-worker Keras tutorial (digits for MNIST):
strategy, compile in scope, ``fit(dataset, epochs=3, steps_per_epoch=70)``. Killed mid-epoch,
it ends with the uninterrupted run's weights digest.

tests/recipes/fit_script.py is the same kind of script, short, with callbacks (ReduceLROnPlateau,
EarlyStopping, CSVLogger) and code after ``fit`` that appends one line per worker to
``$FIT_SCRIPT_OUT/after_fit.jsonl`` (its task, ``history.epoch``, ``history.history["loss"]``).
It is run from ``$FIT_SCRIPT_OUT``, as a user runs a script from their directory: its
``CSVLogger("training_log.csv")`` writes there, as in plain Keras (docs/keras.md, "Where files
go"), and its ``print("hello from the script")`` shows once on the console, the chief's.
Uninterrupted (the module's one reference run) EarlyStopping ends it after epoch STOP_EPOCH of
8. Killed or stopped by SIGTERM and re-run, it must end as the reference: same digest, same
CSV bytes, same learning-rate sequence, same early-stop epoch, and the code after ``fit`` ran exactly once per worker, after
completion, with the history of the whole run (not only the last attempt's).
"""

import csv
import json
import signal

import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.harness import REPO, run_job, run_job_until

TUTORIAL = "examples/keras_tutorial.py"
SCRIPT = str(REPO / "tests/recipes/fit_script.py")  # absolute: run from the test's out dir
HELLO = "hello from the script"  # the script prints it before anything else, on every worker
STEPS_PER_EPOCH = 10
STOP_EPOCH = 5  # EarlyStopping's last epoch in the reference (0-based)
ONE_STEP_CALLS = ("--steps-per-execution", "1")


def learning_rates(out_dir):
    with open(out_dir / "training_log.csv", newline="") as handle:
        return [float(row["learning_rate"]) for row in csv.DictReader(handle)]


def after_fit_lines(out_dir):
    path = out_dir / "after_fit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_script(run_dir, out_dir, *flags, **kwargs):
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_job(SCRIPT, run_dir, *flags, env={"FIT_SCRIPT_OUT": str(out_dir)}, cwd=out_dir, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The script's uninterrupted run (one per module)."""
    root = tmp_path_factory.mktemp("fit_script")
    job = run_script(root / "run", root / "out")
    assert job.returncode == 0, job.output
    assert job.summary["status"] == "completed"
    assert [e["epoch"] for e in job.named("training_stopped")] == [STOP_EPOCH]
    rates = learning_rates(root / "out")
    assert len(rates) == STOP_EPOCH + 1 and len(set(rates)) > 1  # ReduceLROnPlateau acted
    lines = after_fit_lines(root / "out")
    assert sorted(line["task"] for line in lines) == [0, 1]
    assert all(line["epochs"] == list(range(STOP_EPOCH + 1)) for line in lines)
    assert lines[0]["evaluate"] == lines[1]["evaluate"]  # every worker evaluated all 297 held-out digits
    assert set(lines[0]["evaluate"]) == {"loss", "accuracy"}
    return job, lines


def test_the_chiefs_print_shows_once_on_the_console_and_the_csv_is_where_the_script_ran(reference):
    job, _ = reference
    out_dir = job.run_dir.parent / "out"  # the working directory the job was run from
    assert job.output.splitlines().count(HELLO) == 1, job.output
    assert [(e["rank"], e["text"]) for e in job.named("script_output")] == [(0, HELLO)]
    # Every worker printed it, into its own log; only rank 0's reached the console.
    assert [(job.run_dir / f"attempt-1/worker-{rank}.log").read_text().splitlines().count(HELLO)
            for rank in (0, 1)] == [1, 1]
    # CSVLogger("training_log.csv") wrote where plain Keras would: the working directory.
    assert (out_dir / "training_log.csv").read_text().splitlines()[0] == "epoch,accuracy,learning_rate,loss"
    assert not (job.run_dir / "training_log.csv").exists()


def assert_ends_as(job, out_dir, reference):
    ref_job, ref_lines = reference
    assert job.summary["weights_sha256"] == ref_job.summary["weights_sha256"]
    ref_out = ref_job.run_dir.parent / "out"
    assert (out_dir / "training_log.csv").read_bytes() == (ref_out / "training_log.csv").read_bytes()
    assert learning_rates(out_dir) == learning_rates(ref_out)
    assert [e["epoch"] for e in job.named("training_stopped")] == [STOP_EPOCH]
    # The code after fit() ran once per worker, with the whole run's history.
    lines = after_fit_lines(out_dir)
    assert sorted(lines, key=lambda line: line["task"]) == sorted(ref_lines, key=lambda line: line["task"])


def test_script_kill_chief_mid_epoch_resumes_exactly_and_runs_the_code_after_fit_once(tmp_path, reference):
    # A save every 4 steps: the chief dies right after committing step 12, inside epoch 1, so
    # the restarted group re-enters the input at global batch 12 (epoch 1, step 2).
    killed = run_script(tmp_path / "run", tmp_path / "out", "--save-every-steps", "4",
                        faults=[{"point": "after_commit", "global_step": 12, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [r["global_step"] for r in killed.named("restored")] == [12]
    assert_ends_as(killed, tmp_path / "out", reference)


@pytest.mark.slow  # test_keras.py's SIGTERM (save, exit 143, exact resume) and the kill test below (code after fit runs once) cover it
def test_script_sigterm_saves_exits_143_without_the_code_after_fit_and_rerun_ends_exactly(
        tmp_path, reference, monkeypatch):
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.setenv("FIT_SCRIPT_OUT", str(out_dir))
    monkeypatch.setenv("FIT_SCRIPT_STEP_DELAY_S", "0.3")  # 3 s per epoch: the signal lands inside epoch 2
    first_epoch_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 1 for e in events)  # noqa: E731
    # One step per call: the batch-end sleep runs after every step.
    preempted = run_job_until(SCRIPT, run_dir, *ONE_STEP_CALLS, when=first_epoch_done, cwd=out_dir,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 2 * STEPS_PER_EPOCH <= stop["global_step"] < 3 * STEPS_PER_EPOCH
    assert after_fit_lines(out_dir) == []  # fit() did not return: the code after it did not run

    monkeypatch.setenv("FIT_SCRIPT_STEP_DELAY_S", "0")
    rerun = run_job(SCRIPT, run_dir, *ONE_STEP_CALLS, cwd=out_dir)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert_ends_as(rerun, out_dir, reference)


@pytest.fixture(scope="module")
def tutorial_reference(tmp_path_factory):
    job = run_job(TUTORIAL, tmp_path_factory.mktemp("tutorial") / "reference")
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 3 * 70
    return job


@pytest.mark.slow  # the same fit-script kill and resume as test_script_kill_chief_mid_epoch_resumes_exactly_and_runs_the_code_after_fit_once
def test_tutorial_kill_chief_mid_epoch_ends_with_the_uninterrupted_digest(tmp_path, tutorial_reference):
    # Killed right after committing step 100: epoch 1, step 30 of 70.
    killed = run_job(TUTORIAL, tmp_path / "killed", faults=[{"point": "after_commit", "global_step": 100, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [r["global_step"] for r in killed.named("restored")] == [100]
    assert killed.summary["weights_sha256"] == tutorial_reference.summary["weights_sha256"]


@pytest.mark.slow
def test_tutorial_sigterm_saves_exits_143_and_rerun_ends_with_the_uninterrupted_digest(tmp_path, tutorial_reference):
    run_dir = tmp_path / "run"
    epoch_0_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 0 for e in events)  # noqa: E731
    preempted = run_job_until(TUTORIAL, run_dir, when=epoch_0_done,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 70 <= stop["global_step"] < 210
    rerun = run_job(TUTORIAL, run_dir)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == tutorial_reference.summary["weights_sha256"]


def test_the_progress_of_a_fit_script_has_its_total_and_percentage(reference):
    # Issue 51 item 3: "step 177  epoch 2 accuracy 0.9407 loss 0.2667  0.3 steps/s": the
    # supervisor cannot read fit(epochs=8, steps_per_epoch=10) from the script, so its
    # progress had no total. The events say it; the console (as the supervisor runs it,
    # epochs unknown) draws every one of them with its total and percentage.
    import io
    import re

    from resilient_train.supervisor.console import Console, EventTail

    job, _ = reference
    progress = job.named("train_progress")
    assert progress and {(e["epochs"], e["steps_per_epoch"]) for e in progress} == {(8, STEPS_PER_EPOCH)}
    out = io.StringIO()
    EventTail(job.run_dir / "events.jsonl", Console(out, tty=True, width=500), start_at_end=False, epochs=None).pump()
    drawn = [line.strip() for line in out.getvalue().replace("\r", "\n").splitlines() if " steps/s" in line
             or re.search(r"  step \d", line)]
    assert [int(re.search(r"  step (\d+)/80  (\d+)%", line).group(2)) for line in drawn] == [
        100 * e["global_step"] // 80 for e in progress], drawn
