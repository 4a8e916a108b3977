"""Callback state survives a kill: save, a fresh process's callbacks, restore, go on.

Each test drives the same callbacks through a sequence of epoch ends twice: once without
interruption, once "killed" after some epoch (the state is taken as a checkpoint would
take it, the objects are thrown away, fresh ones are built as a restarted worker builds
them, ``on_train_begin`` runs, then the state is put back) and asserts the same outcome:
stop epoch, best value, learning rates, CSV bytes. The model and optimizer variables are
carried across the "kill" as the checkpoint carries them. No strategy, no workers.
"""

from __future__ import annotations

import math
from pathlib import Path

import keras
import numpy as np
import pytest

from resilient_train.errors import CheckpointIncompatibleError, RecipeError
from resilient_train.runner.keras_recipes.callbacks import CallbackRunner, decode_state, encode_state


class Process:
    """What one worker process holds: a model, its optimizer, the recipe's callbacks."""

    def __init__(self, make_callbacks, tmp_path, *, is_chief=True, carried=None, validates=True, script=False):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        self.optimizer = keras.optimizers.SGD(learning_rate=0.1)
        self.optimizer.build(self.model.trainable_variables)
        object.__setattr__(self.model, "optimizer", self.optimizer)
        if carried is not None:  # the checkpoint's variables
            self.model.set_weights(carried["weights"])
            self.optimizer.learning_rate = carried["learning_rate"]
        self.runner = CallbackRunner(make_callbacks(), self.model, recipe_name="r", is_chief=is_chief,
                                     output_dir=None if script else tmp_path, epochs=10, steps_per_epoch=4,
                                     validates=validates)
        self.runner.train_begin(resuming=carried is not None)
        self.stopped = self.runner.restore(carried["callbacks"]) if carried is not None else False

    def epoch(self, epoch, logs):
        """Train epoch ``epoch`` (weights become ``epoch``), then its epoch end; returns the logs."""
        self.model.set_weights([np.full(w.shape, float(epoch), np.float32) for w in self.model.get_weights()])
        self.runner.epoch_begin(epoch)
        logs = self.runner.epoch_end(epoch, logs)
        self.stopped = self.runner.stop_training
        return logs

    def checkpoint(self):
        return {"weights": self.model.get_weights(), "learning_rate": float(self.optimizer.learning_rate.numpy()),
                "callbacks": self.runner.state(stopped=self.stopped)}

    def learning_rate(self):
        return float(self.optimizer.learning_rate.numpy())


def drive(make_callbacks, tmp_path, logs, *, kill_after=None, written_after_kill=0):
    """Run the epochs of ``logs``; with ``kill_after`` restart after that epoch's checkpoint.
    ``written_after_kill``: epochs the doomed process still ran past its checkpoint."""
    process = Process(make_callbacks, tmp_path)
    seen, epoch = [], 0
    while epoch < len(logs) and not process.stopped:
        seen.append((process.epoch(epoch, dict(logs[epoch])), process.learning_rate()))
        if epoch == kill_after:
            saved = process.checkpoint()
            for later in range(epoch + 1, min(epoch + 1 + written_after_kill, len(logs))):
                process.epoch(later, dict(logs[later]))  # work lost with the kill
            process = Process(make_callbacks, tmp_path, carried=saved)
        epoch += 1
    process.runner.train_end(seen[-1][0])
    return seen, process


LOSSES = [{"loss": v, "val_loss": v} for v in (1.0, 0.8, 0.79, 0.78, 0.9, 0.5, 0.95, 0.97, 0.99, 1.0)]


def test_early_stopping_stops_at_the_same_epoch_with_the_same_best_weights(tmp_path):
    make = lambda: [keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=0.05,
                                                  restore_best_weights=True)]
    reference, ref_process = drive(make, tmp_path, LOSSES)
    resumed, process = drive(make, tmp_path, LOSSES, kill_after=2)
    assert len(resumed) == len(reference) == 4  # stopped at epoch 3: no 0.05 gain for 2 epochs after 1
    early = process.runner.all[0]
    assert (early.stopped_epoch, early.best, early.best_epoch) == (3, 0.8, 1)
    # restore_best_weights put back epoch 1's weights in both
    assert all(np.all(w == 1.0) for w in process.model.get_weights())
    assert all(np.all(w == 1.0) for w in ref_process.model.get_weights())


