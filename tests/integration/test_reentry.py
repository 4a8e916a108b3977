"""Re-entering an epoch mid-way without replaying its input.

tests/recipes/input_bound.py positions its dataset itself (``start_step``); its twin
input_bound_skip.py does not, so the runner restores each worker's saved tf.data iterator
state (runner/input/iterator_state.py), or, with ``--max-iterator-state-bytes 0``, skip()s. All
must resume bit-exactly after a kill mid-epoch, and the path named must really have been taken.
"""

import pytest

from tests.integration.conftest import DIGITS_FLAGS
from tests.integration.harness import run_job
from tests.integration.test_rescue import manifest

INPUT_BOUND = "tests/recipes/input_bound.py"
INPUT_BOUND_SKIP = "tests/recipes/input_bound_skip.py"
INPUT_DECODED = "tests/recipes/input_decoded.py"
# 2 epochs x 12 steps, a save every 4: the kill after the commit of 8 is mid-epoch 0.
FLAGS = ("--epochs", "2", "--steps-per-epoch", "12", "--global-batch-size", "8", "--save-every-steps", "4",
         "--no-warm-standby")
KILL_CHIEF_AFTER_COMMIT_8 = [{"point": "after_commit", "global_step": 8, "rank": 0}]


@pytest.fixture(scope="module")
def input_bound_reference(tmp_path_factory):
    job = run_job(INPUT_BOUND, tmp_path_factory.mktemp("reference") / "run", *FLAGS)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 24
    return job.summary["weights_sha256"]


def start_positions(path):
    """(epoch, start_step) of every dataset() call, both workers of every attempt."""
    return sorted(tuple(line.split()) for line in path.read_text().splitlines())


