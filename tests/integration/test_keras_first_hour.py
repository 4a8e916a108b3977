"""Issue 36, "a newcomer's first hour": a common fit script runs unchanged, a bug in it stops at once.

tests/recipes/fit_binary.py compiles ``loss="binary_crossentropy"`` on labels of shape ``(N,)``
with a sigmoid ``Dense(1)`` output, as Keras' tutorials do, and trains 8 epochs of 1 step (so
each epoch's loss is one step's loss). Run as plain Keras (``FIT_PLAIN=1``, the default
strategy, the same virtualenv) it is the reference; under resilient-train on ONE worker its
per-step losses and accuracies must be the same floats: exactly, because with one worker the
step computes the same float32 ops in the same order (the all-reduce of one replica adds
nothing), and the runner's per-example losses are Keras' own (runner/keras_recipes/compiled.py). Measured:
bit-identical. A float32 tolerance would hide a changed loss (a rank mismatch broadcasting
(N,) against (N, 1) gives a loss that still trains, only wrong).

The same script with ``metrics=["binary_crossentropy"]`` fails in plain Keras too (Keras aligns
ranks for losses, not for metrics). Under resilient-train that failure happens before the first
step of a fresh start: a bug in the job, so exit 3 at once, one line, no restart spent. A
failure once a step finished (an injected ``raise`` after step 1, still no checkpoint) is
restarted as before.

With ``keras.callbacks.TensorBoard(log_dir=...)`` (issue 36 item 8) the script is not refused:
the callback's log_dir gets the runner's scalars, each step once across a restart; the
CSVLogger beside it has no ``val_*`` columns (item 7: the run has no validation).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_train.errors import EXIT_FATAL
from tests.integration.harness import REPO, environment, run_job

SCRIPT = "tests/recipes/fit_binary.py"
FLAGS = ("--workers", "1", "--no-warm-standby")
STEPS = 8
RANK_ERROR = ("ValueError: Arguments `target` and `output` must have the same rank (ndim). "
              "Received: target.shape=(None,), output.shape=(None, 1)")


def history(out_dir):
    return json.loads((out_dir / "history.json").read_text())


def run_script(tmp_path, name, *flags, env=None, from_out=False, **kwargs):
    """``from_out``: run from the out dir (the script by its absolute path), as a user runs from
    their directory, so the script's relative paths land there."""
    out = tmp_path / name
    out.mkdir()
    script, cwd = (str(REPO / SCRIPT), out) if from_out else (SCRIPT, REPO)
    job = run_job(script, out / "run", *FLAGS, *flags, env={"FIT_SCRIPT_OUT": str(out), **(env or {})}, cwd=cwd,
                  **kwargs)
    return job, out