def test_a_run_restored_after_early_stopping_stays_stopped(tmp_path):
    make = lambda: [keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=1.0)]
    process = Process(make, tmp_path)
    process.epoch(0, dict(LOSSES[0]))
    process.epoch(1, dict(LOSSES[1]))
    assert process.stopped
    again = Process(make, tmp_path, carried=process.checkpoint())
    assert again.stopped and again.model.stop_training


def test_reduce_lr_on_plateau_lowers_the_rate_at_the_same_epochs(tmp_path):
    make = lambda: [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, cooldown=1,
                                                      min_delta=0.05)]
    reference, _ = drive(make, tmp_path, LOSSES)
    for kill_after in (1, 2, 3, 6):
        resumed, _ = drive(make, tmp_path, LOSSES, kill_after=kill_after)
        assert [lr for _, lr in resumed] == [lr for _, lr in reference], kill_after
    # Keras' own arithmetic: reduce on the first epoch without a 0.05 gain, one epoch of cooldown.
    assert [lr for _, lr in reference] == pytest.approx(
        [0.1, 0.1, 0.05, 0.025, 0.0125, 0.0125, 0.00625, 0.003125, 0.0015625, 0.00078125])
    # The logs carry the rate the epoch trained with (what CSVLogger records).
    assert [logs["learning_rate"] for logs, _ in reference][:4] == pytest.approx([0.1, 0.1, 0.1, 0.05])


def test_learning_rate_scheduler_sets_the_same_rates_after_a_resume(tmp_path):
    make = lambda: [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch % 2 else lr)]
    reference, _ = drive(make, tmp_path, LOSSES)
    resumed, _ = drive(make, tmp_path, LOSSES, kill_after=4)
    assert [lr for _, lr in resumed] == [lr for _, lr in reference] == pytest.approx(
        [0.1, 0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125, 0.00625, 0.00625, 0.003125])


def test_model_checkpoint_keeps_its_best_value(tmp_path):
    make = lambda: [keras.callbacks.ModelCheckpoint("best.weights.h5", monitor="val_loss", save_best_only=True,
                                                    save_weights_only=True)]
    best = tmp_path / "best.weights.h5"  # a relative path lands in the output (run) directory
    process = Process(make, tmp_path)
    process.epoch(0, {"val_loss": 0.5})
    assert best.is_file()
    saved = process.checkpoint()
    best.unlink()
    resumed = Process(make, tmp_path, carried=saved)
    assert resumed.runner.all[0].best == 0.5
    resumed.epoch(1, {"val_loss": 0.7})  # worse than the restored best: no save
    assert not best.exists()
    resumed.epoch(2, {"val_loss": 0.4})
    assert best.is_file()


def test_model_checkpoint_and_csv_logger_run_on_the_chief_only_and_keep_their_state(tmp_path):
    make = lambda: [keras.callbacks.CSVLogger("log.csv"), keras.callbacks.EarlyStopping(patience=1)]
    chief = Process(make, tmp_path)
    chief.epoch(0, {"loss": 1.0, "val_loss": 1.0})
    worker = Process(make, tmp_path / "elsewhere", is_chief=False, carried=chief.checkpoint())
    assert [type(cb).__name__ for _, cb in worker.runner.active] == ["EarlyStopping"]
    assert (worker.runner.chief_only, chief.runner.chief_only) == (["CSVLogger"], [])
    assert decode_state(worker.runner.state(stopped=False))["callbacks"]["0"] == \
        decode_state(chief.runner.state(stopped=False))["callbacks"]["0"]  # carried on unchanged


def test_a_non_chief_rescue_takes_the_chief_only_callbacks_state_from_the_newest_commit(tmp_path):
    make = lambda: [keras.callbacks.CSVLogger("log.csv"), keras.callbacks.EarlyStopping(patience=3),
                    keras.callbacks.ModelCheckpoint("best.weights.h5", save_best_only=True, save_weights_only=True)]
    chief = Process(make, tmp_path)
    worker = Process(make, tmp_path / "elsewhere", is_chief=False)  # a fresh start: no chief-only entries held
    for epoch, loss in enumerate((1.0, 0.7)):
        chief.epoch(epoch, {"loss": loss, "val_loss": loss})
        worker.epoch(epoch, {"loss": loss, "val_loss": loss})
    committed = chief.runner.state(stopped=False)  # the epoch end's commit, by the chief
    worker.runner.batch_end(1, {"loss": 0.6})  # mid-epoch 2: the worker's snapshot
    rescued = worker.runner.with_chief_state(worker.runner.state(stopped=False), committed)
    assert decode_state(rescued) == decode_state(committed)  # every entry, as the chief would have saved it
    assert worker.runner.chief_only_per_batch == []
    per_batch = Process(lambda: [keras.callbacks.ModelCheckpoint("b.weights.h5", save_freq=2, save_weights_only=True)],
                        tmp_path / "w2", is_chief=False)
    assert per_batch.runner.chief_only_per_batch == ["ModelCheckpoint"]  # its state lives on the chief alone


