"""What a run reports while it trains: ``first_step`` once per attempt (the recovery
benchmark's "training again" moment, with the start-up phases), then ``train_progress``
at most every ``--progress-every-s`` (the console's percentage and ETA, and with several workers
each rank's busy ms per step); ``straggler_detected`` when a rank stays slow
(runner/health/stragglers.py), with the chief's decision on it (``--straggler-policy``,
runner/health/straggler_replace.py), which it then acts on: a ``replace`` asks for the stop that
the next call's row carries."""

from __future__ import annotations

from typing import Callable, Sequence

from resilient_train.rundir.events import emit
from resilient_train.runner.health.straggler_replace import StragglerReplacement
from resilient_train.runner.health.stragglers import REPLACE, StragglerDetector
from resilient_train.runner.process import startup_phases

__all__ = ["Progress"]


class Progress:
    """``first_step`` once per attempt, then ``train_progress`` at most every ``every_s``
    (with ``epochs``, the planned total: the console's percentage and ETA, a fit script's too)."""

    def __init__(self, every_s: float, steps_per_epoch: int, epochs: int, clock: Callable[[], float],
                 stragglers: StragglerDetector | None = None, replacement: StragglerReplacement | None = None) -> None:
        """``replacement``: the chief's straggler policy (None on the other workers: their events stay in
        their logs, and the chief's decision is the group's)."""
        self.stragglers = stragglers
        self.replacement = replacement
        self.every_s = every_s
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.clock = clock
        self.first_pending = True
        self.last = self.window_start = clock()
        self.window_steps = 0

    def advanced(self, steps: int, *, epoch: int, step_in_epoch: int, global_step: int, means: dict[str, float],
                 steps_per_call: int, host_s: Sequence[float] = (), stall_s: Sequence[float] = (),
                 traced: bool = False) -> None:
        if self.first_pending:  # the recovery benchmark's "training again" moment
            self.first_pending = False
            emit("first_step", group=True, global_step=global_step)
            # Every rank's: the chief's strategy/agree phases wait for the slowest peer's own start-up.
            emit("startup_phases", global_step=global_step, **startup_phases.report())
        self.window_steps += steps
        if self.stragglers is not None:
            for straggler in self.stragglers.observed(
                    host_s, steps, global_step=global_step, traced=traced, stall_s=stall_s,
                    steps_left=max(0, self.epochs * self.steps_per_epoch - global_step)):
                replacement = self.replacement
                decision = replacement.decide(straggler) if replacement is not None else None
                emit("straggler_detected", group=True,
                     **{**straggler.fields(), **(decision.fields() if decision is not None else {})})
                if replacement is not None and decision is not None and decision.action == REPLACE:
                    replacement.replace(straggler, decision)
        now = self.clock()
        if now - self.last < self.every_s:
            return
        emit(
            "train_progress",
            group=True,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            steps_per_epoch=self.steps_per_epoch,
            epochs=self.epochs,
            global_step=global_step,
            steps_per_s=round(self.window_steps / max(now - self.window_start, 1e-9), 2),
            steps_per_call=steps_per_call,
            **({"busy_ms_per_step": self.stragglers.latest_ms}
               if self.stragglers is not None and self.stragglers.latest_ms is not None else {}),
            **({"stalled": self.stragglers.latest_stalled}
               if self.stragglers is not None and self.stragglers.latest_stalled is not None else {}),
            **{k: round(v, 6) for k, v in means.items()},
        )
        self.last = self.window_start = now
        self.window_steps = 0
