"""How a resumed worker gets back to its place in an epoch, and the tf.data iterator state.

Four paths, chosen per recipe (``reentry_path``), best first:

* ``indexed``: the runner's own pipeline starts at the position (runner/input/indexed.py);
* ``start_step``: the recipe's ``dataset`` positions itself (runner/input/data.py);
* ``iterator_state``: a ``dataset`` recipe without ``start_step``: every worker's tf.data
  iterator state is saved with mid-epoch checkpoints and restored on re-entry (a save
  between captures carries the newest capture, and the restore replays the batches since:
  runner/state/saving.py ``_save_captures``). Only while the state is small: at the first mid-epoch save every
  worker measures its state and the run keeps the path only when the largest is at most
  ``--max-iterator-state-bytes`` (event ``iterator_state_sized``). The pipeline is saved
  with tf.data's symbolic checkpointing where TensorFlow allows it (runner/input/reentry.py
  asks it once per attempt): positions instead of buffered elements, so a range -> map ->
  batch pipeline saves ~1 KB (tests/recipes/input_decoded.py: 975 B; explicitly: its
  prefetched batches, 348-397 KB). A shuffle buffer is saved in either mode (recipes/digits_cnn.py:
  ~570 KB, the data itself); ``cache()`` refuses symbolic, so it is saved explicitly;
* ``skip``: the runner rebuilds the epoch and ``skip()``s to the step (runs the pipeline
  of every skipped batch).

This module is the pure part (the choice, the state file's name and blob); the worker's
:class:`~resilient_train.runner.input.reentry.EpochInput` applies it epoch by epoch.

Why ``start_step`` ranks above the iterator state: it costs nothing at save time, while
the state is written by a synchronous op on the training thread at the saves that capture it.

Where the state goes: each worker serializes its iterator (``tf.train.Checkpoint`` of the
plain ``tf.data`` iterator; MultiWorkerMirroredStrategy's distributed iterator cannot be
saved, so on this path each worker iterates its own pipeline and ``strategy.run`` hands the
batch to its single replica: the path needs one replica per worker; runner/input/data.py gives
those batches the distributed iterator's shapes, so both paths train to the same weights
and a run may switch between them at any checkpoint). The states reach the
chief through one all-reduce at the save step (every worker saves the same steps), and
the chief commits them as ``iterator-<rank>.bin`` beside ``ckpt.*``, before MANIFEST.json
like every file of a checkpoint; the manifest's ``extra["iterator_state"]`` says the world
size, epoch and the step the saved pipeline was entered at. A restore at another world
size cannot use them (another sharding): it falls back to ``skip``, and says so.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.runner.input.data import accepts_start_step

__all__ = ["reentry_path", "state_file", "serialize_iterator", "restore_iterator", "EXTRA_KEY",
           "INDEXED", "START_STEP", "ITERATOR_STATE", "SKIP"]

INDEXED, START_STEP, ITERATOR_STATE, SKIP = "indexed", "start_step", "iterator_state", "skip"
EXTRA_KEY = "iterator_state"
_MAGIC = b"RTITER1\n"


def state_file(rank: int) -> str:
    """The checkpoint file holding worker ``rank``'s iterator state."""
    return f"iterator-{rank}.bin"


def reentry_path(recipe: Recipe, *, max_state_bytes: int, replicas_per_worker: int) -> tuple[str, str]:
    """(path, why) for this recipe and job, before any state was measured."""
    if recipe.indexed:
        return INDEXED, "indexed recipe: the runner's pipeline starts at the step"
    if recipe.dataset is not None and accepts_start_step(recipe.dataset):
        return START_STEP, "dataset takes start_step"
    if max_state_bytes == 0:
        return SKIP, "--max-iterator-state-bytes 0"
    if replicas_per_worker != 1:
        return SKIP, f"{replicas_per_worker} replicas per worker (the iterator-state path needs 1)"
    return ITERATOR_STATE, f"iterator state up to {max_state_bytes} bytes (measured at the first mid-epoch save)"


def serialize_iterator(iterator: Any) -> bytes:
    """A plain tf.data iterator's state as one blob (the files of its tf.train.Checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="rt-iterator-") as directory:
        prefix = tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, "it"))
        parts = []
        for path in sorted(Path(directory).iterdir()):
            name, data = path.name.encode(), path.read_bytes()
            parts.append(struct.pack("<HQ", len(name), len(data)) + name + data)
        assert prefix.startswith(directory)
    return _MAGIC + b"".join(parts)


def restore_iterator(iterator: Any, blob: bytes) -> None:
    """Put ``blob`` (from :func:`serialize_iterator`) into a fresh iterator of the same pipeline."""
    if not blob.startswith(_MAGIC):
        raise ValueError(f"iterator state of {len(blob)} bytes does not start with {_MAGIC!r}")
    with tempfile.TemporaryDirectory(prefix="rt-iterator-") as directory:
        at = len(_MAGIC)
        while at < len(blob):
            name_size, data_size = struct.unpack_from("<HQ", blob, at)
            at += struct.calcsize("<HQ")
            name = blob[at:at + name_size].decode()
            at += name_size
            if "/" in name or name.startswith("."):
                raise ValueError(f"iterator state names a file {name!r}; expected a plain file name")
            Path(directory, name).write_bytes(blob[at:at + data_size])
            at += data_size
        tf.train.Checkpoint(iterator=iterator).read(os.path.join(directory, "it")).assert_consumed()