def test_csv_logger_has_no_duplicated_and_no_missing_rows_after_a_resume(tmp_path):
    make = lambda: [keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=0.05),
                    keras.callbacks.CSVLogger("log.csv")]
    drive(make, tmp_path / "a", LOSSES)
    # Killed after epoch 2's checkpoint, having logged epochs 3 and 4 already.
    drive(make, tmp_path / "b", LOSSES, kill_after=2, written_after_kill=2)
    reference = (tmp_path / "a" / "log.csv").read_text()
    assert (tmp_path / "b" / "log.csv").read_text() == reference
    assert [line.split(",")[0] for line in reference.splitlines()] == ["epoch", *map(str, range(10))]


def test_terminate_on_nan_stops_and_the_stop_survives(tmp_path):
    make = lambda: [keras.callbacks.TerminateOnNaN()]
    process = Process(make, tmp_path)
    assert process.runner.has_batch_hooks
    process.runner.batch_end(3, {"loss": math.nan})
    assert process.runner.stop_training
    process.stopped = True
    assert Process(make, tmp_path, carried=process.checkpoint()).stopped


def test_history_keeps_every_epoch(tmp_path):
    make = lambda: [keras.callbacks.History()]
    _, reference = drive(make, tmp_path, LOSSES)
    _, resumed = drive(make, tmp_path, LOSSES, kill_after=5)
    assert resumed.runner.all[0].history == reference.runner.all[0].history
    assert resumed.runner.all[0].epoch == list(range(10))


class Counter(keras.callbacks.Callback):
    """A user callback with state: the documented get_state/set_state hooks."""

    def __init__(self):
        super().__init__()
        self.epochs_seen = 0
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_seen += 1
        self.losses.append(logs["loss"])

    def get_state(self):
        return {"epochs_seen": self.epochs_seen, "losses": np.array(self.losses)}

    def set_state(self, state):
        self.epochs_seen, self.losses = state["epochs_seen"], list(state["losses"])


def test_a_user_callback_with_get_state_and_set_state_resumes(tmp_path):
    _, reference = drive(Counter_list, tmp_path, LOSSES)
    _, resumed = drive(Counter_list, tmp_path, LOSSES, kill_after=3, written_after_kill=1)
    assert (resumed.runner.all[0].epochs_seen, resumed.runner.all[0].losses) == (10, [d["loss"] for d in LOSSES])
    assert reference.runner.all[0].losses == resumed.runner.all[0].losses


def Counter_list():
    return [Counter()]


@pytest.mark.parametrize(
    ("callback", "message"),
    [
        (lambda tmp: keras.callbacks.BackupAndRestore(str(tmp / "b")),
         r"callbacks\(\)\[0\] BackupAndRestore: remove it: resilient-train already backs up and restores"),
        (lambda tmp: keras.callbacks.ProgbarLogger(), r"callbacks\(\)\[0\] ProgbarLogger: not supported yet"),
        (lambda tmp: "EarlyStopping", r"callbacks\(\)\[0\] is a str; expected a keras.callbacks.Callback"),
    ],
)
def test_unsupported_callbacks_are_refused_in_one_line(tmp_path, callback, message):
    with pytest.raises(RecipeError, match=message):
        Process(lambda: [callback(tmp_path)], tmp_path)


def test_a_checkpoint_of_other_callbacks_is_incompatible(tmp_path):
    saved = Process(lambda: [keras.callbacks.History()], tmp_path).checkpoint()
    with pytest.raises(CheckpointIncompatibleError, match=r"callback 0 is a History; .* callbacks\(\)\[0\] is a EarlyStopping"):
        Process(lambda: [keras.callbacks.EarlyStopping()], tmp_path, carried=saved)
    with pytest.raises(CheckpointIncompatibleError, match=r"holds the state of 1 callbacks; .* returns 2"):
        Process(lambda: [keras.callbacks.History(), keras.callbacks.History()], tmp_path, carried=saved)


