"""How many training steps the next compiled call may run (``--steps-per-execution``).

Every call costs the host about a millisecond (argument conversion, the function's
dispatch, reading the packed result, progress, fault hooks). For a model whose steps take
milliseconds that is a large share of each step (measured: 0.67x of the tutorial's loop at
one step per call on recipes/digits_cnn.py); for a model whose steps take a second it is
nothing, while running many steps per call would delay the answer to a stop request by as
many steps. So ``auto`` (the default) sizes calls by time: the chief measures its calls and
proposes as many steps as fit in ``TARGET_CALL_S`` (at least 1, at most ``MAX_AUTO_STEPS``).

The proposal must be the same on every worker (each step of a call is a collective), so
it is not applied locally: it rides the call's packed all-reduce like the stop flag (only
the chief's first replica contributes it, so the SUM is the chief's number), and every
worker reads the agreed value from the call's result. Every attempt starts at one step
per call. Which steps a call holds never changes what is trained: SavePolicy still ends a
call at every save point and epoch end, so results and committed steps are the same for
every size (tests/integration/test_steps_per_execution.py).

A fixed ``N`` proposes ``N`` every time. Pure Python, clock-free (the loop passes the
seconds it measured): tests/runner/training/test_call_size.py.
"""

from __future__ import annotations

import statistics
from collections import deque

from resilient_train.job.config import STEPS_PER_EXECUTION_AUTO as AUTO, check_steps_per_execution

__all__ = ["CallSizer", "MAX_AUTO_STEPS", "TARGET_CALL_S"]

TARGET_CALL_S = 0.1  # host work per call <= ~1% of it; a stop request waits at most ~this long
MAX_AUTO_STEPS = 1000
_WINDOW = 5  # calls whose per-step time is considered (median: one slow call does not swing it)


class CallSizer:
    """``setting``: ``"auto"`` or a fixed number of steps >= 1."""

    def __init__(self, setting: int | str, *, target_s: float = TARGET_CALL_S, max_steps: int = MAX_AUTO_STEPS) -> None:
        check_steps_per_execution(setting)
        self.auto = setting == AUTO
        self.fixed = 0 if self.auto else int(setting)
        self.target_s = target_s
        self.max_steps = max_steps
        self._per_step: deque[float] = deque(maxlen=_WINDOW)
        self._calls = 0

    @property
    def initial(self) -> int:
        """The steps of an attempt's first call (the same on every worker)."""
        return 1 if self.auto else self.fixed

    def observed(self, steps: int, seconds: float, *, traced: bool = False) -> None:
        """The chief's call of ``steps`` steps took ``seconds`` (host wall time, whole call).

        The first call of the process is not counted: it includes tracing the function; nor is
        any call that ``traced`` (a first call of an attempt's new training call).
        """
        self._calls += 1
        if self._calls > 1 and steps > 0 and not traced:
            self._per_step.append(seconds / steps)

    @property
    def step_seconds(self) -> float | None:
        """The chief's measured seconds per step (median of the recent calls; None: none yet)."""
        return statistics.median(self._per_step) if self._per_step else None

    def proposal(self) -> int:
        """The chief's proposal for the next call's maximum steps."""
        if not self.auto:
            return self.fixed
        if not self._per_step:
            return 1
        per_step = statistics.median(self._per_step)
        if per_step <= 0:
            return self.max_steps
        return max(1, min(self.max_steps, int(self.target_s / per_step)))
