"""Epoch ends do not wait for TensorFlow's teardown of the finished epoch's input.

tests/recipes/slow_teardown.py's pipeline takes 12 s to tear down at every epoch end (its
generator's cleanup), as a long epoch's tf.data pipeline took 20-60 s on the digits demo. Before runner/input/teardown.py the training thread sat in that teardown at
every epoch end; now the worker's reaper thread does it while the next epoch trains.
"""

from tests.integration.harness import run_job

SLOW_TEARDOWN = "tests/recipes/slow_teardown.py"


def test_the_next_epoch_trains_while_the_finished_epochs_input_is_torn_down(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text("progress_every_s = 0.0\n")  # a train_progress event after every call
    job = run_job(SLOW_TEARDOWN, tmp_path / "run", "--workers", "2", "--epochs", "3", "--global-batch-size", "32",
                  "--save-every-steps", "0", "--steps-per-execution", "1", "--config", str(config))
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 15
    events = job.events
    torn = [e for e in events if e["event"] == "input_torn_down" and e["rank"] == 0 and e["input"] == "train"]
    # Epoch 0's teardown really waited for the in-flight calls (the stall being tested) ...
    assert [e["epoch"] for e in torn][:1] == [0] and torn[0]["seconds"] >= 4.0
    # ... and meanwhile the chief trained epoch 1: its steps come before that teardown ended.
    order = [(e["event"], e.get("epoch")) for e in events if e.get("rank") == 0 and e["event"] in
             ("train_progress", "input_torn_down")]
    assert order.index(("train_progress", 1)) < order.index(("input_torn_down", 0))
    steps_of_epoch_1 = [e["global_step"] for e in events if e["event"] == "train_progress" and e["epoch"] == 1]
    assert steps_of_epoch_1[0] == 6
