"""A slow worker (a straggler): find it from the ranks' own busy times, name it, say what it costs.

Under MultiWorkerMirroredStrategy every step waits for the slowest worker, so the step time is
the same on every rank; what differs is the time each rank is busy before it enters the
collective against the time it waits in it. Every step's packed row carries each rank's host
seconds before the call (its loop since the previous call's result), one column per rank
(runner/training/control_row.py, the timing block): after each call every worker knows every
rank's, with no collective of its own. This module is the pure logic fed with them, call by
call (runner/training/progress.py).

Busy and wait, per step: the calls start together once the last rank enters them, so a rank
whose host time is ``g`` waits ``max(g) - g`` in the call for the last one; its busy time is
the step's wall time (the host's clock) minus that wait. A rank slow in its host loop (a slow
host, a CPU quota on the Python side, RT_FAULTS ``slow``) is busy the whole step, the others
less by its excess. A rank slow inside the compiled step is not seen: the graph is not timed
(``tf.timestamp`` is refused under op determinism), and there every rank waits alike.

The statistic: calls are summed into buckets of ``window_s / BUCKETS`` seconds of the host's
clock; at a bucket's end each rank's busy seconds per step is compared with the median of the
OTHER ranks' (with two workers, the other one: a median of two would halve every difference).
A rank more than ``threshold`` slower (0.5: 50 % slower) in each of the last ``BUCKETS``
buckets, ``window_s`` in all, is a straggler, named once per attempt. One slow bucket (a
neighbour's burst on a shared machine, a save) names nothing. An attempt's first call
(tracing, first allocations, the peers' start-up) is not counted, nor is a later call that
traced (until 2026-11-29 the first call checked for replicas that differ traced a variant of its
own, seconds on a busy machine: the suite's run under load lost its window to it).

The cost model: a step lasts about as long as its slowest rank is busy, plus the all-reduce;
without the straggler a step would be shorter by its excess busy seconds per step over the
others' median: the group's steps/s without it, and, over the steps left, the time it costs
the run.

Policy: ``warn`` (``straggler_detected``, a console line, a summary.json entry). Moving the
group off the slow rank (``replace``) is issue 49's next slice.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["BUCKETS", "Straggler", "StragglerDetector", "StragglerOptions", "slowness"]

BUCKETS = 3  # consecutive slow buckets that make a window
WARN = "warn"


@dataclass(frozen=True)
class StragglerOptions:
    """``threshold``: how much slower than the others' median (0.5: 50 %); ``window_s``: for how long."""

    threshold: float = 0.5
    window_s: float = 20.0

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not 0 < self.threshold < float("inf"):
            raise ValueError(f"Received threshold={self.threshold!r}; expected a number > 0 (0.5: 50 % slower)")
        if isinstance(self.window_s, bool) or not 0 < self.window_s < float("inf"):
            raise ValueError(f"Received window_s={self.window_s!r}; expected seconds > 0")


