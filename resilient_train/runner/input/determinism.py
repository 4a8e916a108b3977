"""Exact resume where the runner can give it, and a check where it cannot.

Two things make a recipe's input differ between an uninterrupted run and a resumed one:

* **Global RNG state that depends on what ran before.** An unseeded ``shuffle()`` (or
  ``tf.random.*`` op) takes its seed from TensorFlow's global seed and a counter of ops
  created so far in the process; ``np.random.*`` and Python's ``random.*`` draw from one
  process-wide generator each. A resumed worker has built (and drawn) less than an
  uninterrupted one before building epoch ``e``, so the "same" shuffle or noise differs.
  :func:`seed_input_rng` reseeds all three from ``(seed, epoch)`` immediately before every
  call of ``recipe.dataset()``: what ``dataset()`` draws *while it is called* (eager numpy
  arrays, a traced ``map``) becomes a function of the epoch, whatever ran before. Draws at
  *iteration* time (``tf.numpy_function`` / ``py_function`` calling ``np.random``) start
  from that state too, but their order is the pipeline's: exact only for a sequential
  pipeline re-entered by ``skip``, never under a parallel ``map``.
* **Anything else** (a generator with its own entropy such as ``np.random.default_rng()``
  or ``random.Random()`` without a seed, ``os.urandom``, the clock, input files that
  changed). The runner cannot fix these, but it can notice: the chief hashes the first
  batch of each epoch's input (:func:`first_batch_digest`, on a separate build of the
  dataset so training's iterator is untouched) and records it in each checkpoint's manifest
  (``extra["input_digest"]``) and in an ``input_digest`` event. Epoch ``e + 1``'s digest is
  taken at the end of epoch ``e``, before its epoch-end checkpoint, so a checkpoint at an
  epoch boundary carries the digest of the epoch a resume enters, as a mid-epoch one does.
  After a restore, entering that epoch hashes it again; a different digest is an
  ``input_mismatch`` event and a warning naming the likely cause, or, with
  ``--strict-resume``, a fatal error (exit 3).

A mismatch is not only said once: it is recorded in every later checkpoint's manifest
(``extra["inexact"]``, checkpoint/manifest.py), inherited through later restores, so the run's
end (summary.json's ``exact``, the final line, ``verify``) says its weights are not the
uninterrupted run's, whatever restarted in between, the supervisor included. Only the chief
compares, but with the memory tier any worker may commit (a survivor's rescue,
runner/state/memory_tier.py): then, once the epoch a restore entered is built, every worker
learns the chief's verdict in one all-reduce (:meth:`InputCheck.agreed`, called by the loop)
and records it the same way.

The check compares like with like only: the chief's shard (input pipeline 0) with the
same number of workers as the checkpoint. It costs one first-batch build per epoch on the
chief (two on the epoch a restore enters), nothing per step.
"""

from __future__ import annotations

import hashlib
import random
import sys
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from resilient_train.checkpoint.manifest import INEXACT_EXTRA_KEY, inexact_resumes
from resilient_train.errors import RecipeError
from resilient_train.rundir.events import emit

__all__ = ["seed_input_rng", "input_seed", "batch_digest", "first_batch_digest", "InputCheck"]

_EXTRA_KEY = "input_digest"


