"""Keras callbacks run by the custom loop, with state that survives kills.

A recipe's optional ``callbacks(params)`` returns ``keras.callbacks.Callback`` objects. The
runner calls them where ``model.fit`` would, on every worker: ``on_train_begin`` once per
process start (before the saved state is put back), ``on_epoch_begin`` at an epoch's first
step (not again when an attempt re-enters it mid-epoch), ``on_train_batch_begin`` /
``on_train_batch_end`` at call boundaries (the batch index of the call's first / last
step; the logs are the epoch's running means, as Keras 3 passes), ``on_epoch_end`` with
``loss``, the metrics and ``val_*``, and ``on_train_end`` once, before the final
checkpoint, so that checkpoint holds what ``on_train_end`` did (restored best weights).

Why state survives: :meth:`CallbackRunner.state` captures every callback's state as one
JSON document at each save, on the training thread, in the same instant as the snapshot
of the model, and the checkpoint commits it as the file ``callbacks.json`` beside the
variables (checkpoint/store.py hashes it like them). A restore reads the committed
file, so the callbacks resume in the state that matches the committed step exactly.

Per-callback state extractors know the built-ins' attributes (``_EXTRACTORS``); a user
callback opts in with ``get_state() -> dict`` (JSON-serialisable; NumPy arrays and lists
of them are fine) and ``set_state(state)``. A user callback without them is assumed to
keep no state across epochs. File-writing callbacks (``CSVLogger``, ``ModelCheckpoint``)
run on the chief only. Their relative paths: a recipe's resolve inside the run directory (a
recipe is a module, not a program run from a directory); a fit script's are left as written,
relative to the worker's working directory, as in plain Keras (docs/keras.md, "Where files
go"). ``CSVLogger``'s state is the file's size at the save: a restore truncates the file
there, so a resumed run has no duplicated and no missing rows.

``keras.callbacks.TensorBoard`` is honoured by what the runner already writes: its Keras
hooks never run (its own writer would log every attempt's steps again after a resume); on
the chief, the runner's TensorBoard scalars (runner/outputs/tensorboard.py: the same tags as the
run dir's ``tensorboard/``, each step once across kills) are also written into the
callback's ``log_dir``, relative as the other callbacks' paths (:attr:`CallbackRunner.tensorboard_dirs`).

Refused (``RecipeError``, one line): anything that is not a ``keras.callbacks.Callback``,
``BackupAndRestore`` (the runner does it, with the input position and callback state
too), and built-ins whose state is not covered yet (``CALLBACKS_REFUSED`` in job/recipe.py,
which refuses the literal cases before workers start).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import keras
import numpy as np

from resilient_train.errors import CheckpointIncompatibleError, RecipeError
from resilient_train.job.recipe import CALLBACKS_REFUSED

__all__ = ["CallbackRunner", "STATE_FILE", "encode_state", "decode_state", "refused_callback"]

STATE_FILE = "callbacks.json"  # committed in each checkpoint directory beside ckpt.*
_FORMAT = 1

_CHIEF_ONLY = (keras.callbacks.CSVLogger, keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard)
# Honoured by the runner's own writers instead of their hooks (see the module docstring).
_NOT_DISPATCHED = (keras.callbacks.TensorBoard,)
_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


# ------------------------------------------------------------ JSON with arrays


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {"__ndarray__": base64.b64encode(array.tobytes()).decode(), "dtype": array.dtype.str,
                "shape": list(array.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if hasattr(value, "numpy"):  # a scalar tensor (Keras keeps some bests as tensors)
        return _encode(np.asarray(value.numpy()))
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            data = base64.b64decode(value["__ndarray__"])
            return np.frombuffer(data, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def encode_state(state: dict[str, Any]) -> bytes:
    """The JSON document of ``state`` (arrays as base64, inf/nan as JSON's Infinity/NaN)."""
    return json.dumps(_encode(state), sort_keys=True).encode()


def decode_state(data: bytes) -> dict[str, Any]:
    return _decode(json.loads(data.decode()))


# -------------------------------------------------------- built-in extractors


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(np.asarray(value))


def _early_stopping_get(cb: Any) -> dict[str, Any]:
    return {"wait": cb.wait, "stopped_epoch": cb.stopped_epoch, "best": _float_or_none(cb.best),
            "best_epoch": cb.best_epoch, "best_weights": cb.best_weights}


def _early_stopping_set(cb: Any, state: dict[str, Any]) -> None:
    cb.wait, cb.stopped_epoch, cb.best_epoch = state["wait"], state["stopped_epoch"], state["best_epoch"]
    cb.best = state["best"]
    cb.best_weights = state["best_weights"]


def _plateau_get(cb: Any) -> dict[str, Any]:
    return {"wait": cb.wait, "cooldown_counter": cb.cooldown_counter, "best": _float_or_none(cb.best)}


def _plateau_set(cb: Any, state: dict[str, Any]) -> None:
    cb.wait, cb.cooldown_counter, cb.best = state["wait"], state["cooldown_counter"], state["best"]


def _checkpoint_get(cb: Any) -> dict[str, Any]:
    return {"best": _float_or_none(cb.best)}


def _checkpoint_set(cb: Any, state: dict[str, Any]) -> None:
    cb.best = state["best"]


def _history_get(cb: Any) -> dict[str, Any]:
    return {"epoch": list(cb.epoch), "history": {k: [float(v) for v in vs] for k, vs in cb.history.items()}}


def _history_set(cb: Any, state: dict[str, Any]) -> None:
    cb.epoch, cb.history = list(state["epoch"]), {k: list(v) for k, v in state["history"].items()}


def _csv_get(cb: Any) -> dict[str, Any]:
    size = cb.csv_file.tell() if cb.csv_file is not None and not cb.csv_file.closed else os.path.getsize(cb.filename)
    return {"size": size, "keys": cb.keys}


def _csv_set(cb: Any, state: dict[str, Any]) -> None:
    """Cut the log back to the committed epoch's last row and append from there."""
    if cb.csv_file is not None:
        cb.csv_file.close()
    with open(cb.filename, "a+b") as handle:
        handle.truncate(state["size"])
    cb.csv_file = open(cb.filename, "a", newline="")
    cb.append_header = state["size"] == 0
    cb.keys = state["keys"]
    cb.writer = None


def _stateless_get(cb: Any) -> dict[str, Any]:
    return {}


def _stateless_set(cb: Any, state: dict[str, Any]) -> None:
    return None


_EXTRACTORS: dict[type, tuple[Callable[[Any], dict], Callable[[Any, dict], None]]] = {
    keras.callbacks.EarlyStopping: (_early_stopping_get, _early_stopping_set),
    keras.callbacks.ReduceLROnPlateau: (_plateau_get, _plateau_set),
    keras.callbacks.ModelCheckpoint: (_checkpoint_get, _checkpoint_set),
    keras.callbacks.CSVLogger: (_csv_get, _csv_set),
    keras.callbacks.History: (_history_get, _history_set),
    # The learning rate a scheduler set lives in the optimizer's checkpointed variable.
    keras.callbacks.LearningRateScheduler: (_stateless_get, _stateless_set),
    keras.callbacks.TerminateOnNaN: (_stateless_get, _stateless_set),
    keras.callbacks.LambdaCallback: (_stateless_get, _stateless_set),
    keras.callbacks.TensorBoard: (_stateless_get, _stateless_set),  # its scalars' truncation: runner/outputs/tensorboard.py
}


def _extractor(cb: Any) -> tuple[Callable[[Any], dict], Callable[[Any, dict], None]]:
    if callable(getattr(cb, "get_state", None)) and callable(getattr(cb, "set_state", None)):
        return (lambda c: c.get_state()), (lambda c, s: c.set_state(s))
    for kind in type(cb).__mro__:  # a subclass of a built-in keeps the built-in's state
        if kind in _EXTRACTORS:
            return _EXTRACTORS[kind]
    return _stateless_get, _stateless_set


def refused_callback(callbacks: Sequence[Any]) -> tuple[int, str] | None:
    """(index, why) of the first callback the runner refuses, else None; ``why`` reads after
    ``callbacks[index]`` (``TensorBoard: ...`` / ``is a str; expected ...``)."""
    for index, cb in enumerate(callbacks):
        if not isinstance(cb, keras.callbacks.Callback):
            return index, f"is a {type(cb).__name__}; expected a keras.callbacks.Callback"
        for kind in type(cb).__mro__:
            if kind.__module__.startswith("keras") and kind.__name__ in CALLBACKS_REFUSED:
                return index, f"{kind.__name__}: {CALLBACKS_REFUSED[kind.__name__]}"
    return None


def _overrides(cb: Any, name: str) -> bool:
    return getattr(type(cb), name) is not getattr(keras.callbacks.Callback, name)


class CallbackRunner:
    """The recipe's callbacks on one worker: dispatch, stop agreement input, state.

    ``output_dir``: where relative file paths of the chief-only callbacks land (a recipe's
    run directory); None leaves them relative to the working directory (a fit script's).
    """

    @classmethod
    def for_recipe(cls, callbacks: Any, model: Any, optimizer: Any, *, recipe_name: str,
                   **settings: Any) -> CallbackRunner:
        """What a recipe's ``callbacks()`` returned, checked, with ``model.optimizer`` set."""
        if not isinstance(callbacks, (list, tuple)):
            raise RecipeError(f"recipe {recipe_name}: callbacks() returned {type(callbacks).__name__}; "
                              "expected a list of keras.callbacks.Callback")
        if getattr(model, "optimizer", None) is None:
            # Callbacks reach the optimizer as model.optimizer (ReduceLROnPlateau). Set
            # without Keras' tracking so the checkpoint's object graph stays the twin's.
            object.__setattr__(model, "optimizer", optimizer)
        return cls(callbacks, model, recipe_name=recipe_name, **settings)

    def __init__(
        self,
        callbacks: Sequence[Any],
        model: Any,
        *,
        recipe_name: str,
        is_chief: bool,
        output_dir: Path | None,
        epochs: int,
        steps_per_epoch: int,
        validates: bool,
    ) -> None:
        self.all = list(callbacks)
        # Without validation a CSVLogger writes no val_* columns: Keras' own adds them, all
        # "NA", whenever the first epoch's logs have none (for validation_freq > 1).
        self.validates = validates
        refused = refused_callback(self.all)
        if refused is not None:
            raise RecipeError(f"recipe {recipe_name}: callbacks()[{refused[0]}] {refused[1]}")
        self.recipe_name = recipe_name
        self.model = model
        # (index in the recipe's list, callback): indices name the state entries, so a
        # chief-only callback's state is where every worker expects it.
        self.active = [(i, cb) for i, cb in enumerate(self.all) if is_chief or not isinstance(cb, _CHIEF_ONLY)]
        if output_dir is not None:
            for _, cb in self.active:
                _resolve_paths(cb, Path(output_dir))
        # Where the chief also writes the runner's TensorBoard scalars (a TensorBoard callback's log_dir).
        self.tensorboard_dirs = [Path(cb.log_dir) for _, cb in self.active if isinstance(cb, keras.callbacks.TensorBoard)]
        self._dispatched = [(i, cb) for i, cb in self.active if not isinstance(cb, _NOT_DISPATCHED)]
        for _, cb in self._dispatched:
            cb.set_model(model)
            cb.set_params({"epochs": epochs, "steps": steps_per_epoch, "verbose": 0})
        # From the full list, not the active one: every worker must agree whether batch ends
        # take part in a stop all-reduce (ModelCheckpoint has batch hooks and runs on the chief).
        self.has_batch_hooks = any(_overrides(cb, name) for cb in self.all for name in _BATCH_HOOKS)
        self._stored: dict[str, Any] = {}  # state of callbacks this worker does not run

    # ------------------------------------------------------------ dispatch
    def train_begin(self, *, resuming: bool) -> None:
        """``on_train_begin``; ``resuming``: a log file is kept (``restore`` cuts it back)."""
        self.model.stop_training = False
        for _, cb in self._dispatched:
            if resuming and isinstance(cb, keras.callbacks.CSVLogger):
                append, cb.append = cb.append, True
                cb.on_train_begin({})
                cb.append = append
            else:
                cb.on_train_begin({})

    def epoch_begin(self, epoch: int) -> None:
        for _, cb in self._dispatched:
            cb.on_epoch_begin(epoch, {})

    def batch_begin(self, batch: int) -> None:
        for _, cb in self._dispatched:
            cb.on_train_batch_begin(batch, {})

    def batch_end(self, batch: int, logs: dict[str, float]) -> None:
        for _, cb in self._dispatched:
            cb.on_train_batch_end(batch, dict(logs))

    def epoch_end(self, epoch: int, logs: dict[str, float]) -> dict[str, float]:
        """Returns the logs as the callbacks left them (ReduceLROnPlateau adds ``learning_rate``)."""
        logs = dict(logs)
        for _, cb in self._dispatched:
            if isinstance(cb, keras.callbacks.CSVLogger) and cb.keys is None and not self.validates:
                cb.keys = sorted(logs)  # the columns Keras would pick, without its val_* additions
            cb.on_epoch_end(epoch, logs)
        return logs

    def train_end(self, logs: dict[str, float]) -> None:
        for _, cb in self._dispatched:
            cb.on_train_end(dict(logs))

    @property
    def chief_only(self) -> list[str]:
        """The class names of the callbacks this worker does not run (they run on the chief)."""
        active = {index for index, _ in self.active}
        return [type(cb).__name__ for index, cb in enumerate(self.all) if index not in active]

    @property
    def chief_only_per_batch(self) -> list[str]:
        """The chief-only callbacks whose state may change at a batch end (ModelCheckpoint with
        an integer save_freq): between two commits it exists only on the chief."""
        active = {index for index, _ in self.active}
        return [type(cb).__name__ for index, cb in enumerate(self.all) if index not in active
                and isinstance(cb, keras.callbacks.ModelCheckpoint) and cb.save_freq != "epoch"]

    def with_chief_state(self, data: bytes, committed: bytes) -> bytes:
        """``data`` (this worker's ``callbacks.json``) with the chief-only callbacks' entries
        taken from ``committed`` (a commit's ``callbacks.json`` made since the last epoch end:
        those callbacks' state changes only at epoch ends, see :attr:`chief_only_per_batch`)."""
        document, theirs = decode_state(data), decode_state(committed)["callbacks"]
        active = {str(index) for index, _ in self.active}
        for key in map(str, range(len(self.all))):
            if key not in active:
                document["callbacks"][key] = theirs[key]
        return encode_state(document)

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    # --------------------------------------------------------------- state
    def state(self, *, stopped: bool) -> bytes:
        """Every callback's state (and whether training was stopped) as ``callbacks.json``."""
        entries = dict(self._stored)
        for index, cb in self.active:
            get, _ = _extractor(cb)
            entries[str(index)] = {"class": type(cb).__name__, "state": get(cb)}
        return encode_state({"format": _FORMAT, "stopped": stopped, "callbacks": entries})

    def restore(self, data: bytes) -> bool:
        """Put back the state of a checkpoint (after ``train_begin``); returns ``stopped``."""
        document = decode_state(data)
        entries = document.get("callbacks", {})
        if len(entries) != len(self.all):
            raise CheckpointIncompatibleError(
                f"the checkpoint holds the state of {len(entries)} callbacks; recipe {self.recipe_name}'s "
                f"callbacks() returns {len(self.all)}"
            )
        active = dict(self.active)
        for index, cb in enumerate(self.all):
            entry = entries[str(index)]
            if entry["class"] != type(cb).__name__:
                raise CheckpointIncompatibleError(
                    f"the checkpoint's callback {index} is a {entry['class']}; recipe {self.recipe_name}'s "
                    f"callbacks()[{index}] is a {type(cb).__name__}"
                )
            if index in active:
                _extractor(cb)[1](cb, entry["state"])
            else:
                self._stored[str(index)] = entry  # carried on unchanged (a chief-only callback)
        stopped = bool(document.get("stopped", False))
        self.model.stop_training = stopped
        return stopped


def _resolve_paths(cb: Any, output_dir: Path) -> None:
    """Relative ``CSVLogger`` / ``ModelCheckpoint`` / ``TensorBoard`` paths land in ``output_dir``."""
    for attribute in ("filename", "filepath", "log_dir"):
        value = getattr(cb, attribute, None) if isinstance(cb, _CHIEF_ONLY) else None
        if isinstance(value, str) and not os.path.isabs(value) and "://" not in value:
            path = output_dir / value
            path.parent.mkdir(parents=True, exist_ok=True)
            setattr(cb, attribute, str(path))