@dataclass(frozen=True)
class Straggler:
    """One named slow rank: ``straggler_detected``'s fields (docs/events.md)."""

    rank: int
    host: str
    global_step: int
    slower: float  # its busy seconds per step over the others' median (2.0: twice as slow)
    busy_ms_per_step: float
    others_ms_per_step: float  # the other ranks' median
    window_s: float
    steps_per_s: float  # the group's, over the window
    steps_per_s_without: float  # estimated, were the rank as busy as the others' median
    steps_per_s_lost: float
    steps_left: int
    time_lost_s: float  # its excess per step over the steps left: what it costs to the end of the run
    action: str = WARN

    def fields(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Bucket:
    started: float
    steps: int = 0
    host_s: list[float] = field(default_factory=list)


class StragglerDetector:
    """Fed each call's per-rank host seconds, returns the ranks newly named.

    ``hosts``: rank -> host, for the event. ``clock``: the host's monotonic clock (injected:
    tests step it). ``latest_ms``: each rank's busy ms per step in the last full bucket
    (``train_progress``'s ``busy_ms_per_step``).
    """

    def __init__(self, options: StragglerOptions, hosts: Sequence[str], clock: Callable[[], float]) -> None:
        self.options = options
        self.hosts = list(hosts)
        self.clock = clock
        self.bucket_s = options.window_s / BUCKETS
        self._bucket: _Bucket | None = None  # None until the attempt's first call ended
        self._per_step: list[list[float]] = []  # the last BUCKETS full buckets: each rank's busy s per step
        self._walls: list[float] = []  # ... and their wall seconds per step
        self.named: set[int] = set()
        self.latest_ms: list[float] | None = None

    def observed(self, host_s: Sequence[float], steps: int, *, global_step: int, steps_left: int,
                 traced: bool = False) -> list[Straggler]:
        """One call's ``host_s`` (per rank: its host seconds before the call), at the call's end.
        ``traced``: the call traced the step (seconds on a busy machine, every rank alike): like
        the attempt's first call, the bucket starts over."""
        now = self.clock()
        if self._bucket is None or traced:  # start-up (a first call, a trace), not the run's pace
            self._bucket = _Bucket(started=now)
            return []
        if len(host_s) < 2 or steps <= 0:
            return []  # one worker
        bucket = self._bucket
        bucket.steps += steps
        bucket.host_s = [a + b for a, b in zip(bucket.host_s, host_s)] if bucket.host_s else list(host_s)
        if now - bucket.started < self.bucket_s:
            return []
        wall = (now - bucket.started) / bucket.steps
        last_in = max(bucket.host_s) / bucket.steps
        per_step = [max(0.0, wall - (last_in - h / bucket.steps)) for h in bucket.host_s]  # the wall minus the wait
        self._per_step = (self._per_step + [per_step])[-BUCKETS:]
        self._walls = (self._walls + [wall])[-BUCKETS:]
        self.latest_ms = [round(1000 * s, 3) for s in per_step]
        self._bucket = _Bucket(started=now)
        if len(self._per_step) < BUCKETS:
            return []
        found = []
        ratios = [slowness(b) for b in self._per_step]
        for rank in range(len(per_step)):
            if rank not in self.named and all(r[rank] > 1 + self.options.threshold for r in ratios):
                self.named.add(rank)
                found.append(self._cost(rank, global_step=global_step, steps_left=steps_left))
        return found

    def _cost(self, rank: int, *, global_step: int, steps_left: int) -> Straggler:
        own = statistics.fmean(b[rank] for b in self._per_step)
        others = statistics.fmean(_others_median(b, rank) for b in self._per_step)
        step_s = statistics.fmean(self._walls)
        excess = max(0.0, own - others)
        without = max(step_s - excess, 1e-9)
        return Straggler(
            rank=rank, host=self.hosts[rank] if rank < len(self.hosts) else "?", global_step=global_step,
            slower=round(own / others, 2) if others > 0 else float("inf"),
            busy_ms_per_step=round(1000 * own, 3), others_ms_per_step=round(1000 * others, 3),
            window_s=self.options.window_s, steps_per_s=round(1 / step_s, 2),
            steps_per_s_without=round(1 / without, 2), steps_per_s_lost=round(1 / without - 1 / step_s, 2),
            steps_left=steps_left, time_lost_s=round(excess * steps_left, 1))


def _others_median(values: Sequence[float], rank: int) -> float:
    return statistics.median([v for k, v in enumerate(values) if k != rank])


def slowness(per_step: Sequence[float]) -> list[float]:
    """Each rank's busy time per step over the median of the other ranks' (inf when theirs is 0)."""
    out = []
    for rank, own in enumerate(per_step):
        others = _others_median(per_step, rank)
        out.append(own / others if others > 0 else (float("inf") if own > 0 else 1.0))
    return out