@pytest.mark.slow  # the replay since the newest capture: tests/integration/test_rescue_matrix.py's rescue between input captures
@pytest.mark.parametrize("steps_per_execution", ["1", pytest.param("3", marks=pytest.mark.slow)])  # 3: slow, a variant
def test_start_step_recipe_resumes_mid_epoch_exactly(tmp_path, input_bound_reference, steps_per_execution):
    log = tmp_path / "starts.txt"
    job = run_job(INPUT_BOUND, tmp_path / "run", *FLAGS, "--steps-per-execution", steps_per_execution,
                  "--set", f"start_log={log}", faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    restored = job.named("restored")
    assert [(r["global_step"], r["epoch"], r["step_in_epoch"]) for r in restored] == [(8, 0, 8)]
    # Attempt 2 re-enters epoch 0 at 8 on both workers through start_step. Every other
    # call starts an epoch at 0: both workers' epoch 0 of attempt 1 and epoch 1 of attempt
    # 2, the chief's resume-check build of each epoch it enters (runner/input/determinism.py), and
    # perhaps attempt 1's non-chief entering epoch 1 before the supervisor stops it (it
    # needs no collective to build its input), so how many of those is timing, not asserted.
    starts = start_positions(log)
    assert starts.count(("0", "8")) == 2
    assert set(starts) == {("0", "0"), ("0", "8"), ("1", "0")}
    assert job.summary["weights_sha256"] == input_bound_reference


def test_recipe_without_start_step_is_skipped_to_the_same_weights(tmp_path, input_bound_reference):
    log = tmp_path / "starts.txt"
    job = run_job(INPUT_BOUND_SKIP, tmp_path / "run", *FLAGS, "--set", f"start_log={log}",
                  "--max-iterator-state-bytes", "0", faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    assert [(r["step_in_epoch"], r["input_reentry"], r["input_reentry_reason"]) for r in job.named("restored")] == [
        (8, "skip", "--max-iterator-state-bytes 0")]
    assert {start for _, start in start_positions(log)} == {"None"}  # never told where to start
    assert job.summary["weights_sha256"] == input_bound_reference


def test_recipe_without_start_step_restores_its_iterator_state(tmp_path, input_bound_reference):
    log = tmp_path / "starts.txt"
    job = run_job(INPUT_BOUND_SKIP, tmp_path / "run", *FLAGS, "--set", f"start_log={log}",
                  faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    sized = job.named("iterator_state_sized")[0]  # at the first mid-epoch save (step 4)
    assert (sized["kept"], len(sized["bytes"]), sized["max_bytes"]) == (True, 2, 4194304)
    restored = job.named("restored")
    assert [(r["step_in_epoch"], r["input_reentry"]) for r in restored] == [(8, "iterator_state")]
    assert job.summary["weights_sha256"] == input_bound_reference


def test_an_ordinary_pipeline_resumes_from_positions_to_the_uninterrupted_weights(tmp_path):
    # tests/recipes/input_decoded.py: range -> parallel map (256x256 -> 32x32) -> batch -> prefetch,
    # no start_step. Its explicit state held the prefetched batches (one alone is 48 KB); with
    # symbolic checkpointing each worker saves positions only. The reference never restarts and
    # feeds the same batches through MWMS's distributed iterator.
    reference = run_job(INPUT_DECODED, tmp_path / "reference", *FLAGS, "--max-iterator-state-bytes", "0")
    assert reference.returncode == 0, reference.output
    job = run_job(INPUT_DECODED, tmp_path / "run", *FLAGS, faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    sized = job.named("iterator_state_sized")  # attempt 1 at step 4, attempt 2 at step 16
    assert [(e["attempt"], e["kept"], e["symbolic"], len(e["bytes"])) for e in sized] == [
        (1, True, True, 2), (2, True, True, 2)]
    assert max(max(e["bytes"]) for e in sized) < 4096
    [restored] = job.named("restored")
    assert (restored["step_in_epoch"], restored["input_reentry"]) == (8, "iterator_state")
    assert restored["input_reentry_reason"].endswith("-byte symbolic (positions) tf.data iterator state")
    assert (job.summary["global_step"], job.summary["weights_sha256"]) == (24, reference.summary["weights_sha256"])


@pytest.mark.slow  # the iterator-state path: test_iterator_state_path_trains_to_the_distributed_iterators_weights
def test_a_shuffled_pipeline_restores_its_buffer_to_the_same_weights(tmp_path, digits_reference):
    # recipes/digits_cnn.py shuffles its images: symbolic checkpointing would still save the
    # shuffle buffer (the images, ~570 KB per worker), so the pipeline is saved explicitly
    # (runner/input/reentry.py SYMBOLIC_MAX_BYTES), under the 4 MiB default bound.
    job = run_job("recipes/digits_cnn.py", tmp_path / "run", *DIGITS_FLAGS, "--no-warm-standby",
                  faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    sized = job.named("iterator_state_sized")
    assert [(e["kept"], e["symbolic"]) for e in sized] == [(True, False), (True, False)]
    assert sized[0]["not_symbolic"].startswith("its symbolic state holds data (")
    assert sized[1]["not_symbolic"] == ""  # attempt 2 rebuilt it as saved: explicit, no probe
    [restored] = job.named("restored")
    assert (restored["step_in_epoch"], restored["input_reentry"]) == (8, "iterator_state")
    assert job.summary["weights_sha256"] == digits_reference


def test_a_state_larger_than_the_bound_falls_back_to_skip(tmp_path, input_bound_reference):
    job = run_job(INPUT_BOUND_SKIP, tmp_path / "run", *FLAGS, "--max-iterator-state-bytes", "100",
                  faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert job.returncode == 0, job.output
    assert [e["kept"] for e in job.named("iterator_state_sized")] == [False, False]  # once per attempt
    [restored] = job.named("restored")
    assert (restored["input_reentry"], restored["input_reentry_reason"]) == (
        "skip", "the checkpoint holds no iterator state (it was larger than the bound, or not saved)")
    assert job.summary["weights_sha256"] == input_bound_reference


def test_iterator_state_path_trains_to_the_distributed_iterators_weights(tmp_path, input_bound_reference):
    # Uninterrupted, 2 workers: each worker iterates its own pipeline as a plain tf.data
    # iterator from step 1; the reference feeds the same batches through MWMS's distributed
    # iterator (and test_recipe_without_start_step_is_skipped_to_the_same_weights pins this
    # recipe on that path to it). Before runner/input/data.py relaxed the plain iterator's batch
    # dimension as the distributed one does, the weights differed in the last bits.
    job = run_job(INPUT_BOUND_SKIP, tmp_path / "run", *FLAGS)
    assert job.returncode == 0, job.output
    assert [e["kept"] for e in job.named("iterator_state_sized")] == [True]
    assert job.summary["weights_sha256"] == input_bound_reference


def test_iterator_state_saved_by_two_workers_is_not_used_by_one(tmp_path):
    run_dir = tmp_path / "run"
    killed = run_job(INPUT_BOUND_SKIP, run_dir, *FLAGS, "--max-restarts", "0", faults=KILL_CHIEF_AFTER_COMMIT_8)
    assert killed.returncode != 0
    resumed = run_job(INPUT_BOUND_SKIP, run_dir, *FLAGS, "--workers", "1", "--accept-changes")
    assert resumed.returncode == 0, resumed.output
    [restored] = resumed.named("restored")
    assert (restored["step_in_epoch"], restored["input_reentry"], restored["input_reentry_reason"]) == (
        8, "skip", "the iterator state was saved by 2 workers; 1 resume (another sharding)")
    assert resumed.summary["global_step"] == 24


def test_a_pipeline_that_cannot_be_saved_falls_back_to_skip_and_resumes_exactly(tmp_path, digits_reference):
    # tests/recipes/slow_digits.py maps a stateful numpy_function over digits_cnn's batches:
    # TensorFlow refuses to serialize such an iterator ("EagerPyFunc is stateful"). The first
    # mid-epoch save (step 4) finds that on every rank, all workers agree to save no states,
    # and the kill after the commit of 8 re-enters by skip() to digits_cnn's exact weights.
    job = run_job("tests/recipes/slow_digits.py", tmp_path / "run", *DIGITS_FLAGS, "--set", "step_delay_s=0",
                  "--no-warm-standby", faults=[{"point": "after_commit", "global_step": 8, "rank": 0}])
    assert job.returncode == 0, job.output
    sized = job.named("iterator_state_sized")
    assert [(e["attempt"], e["bytes"], e["kept"]) for e in sized] == [(1, [-1, -1], False), (2, [-1, -1], False)]
    assert sized[0]["reason"].startswith("the tf.data pipeline of rank(s) [0, 1] cannot be saved (")
    [restored] = job.named("restored")
    assert (restored["step_in_epoch"], restored["input_reentry"], restored["input_reentry_reason"]) == (
        8, "skip", "the checkpoint holds no iterator state (it was larger than the bound, or not saved)")
    assert job.summary["weights_sha256"] == digits_reference


def test_a_save_between_input_captures_carries_the_newest_and_the_restore_replays_since(tmp_path, digits_reference):
    # A mid-epoch save captures the input's iterator state only on the memory tier's capture
    # interval (runner/state/saving.py _save_captures: the capture was ~30% of throughput at a save
    # every 20 steps). Snapshots every 2 steps, captures every 6: the snapshot of 2 captures
    # (the iterator's first), the save of 4 carries it. The chief dies after step 5: step 4 is
    # committed by its save, or (its async upload cut short) by rank 1's rescue of the same
    # snapshot; either way the restart restores the state of step 2 and replays 2 batches.
    config = tmp_path / "job.toml"
    config.write_text("snapshot_capture_every = 6\n")
    job = run_job("recipes/digits_cnn.py", tmp_path / "run", *DIGITS_FLAGS, "--no-warm-standby",
                  "--snapshot-every", "2", "--steps-per-execution", "1", "--keep", "10", "--config", str(config),
                  faults=[{"point": "after_step", "global_step": 5, "rank": 0}])
    assert job.returncode == 0, job.output
    saved = manifest(job, 4)["extra"]["iterator_state"]
    assert (saved["epoch"], saved["entry_step"], saved["at_step"]) == (0, 0, 2)
    [restored] = job.named("restored")
    assert (restored["global_step"], restored["input_reentry"]) == (4, "iterator_state")
    assert restored["input_reentry_reason"].endswith("tf.data iterator state of step 2 and replays 2 batches")
    assert job.summary["weights_sha256"] == digits_reference