def test_state_encoding_keeps_arrays_and_infinities_exactly():
    state = {"best": math.inf, "weights": [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1], np.int64)]}
    decoded = decode_state(encode_state(state))
    assert decoded["best"] == math.inf
    assert [(w.dtype, w.shape, w.tolist()) for w in decoded["weights"]] == \
        [(w.dtype, w.shape, w.tolist()) for w in state["weights"]]


def test_a_tensorboard_callback_is_honoured_by_the_runners_scalars_on_the_chief_only(tmp_path):
    """Its Keras hooks never run (it writes nothing of its own); the chief lists its log_dir,
    relative paths resolved like CSVLogger's, for the runner's TensorBoard writer; its state
    entry keeps the callback list's indices."""
    def callbacks():
        return [keras.callbacks.TensorBoard("tb_logs"), keras.callbacks.History()]

    chief = Process(callbacks, tmp_path)
    chief.epoch(0, {"loss": 1.0})
    assert chief.runner.tensorboard_dirs == [tmp_path / "tb_logs"]
    assert not (tmp_path / "tb_logs").exists()  # nothing written by the callback itself
    worker = Process(callbacks, tmp_path, is_chief=False)
    assert worker.runner.tensorboard_dirs == []
    resumed = Process(callbacks, tmp_path, carried=chief.checkpoint())
    assert resumed.runner.tensorboard_dirs == [tmp_path / "tb_logs"]


def test_a_scripts_relative_paths_stay_relative_to_the_working_directory_a_recipes_go_to_the_run_dir(
        tmp_path, monkeypatch):
    """docs/keras.md "Where files go": a fit script's callbacks (output_dir None) write where
    plain Keras would, the process's working directory; a recipe's into the run directory."""
    cwd, run_dir = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def make():
        return [keras.callbacks.CSVLogger("log.csv"), keras.callbacks.ModelCheckpoint("ckpt/best.weights.h5",
                monitor="loss", save_weights_only=True), keras.callbacks.TensorBoard("tb_logs")]

    script = Process(make, run_dir, script=True, validates=False)
    script.epoch(0, {"loss": 1.0})
    script.runner.train_end({})
    assert (script.runner.all[0].filename, script.runner.all[1].filepath, script.runner.all[2].log_dir) == \
        ("log.csv", "ckpt/best.weights.h5", "tb_logs")
    assert script.runner.tensorboard_dirs == [Path("tb_logs")]
    assert (cwd / "log.csv").read_text().splitlines() == ["epoch,loss", "0,1.0"]
    assert (cwd / "ckpt" / "best.weights.h5").is_file()
    assert not run_dir.exists()

    recipe = Process(make, run_dir, validates=False)
    recipe.epoch(0, {"loss": 1.0})
    recipe.runner.train_end({})
    assert (recipe.runner.all[0].filename, recipe.runner.all[1].filepath, recipe.runner.all[2].log_dir) == \
        (str(run_dir / "log.csv"), str(run_dir / "ckpt/best.weights.h5"), str(run_dir / "tb_logs"))
    assert (run_dir / "log.csv").read_text().splitlines() == ["epoch,loss", "0,1.0"]
    assert (run_dir / "ckpt" / "best.weights.h5").is_file()
    assert sorted(p.name for p in cwd.iterdir()) == ["ckpt", "log.csv"]  # only the script's


@pytest.mark.parametrize(("validates", "header"), [(False, "epoch,loss"), (True, "epoch,loss,val_loss")])
def test_a_csv_log_has_val_columns_only_when_the_run_validates(tmp_path, validates, header):
    """Keras' CSVLogger adds val_* columns (all "NA") when the first logs have none; without
    validation the runner's has none, and a resume keeps the columns it started with."""
    make = lambda: [keras.callbacks.CSVLogger("log.csv")]
    process = Process(make, tmp_path, validates=validates)
    process.epoch(0, {"loss": 1.0})
    resumed = Process(make, tmp_path, carried=process.checkpoint(), validates=validates)
    resumed.epoch(1, {"loss": 0.5})
    resumed.runner.train_end({})
    rows = {False: ["0,1.0", "1,0.5"], True: ["0,1.0,NA", "1,0.5,NA"]}[validates]
    assert (tmp_path / "log.csv").read_text().splitlines() == [header, *rows]
