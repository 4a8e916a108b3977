"""A loss spike: a step's loss far above the recent steps' (``--loss-spike K``, off by default).

PaLM and OPT rolled back around loss spikes by hand; here a step whose loss is more than K
median absolute deviations above the median of the last WINDOW healthy steps' losses, and
more than OVER_MAX times the largest of them (a flat or converged loss has a MAD near zero, and
a converged classifier's batch losses vary tenfold: digits_cnn's median 0.010 had healthy
batches at 0.08-0.10), is an anomaly,
acted on like a non-finite step (``--on-anomaly``: rolled back, replayed, skipped when it comes
back). Every worker reads the same reduced loss, so every worker finds the same step. The window
is part of the run's state: every checkpoint carries it (``loss_window`` in its manifest's
extra), so a replay or a resume decides as the uninterrupted run did; no detection before the
window is full (the warm-up), from the run's start.

Off by default: on this project's recipes the per-step loss of small batches is noisy, and a
false positive would roll back, replay and skip a healthy batch (docs/failures.md gives the
figures of the clean runs tried).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["LossSpikes", "Spike", "WINDOW", "OVER_MAX"]

WINDOW = 100  # steps
OVER_MAX = 2.0  # the loss must also exceed twice the window's largest


@dataclass(frozen=True)
class Spike:
    offset: int  # the step's index in the call's rows
    loss: float
    median: float
    threshold: float


class LossSpikes:
    """The recent healthy losses, and the test of a call's losses against them."""

    def __init__(self, k: float, *, window: int = WINDOW) -> None:
        if not k > 0:
            raise ValueError(f"Received k={k!r}; expected a number > 0")
        self.k = k
        self._losses: deque[float] = deque(maxlen=window)

    def check(self, losses: Sequence[float]) -> Spike | None:
        """The first of a call's step losses that spikes (the healthy ones before it join the
        window; after a spike the attempt ends, so what follows it is never added)."""
        for offset, loss in enumerate(losses):
            if len(self._losses) == self._losses.maxlen:
                median = statistics.median(self._losses)
                mad = statistics.median(abs(v - median) for v in self._losses)
                threshold = max(median + self.k * mad, OVER_MAX * max(self._losses))
                if loss > threshold:
                    return Spike(offset=offset, loss=float(loss), median=median, threshold=threshold)
            self._losses.append(float(loss))
        return None

    def to_extra(self) -> dict[str, Any]:
        return {"loss_window": list(self._losses)}

    def load_extra(self, extra: dict[str, Any]) -> None:
        self._losses.clear()
        self._losses.extend(float(v) for v in extra.get("loss_window", []))
