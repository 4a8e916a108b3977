"""This worker's votes in a call's stop and save columns, and the group's stop once agreed.

A stop request (SIGTERM/SIGINT, runner/process/worker_main.py) is this worker's vote in every
call's stop column (control_row.py): the SUM reaches every worker at the same call, so all
stop after it, save it and exit 143 (the trainer's preemption, loop.py). The save column
carries the chief's time-based vote (runner/state/save_policy.py) and any worker's preemption
notice its machine survives (runner/process/preemption_notices.py): the group saves that step
and trains on. Not to be confused with a Keras callback's ``model.stop_training``
(epoch_end.py ``EpochEnd.stopped_early``): the run then completes at the epoch's end.
"""

from __future__ import annotations

from typing import Callable

from resilient_train.rundir.events import emit
from resilient_train.runner.state.save_policy import SavePolicy

__all__ = ["StopVotes"]


class StopVotes:
    """``stop_requested()``: True once this worker was asked to stop; ``save_requested()``: True
    once per notice the machine survives; ``saved()``: the group took an agreed save (the notice
    watch drops a vote that arrives right after one: workers on one node see the same notice,
    not always in the same call)."""

    def __init__(self, rank: int, policy: SavePolicy, *, stop_requested: Callable[[], bool],
                 save_requested: Callable[[], bool], saved: Callable[[], None],
                 source: Callable[[], str | None] = lambda: None) -> None:
        """``source()``: what asked this worker to stop when not a signal (``preemption_requested``'s
        ``source``, e.g. ``notice:suspect-hardware``), else None."""
        self._rank, self.policy, self._source = rank, policy, source  # (the loop reads its save points)
        self._stop_requested, self._save_requested, self._saved = stop_requested, save_requested, saved
        self.requested = False  # this worker's request was seen (preemption_requested is said once)
        # The group agreed to stop: some worker's request reached the all-reduce, so every
        # worker stops after the same call, saves it (flushed) and returns None (exit 143).
        self.agreed = False

    def stop(self, ends: int) -> float:
        """This worker's vote in the call's stop column: 1.0 once it was asked to stop. ``ends``: the
        global step the call ends at: the group's agreed stop, and its save, when this is the first
        vote (``preemption_requested``'s ``global_step``)."""
        if not self._stop_requested():
            return 0.0
        if not self.requested:
            self.requested = True
            emit("preemption_requested", source=self._source() or f"worker:{self._rank}",  # else SIGTERM/SIGINT
                 global_step=ends)
        return 1.0

    def save(self) -> float:
        """This worker's vote in the call's save column: the chief's clock, or a surviving notice."""
        return max(self.policy.time_flag(), float(self._save_requested()))

    def saved(self) -> None:
        """The group took an agreed save: the time-based save counts from it, and the notice
        watch drops a vote that arrives right after it."""
        self.policy.saved()
        self._saved()
