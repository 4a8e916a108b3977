"""When the training loop saves, and how long each compiled call may run.

The loop runs up to ``--steps-per-execution`` steps per ``tf.function`` call and looks at
the world (stop requests, save flags, progress, faults) only between calls. So a call
must END at every step where a save is due by step count, and at the epoch end: then the
set of committed steps, exact resume and zero-lost-step preemption are the same for every
N. ``SavePolicy`` says where those boundaries are (``call_length``) and whether the step a
call ended on is saved (``save_after``); it never saves anything itself (that is the
Checkpointer's job, runner/state/checkpointing.py).

Time-based saves (``--save-every-seconds``) are decided on the chief's clock only; the
chief's flag rides the call's packed all-reduce, so all workers save after the same call.
Pure Python (no TensorFlow), clock injectable: tests/runner/state/test_save_policy.py.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["SavePolicy"]


class SavePolicy:
    """Save every ``every_steps`` global steps (0: never by count), every ``every_seconds``
    seconds of the chief's clock (None: never by time), and at every epoch end."""

    def __init__(
        self,
        *,
        every_steps: int,
        every_seconds: float | None,
        is_chief: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 0:
            raise ValueError(f"Received every_steps={every_steps!r}; expected an integer >= 0")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"Received every_seconds={every_seconds!r}; expected a number > 0 or None")
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.is_chief = is_chief
        self.clock = clock  # (the progress reports read the same clock)
        self._last_save = clock()

    def call_length(self, *, global_step: int, step_in_epoch: int, steps_per_epoch: int, max_steps: int) -> int:
        """Steps the next call runs: at most ``max_steps``, never past the epoch end or the
        next step-count save point. Always >= 1 while the epoch has steps left."""
        length = min(max_steps, steps_per_epoch - step_in_epoch)
        if self.every_steps:
            length = min(length, self.every_steps - global_step % self.every_steps)
        if length < 1:
            raise ValueError(
                f"Received step_in_epoch={step_in_epoch} with steps_per_epoch={steps_per_epoch}, "
                f"max_steps={max_steps}; expected a step left in the epoch and max_steps >= 1"
            )
        return length

    def counts_to(self, global_step: int) -> bool:
        """Is ``global_step`` a step-count save point (``--save-every-steps``)? Known before
        the call that reaches it, unlike a time-based save (agreed in that call)."""
        return bool(self.every_steps) and global_step % self.every_steps == 0

    def time_flag(self) -> float:
        """This worker's vote for a time-based save after the next call (1.0 or 0.0)."""
        if self.every_seconds is None or not self.is_chief:
            return 0.0
        return 1.0 if self.clock() - self._last_save >= self.every_seconds else 0.0

    def save_after(self, *, global_step: int, step_in_epoch: int, steps_per_epoch: int, agreed_time_flag: bool) -> bool:
        """Whether to save mid-epoch after a call that ended on ``global_step``.

        The epoch end is not a mid-epoch save: the loop always saves there.
        """
        if step_in_epoch >= steps_per_epoch:
            return False
        return self.counts_to(global_step) or agreed_time_flag

    def saved(self) -> None:
        """A save happened (of any kind): the time-based interval starts again."""
        self._last_save = self.clock()