@pytest.fixture(scope="module")
def plain_keras(tmp_path_factory):
    """history.history of the script under plain Keras ``model.fit``."""
    out = tmp_path_factory.mktemp("plain_keras")
    proc = subprocess.run([sys.executable, str(REPO / SCRIPT)], cwd=out, env=environment(FIT_PLAIN="1",
                          FIT_SCRIPT_OUT=str(out)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout
    return history(out)


def test_binary_crossentropy_on_rank_1_labels_trains_with_plain_keras_per_step_losses(tmp_path, plain_keras):
    job, out = run_script(tmp_path, "runner")
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == STEPS and job.summary["restarts"] == 0
    assert len(plain_keras["loss"]) == STEPS
    per_step = [e["loss"] for e in job.named("epoch_finished")]
    assert per_step == plain_keras["loss"]  # exact (see the module docstring)
    assert [e["metrics"]["accuracy"] for e in job.named("epoch_finished")] == plain_keras["accuracy"]
    assert history(out) == plain_keras  # what fit() returned to the script


def test_a_failure_before_a_fresh_starts_first_step_exits_3_at_once_in_one_line(tmp_path):
    job, _ = run_script(tmp_path, "bug", "--max-restarts", "3", env={"FIT_METRICS": "binary_crossentropy"})
    cause = (f"Script {SCRIPT}: failed before the first training step of a fresh start (a bug in the job, not a "
             f"fault: a restart fails the same way): {RANK_ERROR}")
    assert job.returncode == EXIT_FATAL, job.output
    lines = job.output.splitlines()
    assert f"  RecipeError: {cause}" in lines  # the console's root cause
    assert f"    resilient-train worker 0: fatal: {cause}" in lines  # the worker's own line, in its log's tail
    assert job.summary["attempts"] == 1 and job.summary["restarts"] == 0
    assert job.summary["root_cause"]["message"] == cause
    assert job.summary["root_cause"]["global_step"] == 0
    assert job.named("crash_loop_detected") == []


def test_a_refusal_found_in_the_worker_is_one_line_with_no_rescue_and_no_restart(tmp_path):
    """Issue 51 item 4: what compile() was given is refused inside the workers when the source does
    not say it literally (here run_eagerly read from the environment; a two-output model, the
    issue's case, trains since issue 46). Two workers with the memory tier: the console's root
    cause is the one line in the script's terms, and a stop for a bug in the job asks no survivor
    to rescue and promises no restart."""
    job, _ = run_script(tmp_path, "eager", "--workers", "2", "--snapshot-every", "auto", "--max-restarts", "3",
                        env={"FIT_RUN_EAGERLY": "1"})
    refusal = (f"Script {Path(SCRIPT).name}: its model was compiled with run_eagerly=True; "
               "the runner compiles its step (leave run_eagerly unset)")
    assert job.returncode == EXIT_FATAL, job.output
    assert refusal in job.output.splitlines()
    assert job.summary["root_cause"]["type"] == "resilient_train.errors.RecipeRefused"
    assert "Stopping: the job was refused (the line above); fix it and run again" in job.output.splitlines()
    assert (job.summary["attempts"], job.summary["restarts"]) == (1, 0)
    assert job.named("rescue_requested") == [] and job.named("rescue_abandoned") == []
    for word in ("rescue", "restores the last commit", "Traceback", "traceback (last"):
        assert word not in job.output, job.output


@pytest.mark.slow  # restarts after the first step: tests/integration/test_supervisor.py (crash loop, budget) and every kill test
def test_a_failure_after_the_first_step_is_still_restarted(tmp_path, plain_keras):
    """No checkpoint yet (the raise fires after step 1, before epoch 0's save): attempt 2
    starts fresh again and, the failure being gone, ends as an uninterrupted run."""
    job, out = run_script(tmp_path, "transient", "--max-restarts", "3",
                          faults=[{"point": "raise", "global_step": 1, "rank": 0}])
    assert job.returncode == 0, job.output
    assert job.summary["attempts"] == 2 and job.summary["restarts"] == 1
    assert [e["attempt"] for e in job.named("fresh_start")] == [1, 2]
    assert history(out) == plain_keras


def test_a_tensorboard_callback_gets_the_runners_scalars_in_its_log_dir(tmp_path, plain_keras):
    """keras.callbacks.TensorBoard(log_dir="tb_logs") in the script: no refusal; its log_dir
    (relative: to the directory the script runs from, as CSVLogger's, docs/keras.md "Where
    files go") holds the scalars of the run dir's tensorboard/, one per step, and nothing of
    the callback's own (no train/ subdirectory)."""
    from resilient_train.runner.outputs.tensorboard import read_scalars

    job, out = run_script(tmp_path, "tensorboard", env={"FIT_TENSORBOARD": "tb_logs"}, from_out=True,
                          faults=[{"point": "raise", "global_step": 3, "rank": 0}])
    assert job.returncode == 0, job.output
    assert job.summary["restarts"] == 1  # attempt 2 resumes from step 2's checkpoint
    assert not (job.run_dir / "tb_logs").exists() and not (job.run_dir / "train_log.csv").exists()
    log_dir = out / "tb_logs"
    scalars = read_scalars(log_dir)
    assert scalars == read_scalars(job.run_dir / "tensorboard")
    assert scalars["epoch/loss"] == [(step, loss)  # float32 values, written as float32: exact
                                     for step, loss in enumerate(plain_keras["loss"], 1)]
    assert scalars["run/restarts"] == [(0, 0.0), (2, 1.0)]
    assert sorted(p.name for p in log_dir.iterdir() if p.is_dir()) == []
    # The CSVLogger beside it: no val_* columns without validation (Keras' own writes them, all NA),
    # each epoch once across the restart.
    rows = (out / "train_log.csv").read_text().splitlines()
    assert rows[0] == "epoch,accuracy,loss"
    assert [row.split(",")[0] for row in rows[1:]] == [str(e) for e in range(STEPS)]