def input_seed(seed: int, epoch: int) -> int:
    """The global TensorFlow seed for building epoch ``epoch``'s input (a 31-bit int)."""
    digest = hashlib.sha256(f"resilient-train input {seed} {epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seed_input_rng(seed: int, epoch: int) -> None:
    """Reseed every global RNG a recipe's ``dataset()`` may draw from for epoch ``epoch``:
    TensorFlow's global seed (and op-seed counter), NumPy's and Python's global generators.

    Process-wide on purpose: the worker process exists to run this job, and nothing of the
    runner's draws from the NumPy or Python generator after start-up
    (``keras.utils.set_random_seed`` seeded them then; model_state.preserved_rng keeps
    them around a second model build)."""
    value = input_seed(seed, epoch)
    tf.random.set_seed(value)
    np.random.seed(value)
    random.seed(value)


def batch_digest(batch: Any) -> str:
    """SHA-256 over every tensor of a batch (structure, dtype, shape and bytes)."""
    digest = hashlib.sha256()
    for path, value in _flatten_with_paths(batch):
        array = np.ascontiguousarray(np.asarray(value))
        digest.update(f"{path}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _flatten_with_paths(batch: Any) -> list[tuple[str, Any]]:
    values = tf.nest.flatten(batch)
    return [(str(i), value.numpy() if hasattr(value, "numpy") else value) for i, value in enumerate(values)]


def first_batch_digest(dataset: tf.data.Dataset) -> str | None:
    """The digest of ``dataset``'s first element; None when it is empty."""
    for batch in dataset.take(1):
        return batch_digest(batch)
    return None


class InputCheck:
    """Records the chief's first-batch digest per epoch and compares it after a restore."""

    def __init__(self, *, strict: bool = False, recipe_name: str = "recipe") -> None:
        self.strict = strict
        self.recipe_name = recipe_name
        self._observed: dict[int, str] = {}
        self._expected: tuple[int, str, str] | None = None  # epoch, sha256, checkpoint
        self._inexact: list[dict[str, Any]] = []  # the inexact resumes behind the current state
        self._agreement_pending = False  # a restore's check is due: every worker must learn its verdict
        self._restore_mismatched = False  # the chief: this attempt's check found a mismatch

    def expect(self, extra: Mapping[str, Any], *, checkpoint: str, same_world_size: bool) -> None:
        """After a restore: the digest the checkpoint recorded for the epoch it was in, and the
        inexact resumes in its history (this attempt's checkpoints carry them on)."""
        self._inexact = inexact_resumes(dict(extra))
        recorded = extra.get(_EXTRA_KEY)
        if same_world_size and isinstance(recorded, Mapping) and "epoch" in recorded and "sha256" in recorded:
            self._expected = (int(recorded["epoch"]), str(recorded["sha256"]), checkpoint)
            self._agreement_pending = True  # (the same on every worker: they restored the same manifest)

    @property
    def agreement_pending(self) -> bool:
        """True on every worker from a restore that will be checked until :meth:`agreed`: the
        loop then all-reduces :attr:`restore_mismatched` once the restored epoch's input is built."""
        return self._agreement_pending

    @property
    def restore_mismatched(self) -> bool:
        """The chief: the check after this attempt's restore found the input changed."""
        return self._restore_mismatched

    def agreed(self, chief_mismatched: bool) -> None:
        """Every worker, with the chief's verdict: a non-chief records the chief's mismatch as the
        chief did, so a checkpoint it commits (a rescue) carries it too."""
        self._agreement_pending = False
        if chief_mismatched and not self._restore_mismatched and self._expected is not None:
            epoch, _, checkpoint = self._expected
            self._expected = None
            self._inexact.append(_inexact_entry(epoch, checkpoint))

    def recorded(self, epoch: int) -> bool:
        """Whether this process hashed epoch ``epoch``'s first batch already (ahead of it)."""
        return epoch in self._observed

    def observe(self, epoch: int, digest: str | None) -> None:
        """The chief built epoch ``epoch``'s input; compare when a restore recorded it."""
        if digest is None:
            return
        self._observed[epoch] = digest
        # In the event log too: manifests carry it only while retention keeps them, and
        # ``resilient-train diff`` lines up epochs from a run dir's events.
        emit("input_digest", group=True, epoch=epoch, sha256=digest)
        if self._expected is None or self._expected[0] != epoch:
            return
        _, expected, checkpoint = self._expected
        self._expected = None
        if expected != digest:
            self._mismatch(epoch, expected, digest, checkpoint)

    @property
    def inexact(self) -> list[dict[str, Any]]:
        """The inexact resumes behind the current state ([]: exact as far as the check can tell)."""
        return list(self._inexact)

    def to_extra(self, epoch: int) -> dict[str, Any]:
        """What a checkpoint taken in ``epoch`` records: its input's digest (nothing before its
        input was built) and the inexact resumes behind it (nothing when there are none)."""
        digest = self._observed.get(epoch)
        extra: dict[str, Any] = {_EXTRA_KEY: {"epoch": epoch, "sha256": digest}} if digest is not None else {}
        if self._inexact:
            extra[INEXACT_EXTRA_KEY] = [dict(entry) for entry in self._inexact]
        return extra

    def _mismatch(self, epoch: int, expected: str, found: str, checkpoint: str) -> None:
        message = (
            f"recipe {self.recipe_name}: after restoring {checkpoint}, the first batch of epoch {epoch} "
            f"differs from the one recorded when it was saved (sha256 {expected[:12]} -> {found[:12]}); "
            "dataset() is not a pure function of (input_context, epoch, seed): likely a random generator "
            "with its own entropy (np.random.default_rng() or random.Random() without a seed, os.urandom), "
            "numpy/Python random drawn while the pipeline runs (numpy_function/py_function), the clock, or "
            "input files that changed; the weights will not be bit-identical to an uninterrupted run"
        )
        emit("input_mismatch", group=True, epoch=epoch, checkpoint=checkpoint, expected_sha256=expected,
             found_sha256=found, strict=self.strict)
        if self.strict:
            raise RecipeError(message + " (--strict-resume)")
        self._restore_mismatched = True
        self._inexact.append(_inexact_entry(epoch, checkpoint))
        print(f"resilient-train: warning: {message}", file=sys.stderr)


def _inexact_entry(epoch: int, checkpoint: str) -> dict[str, Any]:
    """One ``extra["inexact"]`` entry (checkpoint/manifest.py): epoch ``epoch``'s input differed
    after restoring ``checkpoint``."""
    return {"cause": "input_mismatch", "epoch": epoch, "checkpoint": checkpoint}
