"""The checkpoint's object graph: the file format of every resilient-train checkpoint, defined once.

A committed checkpoint's ``ckpt.*`` files are a ``tf.train.Checkpoint`` of the graph built
here, and its keys are the format: a checkpoint restores exactly when the reader's graph
has the same keys, shapes and dtypes. So every writer and reader builds it through this
module: the worker's live graph and its async twin (runner/training/loop.py), the parameter-server
coordinator (runner/process/ps_roles.py), ``export`` and ``verify --deep`` (commands/export.py).
tests/runner/state/test_ckpt_layout.py pins the keys of saved checkpoints of two recipes: a
format change is a deliberate change to that test, and it stops every existing checkpoint
from restoring (``CheckpointIncompatibleError``, exit 3).

The graph's top-level keys (TensorFlow sorts them):

    epoch, global_step, step_in_epoch  int64 counters (``COUNTERS``, ``new_counters``)
    model                              the recipe's keras.Model: its layers' weights
    optimizer                          iterations, learning rate, slot variables
    rng                                the model's variables that are not weights (Keras
                                       SeedGenerator states, e.g. a seeded Dropout), keyed
                                       by ``rng_key`` of the live model's variable path;
                                       ``{}`` for a model without any, the key is still there
    metrics                            only for a model with its own ``train_step``
                                       (runner/keras_recipes/own_step.py): its metric
                                       trackers' variables (``keras.metrics.Mean`` totals
                                       and counts), keyed by ``rng_key`` of the live path,
                                       so a resumed epoch reports what an uninterrupted one
                                       would; absent for every other model (their format
                                       is unchanged)

A writer builds the whole graph (``training_graph``: no part is optional). A reader may
restore a part of it with ``partial=True``: ``weights_graph`` (the model alone) is what
``export`` reads. The keys come from these attribute names, not from the variables' own
names: the twin's counters are ``twin_epoch`` ... and write the same keys.

Not in the graph, and committed beside it instead: the callbacks' state (callbacks.json,
runner/keras_recipes/callbacks.py), the per-worker iterator states
(runner/input/iterator_state.py), and everything in the manifest's ``extra`` (epoch loss
sums, the input hashes, the parameter-server tier's ``updates_applied``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import tensorflow as tf

from resilient_train.errors import CheckpointIncompatibleError

__all__ = [
    "COUNTERS",
    "new_counters",
    "rng_key",
    "rng_state",
    "twin_rng_state",
    "training_graph",
    "metric_state",
    "twin_metric_state",
    "weights_graph",
    "restore",
]

COUNTERS = ("epoch", "step_in_epoch", "global_step")
"""The counters' keys; a worker reads its position (and the manifest repeats it) from them."""


def new_counters(name_prefix: str = "") -> dict[str, tf.Variable]:
    """The counters at 0, keyed by ``COUNTERS``, created in the caller's scope (a strategy's
    or none). ``name_prefix`` names the variables (the async twin's: ``twin_``), not the keys."""
    return {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name_prefix + name) for name in COUNTERS}


def rng_key(path: str) -> str:
    """A variable path as a key of the ``rng`` entry: non-word characters become ``_``."""
    return re.sub(r"\W", "_", path)


def rng_state(model: Any) -> dict[str, Any]:
    """The ``rng`` entry of ``model``'s graph: its variables that are not weights (Keras
    seed-generator states), keyed by ``rng_key`` of their path."""
    paths = {variable.path for variable in model.weights}
    return {rng_key(v.path): v for v in model.variables if v.path not in paths}


def twin_rng_state(live_model: Any, twin_model: Any) -> dict[str, Any]:
    """The twin's ``rng`` entry, keyed by the LIVE variables' paths (twin layers get other
    auto-generated names, e.g. ``seed_generator_1``), paired by position."""
    live_vars, twin_vars = list(live_model.variables), list(twin_model.variables)
    if len(live_vars) != len(twin_vars):
        raise ValueError(
            f"twin checkpoint: the twin model has {len(twin_vars)} variables, the live one {len(live_vars)}"
        )
    live_weight_paths = {v.path for v in live_model.weights}
    return {rng_key(v.path): t for v, t in zip(live_vars, twin_vars) if v.path not in live_weight_paths}


def training_graph(*, model: Any, optimizer: Any, counters: Mapping[str, Any],
                   rng: Mapping[str, Any], metrics: Mapping[str, Any] | None = None) -> tf.train.Checkpoint:
    """The whole graph a checkpoint holds, from its parts (see the module docstring).

    ``counters``: ``new_counters()`` (or variables with exactly the ``COUNTERS`` keys);
    ``rng``: ``rng_state(model)``, or for a twin ``twin_rng_state(live_model, model)``;
    ``metrics``: ``metric_state(model)`` (a twin's: ``twin_metric_state``) for a model with
    its own ``train_step``, else None (no ``metrics`` key).
    """
    if sorted(counters) != sorted(COUNTERS):
        raise ValueError(f"Received counters {sorted(counters)}; expected exactly {sorted(COUNTERS)}")
    extra = {} if metrics is None else {"metrics": dict(metrics)}
    return tf.train.Checkpoint(model=model, optimizer=optimizer, rng=rng, **counters, **extra)


def metric_state(model: Any) -> dict[str, Any]:
    """The ``metrics`` entry of ``model``'s graph: the variables of ``model.metrics`` (a
    model's own trackers), keyed by ``rng_key`` of their path."""
    return {rng_key(v.path): v for v in model.metrics_variables}


def twin_metric_state(live_model: Any, twin_model: Any) -> dict[str, Any]:
    """The twin's ``metrics`` entry, keyed by the LIVE variables' paths, paired by position."""
    live_vars, twin_vars = list(live_model.metrics_variables), list(twin_model.metrics_variables)
    if len(live_vars) != len(twin_vars):
        raise ValueError(f"twin checkpoint: the twin model has {len(twin_vars)} metric variables, the live one "
                         f"{len(live_vars)}")
    return {rng_key(v.path): t for v, t in zip(live_vars, twin_vars)}


def weights_graph(model: Any) -> tf.train.Checkpoint:
    """The model's part of the graph alone; restore it with ``partial=True`` (export)."""
    return tf.train.Checkpoint(model=model)


def restore(checkpoint: tf.train.Checkpoint, prefix: str | Path, *, where: str, recipe_name: str,
            partial: bool = False) -> None:
    """Read the checkpoint files at ``prefix`` into ``checkpoint``; every object of the
    graph must be matched, or it is refused.

    ``partial``: values in the files that the graph has no object for are allowed (a
    ``weights_graph``; ``verify --deep`` lists them itself). Raises
    ``CheckpointIncompatibleError("<where> does not fit recipe <recipe_name>'s model: ...")``
    with the first line of TensorFlow's complaint. A strategy's scope, where the graph's
    variables need one, is the caller's.
    """
    try:
        status = checkpoint.read(str(prefix))
        (status.expect_partial() if partial else status).assert_existing_objects_matched()
    except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointIncompatibleError(f"{where} does not fit recipe {recipe_name}'s model: {first}") from None
