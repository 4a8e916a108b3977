"""Where a worker's start-up goes, from its process (or its standby's hand-over) to its first step.

The recovery benchmark (benchmarks/recovery.py) splits a restart's kill -> first step into
phases: the supervisor's share from its own events, the worker's from the ``startup_phases``
event this module builds. Each place in the start-up calls :func:`mark` once with the name of
the phase that just ended (a wall-clock time, so it lines up with events.jsonl's ``ts``); the
first step reports them all as durations, in order, in one event (docs/events.md). The
start is ``assigned`` (a standby read its assignment) or ``created`` (a cold process).

    standby_import (a standby handed over while still importing) the rest of its import, back at
                 normal priority from the assignment on (runner/process/warm_standby.py)
    handover     a warm standby's assignment read -> the worker's main (runner/process/warm_standby.py)
    imports      (a cold worker) the process created -> the worker's main: Python, TensorFlow
    bootstrap    the worker's start-up: credentials, run dir, error file, events, signals
    reach_peers  every peer's TF_CONFIG address answers (waits for the slowest peer)
    recipe_store the recipe loaded, the checkpoint store opened, the Trainer imported
    chief_server (a non-chief) the chief's TensorFlow server answers (cluster/reach.py)
    strategy     MultiWorkerMirroredStrategy and the coordination service's registration barrier
    model_build  seeds, build_model, the optimizer's variables, the checkpoint's object graph
    setup        the step function object, checkpointer, evaluator, callbacks, the epoch input
    fetch        (the chief: old uncommitted checkpoints collected) the newest checkpoint listed
                 and fetched into this worker's cache (host cache or shared storage)
    agree        every worker's newest step, all-reduced (the first collective: its trace too)
    restore      the agreed checkpoint read into the variables (or the fresh start), its state
    input        the epoch's iterator (re-entry at the restored step)
    trace        tracing the training call (its Python body run once by tf.function)
    first_call   the first call after its trace: graph optimization, collectives, the steps

A mark made twice keeps its first time (a retrace does not move ``trace``); ``traces``
counts how often the training call's Python body ran in this process.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["mark", "main_entered", "count_trace", "traces", "report", "reset"]

_marks: dict[str, float] = {}
_traces = 0


def mark(name: str, at: float | None = None) -> None:
    """The phase ``name`` ended now (or at ``at``, seconds since the epoch); the first call wins."""
    _marks.setdefault(name, time.time() if at is None else at)


def main_entered() -> None:
    """The worker's main began: after a standby's ``assigned`` mark, ``handover`` ends; in a
    cold process, ``imports`` ends, counted from the process's creation (``created``)."""
    if "assigned" in _marks:
        mark("handover")
        return
    import psutil

    mark("created", at=psutil.Process().create_time())
    mark("imports")


def count_trace() -> None:
    """The training call's Python body ran (a trace)."""
    global _traces
    _traces += 1


def traces() -> int:
    """How many times the training call traced so far in this process."""
    return _traces


def report() -> dict[str, Any]:
    """``{"phases": {name: seconds, ...}, "total_s": ..., "traces": n}`` for the marks so far, in order."""
    ordered = list(_marks.items())  # the order the start-up reached them (a clock step cannot reorder)
    phases = {name: round(at - ordered[i - 1][1], 3) for i, (name, at) in enumerate(ordered) if i > 0}
    total = round(ordered[-1][1] - ordered[0][1], 3) if ordered else 0.0
    return {"start": ordered[0][0] if ordered else None, "phases": phases, "total_s": total, "traces": _traces}


def reset() -> None:
    """Forget every mark (tests)."""
    global _traces
    _marks.clear()
    _traces = 0
