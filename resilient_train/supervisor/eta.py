"""The progress display's steps/s and ETA: measured on the steady part of an attempt only.

An attempt's first call traces the training function, and before it the workers started,
met, restored and built their input; the first ``train_progress`` window holds all of it.
The calls just after it are slow too: one step per call until the call size is measured
(runner/training/call_size.py does not count the first call, so the second is one step as well).
At 50 steps/s a window of 1 step in 2.5 s makes an ETA 100x too long (issue 51: ``step
2/300  0% ETA 12m25s`` on a run that finished 5 s later). So no event's own ``steps_per_s``
feeds the ETA: :class:`SteadyRate` measures global steps over the events' clock from the
first progress event *after* the attempt's first finished call (its ``first_step`` event,
else its first ``train_progress``), over at most the last :data:`RATE_WINDOW_S` seconds,
and gives a rate, hence an ETA, only once that measurement spans :data:`MIN_STEADY_S`
seconds and :data:`MIN_STEADY_EVENTS` progress events. A new attempt (a restart, a
restore, a step that went back) starts it over.

Pure: the caller passes each event's time (its ``ts``), so tests drive it with any clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["SteadyRate", "RATE_WINDOW_S", "MIN_STEADY_S", "MIN_STEADY_EVENTS", "eta_seconds"]

RATE_WINDOW_S = 60.0  # the rate covers at most this many recent seconds, so it follows a change of speed
MIN_STEADY_S = 3.0  # no rate before this many seconds of training after the attempt's first call
MIN_STEADY_EVENTS = 3  # ... nor before this many progress events after it


@dataclass(frozen=True)
class _Sample:
    at: float  # seconds (the event's clock)
    global_step: int


class SteadyRate:
    """Steps per second of the current attempt, measured after its first call.

    ``started(attempt, global_step, at)``: the attempt's first call finished (``first_step``);
    ``progress(attempt, global_step, at)``: a ``train_progress`` event; ``restart()``: a
    restore or fresh start, the next attempt's events follow. ``steps_per_s`` is None until
    the measurement is steady.
    """

    def __init__(self, *, window_s: float = RATE_WINDOW_S, min_s: float = MIN_STEADY_S,
                 min_events: int = MIN_STEADY_EVENTS) -> None:
        if not window_s >= min_s >= 0:
            raise ValueError(f"Received window_s={window_s!r}, min_s={min_s!r}; expected window_s >= min_s >= 0")
        if min_events < 1:
            raise ValueError(f"Received min_events={min_events!r}; expected >= 1")
        self.window_s, self.min_s, self.min_events = window_s, min_s, min_events
        self.restart()

    def restart(self) -> None:
        """Forget the attempt: its next event is the new attempt's first call."""
        self._attempt: int | None = None
        self._first_call: _Sample | None = None  # where the attempt's first call ended
        self._anchor: _Sample | None = None  # where the measurement starts: the next progress event
        self._samples: deque[_Sample] = deque()
        self._events = 0  # progress events after the anchor

    def started(self, attempt: int | None, global_step: int, at: float) -> None:
        """The attempt's first call finished at ``at`` with ``global_step``."""
        self.restart()
        self._attempt, self._first_call = attempt, _Sample(at, global_step)

    def progress(self, attempt: int | None, global_step: int, at: float) -> None:
        """A progress event of ``attempt`` at ``at``."""
        last = self._samples[-1] if self._samples else self._first_call
        if last is not None and (attempt != self._attempt or global_step < last.global_step):
            self.restart()  # another attempt's events, or a restore's step: missed the restart
            last = None
        sample = _Sample(at, global_step)
        if last is None:  # the attempt's first event (no first_step seen): its window held the first call
            self._attempt, self._first_call = attempt, sample
            return
        if at <= last.at or global_step == last.global_step:
            return  # the same call as the last sample (first_step and a progress event of one call)
        if self._anchor is None:
            self._anchor = sample
            self._samples = deque([sample])
            return
        self._samples.append(sample)
        self._events += 1
        while len(self._samples) > 2 and self._samples[1].at <= at - self.window_s:
            self._samples.popleft()

    @property
    def steps_per_s(self) -> float | None:
        """The steady rate, or None while the attempt's measurement is too short."""
        if self._anchor is None or self._events < self.min_events:
            return None
        first, last = self._samples[0], self._samples[-1]
        if last.at - self._anchor.at < self.min_s or last.at <= first.at:
            return None
        return (last.global_step - first.global_step) / (last.at - first.at)


def eta_seconds(*, global_step: int, total_steps: int | None, steps_per_s: float | None) -> float | None:
    """Seconds to ``total_steps`` at ``steps_per_s``; None when either is unknown (or the rate is 0)."""
    if not total_steps or not steps_per_s or steps_per_s <= 0:
        return None
    return max(total_steps - global_step, 0) / steps_per_s
