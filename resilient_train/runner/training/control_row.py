"""The control columns of the packed all-reduce: one definition, read by everyone who votes.

Every training step makes ONE all-reduce besides the gradients' (runner/training/
train_call.py ``TrainCall``): a row of float32 values, SUMmed over every replica of every worker.
It starts with the step's loss and metric values (their names are known only when the step
function is traced) and continues with the control columns below, through which the workers
agree on things at the same call without a collective of their own. After those, a call
that ends at a memory-tier snapshot carries the comparison's columns
(runner/state/worker_agreement.py; not control: they are read by the tier).

Two kinds of control column, by who adds a value into the SUM:

* ``EVERY_WORKER``: each worker's own vote (a count: the SUM > 0 means someone asked);
  every replica of the worker adds it, so the SUM is votes x replicas, still > 0 exactly
  when anyone voted.
* ``CHIEF``: a number only the chief proposes (non-chiefs send 0), added by the first
  replica of each worker only, so the SUM is the chief's number exactly (float32: exact for
  the integers used here, runner/state/memory_tier.py ``MAX_AUTO_EVERY``).

A new per-step signal is one new ``Column`` here and one field of ``Votes``; the step
function, the host's encoding and the decoding all follow this table.

After the control columns, with more than one worker, comes the timing block: two columns per
worker, added by the worker's first replica only, one-hot by rank. ``__host_s_rank<r>__`` holds
that rank's host seconds before the call (its loop since the previous call's result: events,
saves, callbacks, a slow host), ``__stall_s_rank<r>__`` the seconds its process could not run
since its previous call began (a CPU quota, a noisy neighbour, a stopped process:
runner/health/stall_probe.py), each a share per step. The SUM so gives every worker every
rank's, with no collective of its own: under MWMS the step time is the same on every rank (the
early ones wait in the call's first all-reduce for the last one), and what differs is how long
each is busy before it enters it, and how much of the call it could not run
(runner/health/stragglers.py). The step's own compute is not timed in the graph:
``tf.timestamp`` is refused under op determinism.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from enum import Enum
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

__all__ = ["Column", "Votes", "CONTROL", "encode", "host_names", "host_seconds", "in_replica", "in_replica_host",
           "layout", "split", "stall_seconds"]


class Adds(str, Enum):
    EVERY_WORKER = "every worker"
    CHIEF = "the chief"


@dataclass(frozen=True)
class Column:
    name: str  # its name in the row's layout (never a metric's name: dunder)
    adds: Adds
    meaning: str


@dataclass(frozen=True)
class Votes:
    """One call's control values: what this worker sends (encode), or the group's SUM (split)."""

    stop: float = 0.0  # a stop request (SIGTERM/SIGINT): the group stops after this call
    save: float = 0.0  # a save now: the chief's time-based vote, any worker's surviving notice
    nonfinite: float = 0.0  # set in the step, never by the host: a replica's loss or gradient norm was not finite
    next_call: float = 0.0  # the next call's maximum steps (runner/training/call_size.py)
    snapshot_every: float = 0.0  # --snapshot-every auto: the proposed interval (0: not yet)
    capture_every: float = 0.0  # ... and the input's capture interval proposed with it


CONTROL: tuple[Column, ...] = (
    Column("__stop_requested__", Adds.EVERY_WORKER, "the sum of the workers' stop requests"),
    Column("__save_due__", Adds.EVERY_WORKER, "the sum of the workers' save votes"),
    Column("__nonfinite__", Adds.EVERY_WORKER,
           "the number of replicas whose loss or gradient norm was not finite at this step (runner/health/)"),
    Column("__next_call_steps__", Adds.CHIEF, "the chief's size of the next call"),
    Column("__snapshot_every__", Adds.CHIEF, "the chief's proposed snapshot interval (0: none)"),
    Column("__capture_every__", Adds.CHIEF, "the chief's proposed capture interval (0: none)"),
)
assert [f.name for f in fields(Votes)] == ["stop", "save", "nonfinite", "next_call", "snapshot_every",
                                          "capture_every"]
assert len(CONTROL) == len(fields(Votes))
_CHIEF_FROM = next(i for i, column in enumerate(CONTROL) if column.adds is Adds.CHIEF)
assert all(column.adds is Adds.CHIEF for column in CONTROL[_CHIEF_FROM:])  # one slice: cheap in the graph
_NONFINITE = next(i for i, column in enumerate(CONTROL) if column.name == "__nonfinite__")


def encode(votes: Votes) -> np.ndarray:
    """This worker's control columns for the coming call (host side)."""
    return np.array(astuple(votes), dtype=np.float32)


