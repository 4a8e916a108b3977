"""Issue 30 item 4 end to end: a real run's default console speaks in sentences, and
``--verbose`` shows the events' fields (real worker processes, MultiWorkerMirroredStrategy)."""

import re

from tests.integration.conftest import DIGITS, DIGITS_FLAGS
from tests.integration.harness import run_job

INTERNALS = re.compile(r"\b[a-z_]+=\S")  # key=value: the events' fields, not a sentence
PROGRESS = re.compile(r"^\d\d:\d\d:\d\d  step \d+/20  \d+%  (ETA \S+  )?epoch [12]/2  loss \d\.\d{4}  accuracy \d\.\d{4}  "
                      r"\d+\.\d steps/s$")


def test_the_default_console_is_sentences_and_verbose_shows_the_fields(tmp_path):
    run_dir = tmp_path / "run"
    job = run_job(DIGITS, run_dir, *DIGITS_FLAGS)
    assert job.returncode == 0, job.output
    lines = job.output.splitlines()
    assert [line for line in lines if INTERNALS.search(line)] == []
    assert lines[0] == (f"{lines[0][:8]}  training {DIGITS} on 2 workers (local launcher); run dir {run_dir}, "
                        f"checkpoints in {run_dir}/checkpoints")
    assert lines[1][8:] == "  no checkpoint found: starting from step 0"
    committed = [int(re.search(r"committed at global step (\d+) ", line).group(1)) for line in lines if " committed " in line]
    assert committed == [e["global_step"] for e in job.named("checkpoint_committed")] == [4, 8, 10, 12, 16, 20]
    assert [line[8:].split("  loss")[0] for line in lines if " finished  " in line] == [
        "  epoch 1 finished", "  epoch 2 finished"]
    assert all(PROGRESS.match(line) for line in lines if "  step " in line and "steps/s" in line), job.output
    assert lines[-4][8:] == f"  model of global step 20 exported to {run_dir}/model"
    assert lines[-3] == f"Run completed: global step 20, weights_sha256 {job.summary['weights_sha256']}"
    assert lines[-2].startswith(f"Summary: {run_dir}/summary.json  Events: {run_dir}/events.jsonl")
    assert lines[-1] == f"Page: {run_dir}/report.html"  # written by the run: commands/run.py
    assert "\r" not in job.output  # not a terminal: progress comes as whole lines

    verbose_dir = tmp_path / "verbose"
    verbose = run_job(DIGITS, verbose_dir, "--workers", "1", "--epochs", "1", "--steps-per-epoch", "4",
                      "--global-batch-size", "32", "--verbose")
    assert verbose.returncode == 0, verbose.output
    shown = [line.split()[1] for line in verbose.output.splitlines() if re.match(r"\d\d:\d\d:\d\d \S", line)]
    written = [e["event"] for e in verbose.events]
    assert "generation_claimed" in shown
    assert shown == written[:written.index("run_finished") + 1]  # every event, in file order