def in_replica(flags: tf.Tensor, nonfinite: tf.Tensor | None = None) -> tf.Tensor:
    """Inside the step, per replica: the control columns this replica adds to the SUM.
    ``nonfinite``: this replica's 0/1 float32 (runner/health/detector.py), in its column."""
    first_replica = tf.cast(tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0), tf.float32)
    every_worker = flags[:_CHIEF_FROM]
    if nonfinite is not None:
        every_worker = every_worker + tf.one_hot(_NONFINITE, _CHIEF_FROM, dtype=tf.float32) * nonfinite
    return tf.concat([every_worker, flags[_CHIEF_FROM:] * first_replica], axis=0)


def host_names(workers: int) -> list[str]:
    """The timing block's columns: each rank's host seconds, then each rank's stalled seconds, with more
    than one worker; else none."""
    if workers <= 1:
        return []
    return [f"__host_s_rank{rank}__" for rank in range(workers)] + [f"__stall_s_rank{rank}__" for rank in range(workers)]


def in_replica_host(timing_s: tf.Tensor, *, rank: int, workers: int, local_replicas: int) -> tf.Tensor:
    """Inside the step, per replica: the timing block this replica adds to the SUM. ``timing_s``:
    [host seconds, stalled seconds] of this worker, in its columns, from its first replica only (no
    columns with one worker)."""
    if workers <= 1:
        return tf.zeros([0], tf.float32)
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    first_of_worker = tf.cast(tf.equal(replica, rank * local_replicas), tf.float32)
    one_hot = tf.one_hot(rank, workers, dtype=tf.float32) * first_of_worker
    return tf.reshape(tf.cast(timing_s, tf.float32)[:, None] * one_hot[None, :], [2 * workers])


def layout(value_names: Sequence[str], workers: int = 1) -> list[str]:
    """The row's named columns: the step's values, the control columns, the timing block."""
    return [*value_names, *(column.name for column in CONTROL), *host_names(workers)]


def _control_start(names: Sequence[str]) -> int:
    return list(names).index(CONTROL[0].name)


def split(row: Any, names: Sequence[str]) -> tuple[dict[str, float], Votes]:
    """One reduced row: its values by name (loss, metrics) and the group's control SUMs."""
    start = _control_start(names)
    values = {name: float(row[k]) for k, name in enumerate(names[:start])}
    return values, Votes(*(float(v) for v in row[start:start + len(CONTROL)]))


def _timing(rows: np.ndarray, names: Sequence[str], block: int) -> tuple[float, ...]:
    start = _control_start(names) + len(CONTROL)
    workers = (len(names) - start) // 2
    if workers == 0 or len(rows) == 0:
        return ()
    first = start + block * workers
    return tuple(float(v) for v in np.asarray(rows, dtype=np.float64)[:, first:first + workers].sum(axis=0))


def host_seconds(rows: np.ndarray, names: Sequence[str]) -> tuple[float, ...]:
    """A call's reduced rows: each rank's host seconds before the call, summed over its steps (() without a
    timing block: one worker)."""
    return _timing(rows, names, 0)


def stall_seconds(rows: np.ndarray, names: Sequence[str]) -> tuple[float, ...]:
    """A call's reduced rows: each rank's seconds it could not run since its previous call began, summed
    over the call's steps (() with one worker)."""
    return _timing(rows, names, 1)
