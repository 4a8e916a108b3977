"""A slow worker (a straggler): find it from the ranks' own busy and stalled times, name it, say what
it costs.

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
less by its excess. A rank slow inside the compiled step is not seen that way: the graph is not
timed (``tf.timestamp`` is refused under op determinism), and there every rank waits alike.

Stalled, per step: a rank slowed from outside (a CPU quota, a noisy neighbour, a stop/continue
duty cycle: chaos op ``throttle_worker``) loses CPU in the compiled step too, where host time does
not see it. Each rank's stall probe (runner/health/stall_probe.py: a daemon thread's summed lateness
waking from 10 ms sleeps) gives the seconds its process could not run, in the same timing block;
its fraction ``f`` of a bucket's wall time makes it ``(1 - f_others) / (1 - f)`` times slower than
the others' median ``f_others`` (it runs ``1 - f`` of the time). A rank's slowness is the larger
of its busy-time ratio and this one. Named by the stall, its ``busy_ms_per_step`` is the step's
wall time (busy or stalled the whole step) and ``others_ms_per_step`` that over its slowness.
What the probe cannot see (a slower CPU clock; a neighbour sharing the CPU reads as less than it
costs: stall_probe.py) stays unseen.

The statistic: calls are summed into buckets of ``window_s / BUCKETS`` seconds of the host's
clock; at a bucket's end each rank's busy seconds per step is compared with the median of the
OTHER ranks' (with two workers, the other one: a median of two would halve every difference).
A rank more than ``threshold`` slower (0.5: 50 % slower) in each of the last ``BUCKETS``
buckets, ``window_s`` in all, is a straggler, named once per attempt. One slow bucket (a
neighbour's burst on a shared machine, a save) names nothing. An attempt's first call
(tracing, first allocations, the peers' start-up) is not counted, nor is a later call that
traced (until 2026-11-29 the first call checked for replicas that differ traced a variant of its
own, seconds on a busy machine: the suite's run under load lost its window to it); the stalls of
the call after either are not counted (they began with theirs), nor its wall time in the stalled
fraction.

The cost model: a step lasts about as long as its slowest rank is busy, plus the all-reduce;
without the straggler a step would be shorter by its excess busy seconds per step over the
others' median: the group's steps/s without it, and, over the steps left, the time it costs
the run.

Measured (2026-11-29, load 5.6-14, benchmarks/stragglers.py): clean 2-worker digits_cnn runs on
the 2-core machine stalled 2-12 % of a bucket on every rank; a rank under a 50 ms stop / 50 ms run
duty cycle (chaos ``throttle-worker``) 45-51 %, named 1.8-1.9x slower 20.1 s after the throttle
began with the default 20 s window (5 of 5 runs; 23-25 s in 10 runs while a second trace cut the
window); 8 clean runs named nothing.

Policy (``--straggler-policy``): ``warn`` (the default: ``straggler_detected``, a console line, a
summary.json entry) or ``replace``. :func:`decide_replace` is the decision, pure: replace when the
time the rank costs to the end of the run (``time_lost_s``, the gain) exceeds a restart's cost
(the median of this run's own restarts, measured from its events: rundir/time_account.py
``restart_costs``; none yet: :data:`RESTART_COST_ESTIMATE_S`), and the rank was not acted on less
than ``--straggler-cooldown`` ago. What it then does (an agreed save, a restart off the host) is
runner/health/straggler_replace.py's. Start-up and epoch ends are outside the decision by
construction: it is taken between training calls only, after a whole window that counts neither an
attempt's first call nor a call that traced, and the stop it asks for rides the next training call's row, so the
group never stops inside an epoch end's evaluation (a decision at an epoch's last call stops after
the next epoch's first call).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from resilient_train.job.config import STRAGGLER_REPLACE, STRAGGLER_WARN

__all__ = ["BUCKETS", "HOST_TIME", "RESTART_COST_ESTIMATE_S", "ReplaceDecision", "STALLED", "Straggler",
           "StragglerDetector", "StragglerOptions", "decide_replace", "slowness", "stall_slowness"]

BUCKETS = 3  # consecutive slow buckets that make a window
WARN = STRAGGLER_WARN
REPLACE = STRAGGLER_REPLACE
# A restart's cost when the run has not measured one of its own yet (an agreed save, the workers'
# exit, a new attempt's start-up, restore, trace and first call). Measured on the 2-core machine
# (2026-11-27..29, load 4-9): a kill to the next first step took 2.3-2.9 s with warm standbys
# (docs/checkpointing.md, "Fast recovery"), an agreed save about 0.5 s; 10 s leaves room for a cold
# start without standbys and for launchers that place a group more slowly (Ray, Slurm).
RESTART_COST_ESTIMATE_S = 10.0
MEASURED = "measured"
ESTIMATE = "estimate"
HOST_TIME = "host_time"
STALLED = "stalled"
MAX_STALLED = 0.99  # a fraction of wall time stalled counted at most (a rank stopped for a whole bucket)


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
    evidence: str  # HOST_TIME: its busy time before the call; STALLED: the time its process could not run
    stalled: float  # the fraction of the window's wall time its process could not run
    others_stalled: float  # ... the other ranks' median
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
    stall_s: list[float] = field(default_factory=list)
    unstalled_s: float = 0.0  # wall seconds whose stalls are not counted (the call after a restart)


class StragglerDetector:
    """Fed each call's per-rank host seconds, returns the ranks newly named.

    ``hosts``: rank -> host, for the event. ``clock``: the host's monotonic clock (injected:
    tests step it). ``latest_ms``: each rank's busy ms per step in the last full bucket
    (``train_progress``'s ``busy_ms_per_step``); ``latest_stalled``: each rank's stalled fraction of
    it (``train_progress``'s ``stalled``).
    """

    def __init__(self, options: StragglerOptions, hosts: Sequence[str], clock: Callable[[], float]) -> None:
        self.options = options
        self.hosts = list(hosts)
        self.clock = clock
        self.bucket_s = options.window_s / BUCKETS
        self._bucket: _Bucket | None = None  # None until the attempt's first call ended
        self._per_step: list[list[float]] = []  # the last BUCKETS full buckets: each rank's busy s per step
        self._walls: list[float] = []  # ... and their wall seconds per step
        self._stalled: list[list[float]] = []  # ... and each rank's stalled fraction of their wall time
        self.named: set[int] = set()
        self.latest_ms: list[float] | None = None
        self.latest_stalled: list[float] | None = None
        self._stall_lags = False

    def observed(self, host_s: Sequence[float], steps: int, *, global_step: int, steps_left: int,
                 traced: bool = False, stall_s: Sequence[float] = ()) -> list[Straggler]:
        """One call's ``host_s`` (per rank: its host seconds before the call) and ``stall_s`` (per rank:
        the seconds it could not run since its previous call began; () : none measured), at the call's end.
        ``traced``: the call traced the step (seconds on a busy machine, every rank alike): like
        the attempt's first call, the bucket starts over."""
        now = self.clock()
        if self._bucket is None or traced:  # start-up (a first call, a trace), not the run's pace
            self._bucket = _Bucket(started=now)
            self._stall_lags = True
            return []
        # A call's stalled seconds run from the previous call's start: the call after a first call
        # or a trace carries some of theirs (seconds, on a throttled rank), so its stalls and its
        # wall time are left out of the bucket's stalled fraction (its host time counts).
        lagging, self._stall_lags = self._stall_lags, False
        if len(host_s) < 2 or steps <= 0:
            return []  # one worker
        bucket = self._bucket
        bucket.steps += steps
        bucket.host_s = [a + b for a, b in zip(bucket.host_s, host_s)] if bucket.host_s else list(host_s)
        stall = list(stall_s) if len(stall_s) == len(host_s) and not lagging else [0.0] * len(host_s)
        if lagging:
            bucket.unstalled_s += now - bucket.started  # the bucket's first call
        bucket.stall_s = [a + b for a, b in zip(bucket.stall_s, stall)] if bucket.stall_s else stall
        if now - bucket.started < self.bucket_s:
            return []
        wall = (now - bucket.started) / bucket.steps
        stall_wall = now - bucket.started - bucket.unstalled_s
        stalled = [min(MAX_STALLED, max(0.0, s / stall_wall)) if stall_wall > 0 else 0.0 for s in bucket.stall_s]
        last_in = max(bucket.host_s) / bucket.steps
        per_step = [max(0.0, wall - (last_in - h / bucket.steps)) for h in bucket.host_s]  # the wall minus the wait
        self._per_step = (self._per_step + [per_step])[-BUCKETS:]
        self._walls = (self._walls + [wall])[-BUCKETS:]
        self._stalled = (self._stalled + [stalled])[-BUCKETS:]
        self.latest_ms = [round(1000 * s, 3) for s in per_step]
        self.latest_stalled = [round(f, 3) for f in stalled]
        self._bucket = _Bucket(started=now)
        if len(self._per_step) < BUCKETS:
            return []
        found = []
        ratios = [[max(by_busy, by_stall) for by_busy, by_stall in zip(slowness(b), stall_slowness(f))]
                  for b, f in zip(self._per_step, self._stalled)]
        for rank in range(len(per_step)):
            if rank not in self.named and all(r[rank] > 1 + self.options.threshold for r in ratios):
                self.named.add(rank)
                found.append(self._cost(rank, global_step=global_step, steps_left=steps_left))
        return found

    def _cost(self, rank: int, *, global_step: int, steps_left: int) -> Straggler:
        own = statistics.fmean(b[rank] for b in self._per_step)
        others = statistics.fmean(_others_median(b, rank) for b in self._per_step)
        step_s = statistics.fmean(self._walls)
        by_stall = statistics.fmean(stall_slowness(f)[rank] for f in self._stalled)
        evidence = HOST_TIME
        if others > 0 and by_stall > own / others:  # slowed from outside, in the compiled step too
            evidence, own, others = STALLED, step_s, step_s / by_stall
        excess = max(0.0, own - others)
        without = max(step_s - excess, 1e-9)
        return Straggler(
            rank=rank, host=self.hosts[rank] if rank < len(self.hosts) else "?", global_step=global_step,
            slower=round(own / others, 2) if others > 0 else float("inf"), evidence=evidence,
            stalled=round(statistics.fmean(f[rank] for f in self._stalled), 3),
            others_stalled=round(statistics.fmean(_others_median(f, rank) for f in self._stalled), 3),
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


def stall_slowness(stalled: Sequence[float]) -> list[float]:
    """Each rank's slowness from the fractions of wall time the ranks could not run: it runs ``1 - f`` of
    the time, the others' median ``1 - f_others``, so it is ``(1 - f_others) / (1 - f)`` times slower."""
    clipped = [min(MAX_STALLED, f) for f in stalled]
    return [(1 - _others_median(clipped, rank)) / (1 - f) for rank, f in enumerate(clipped)]


@dataclass(frozen=True)
class ReplaceDecision:
    """What ``--straggler-policy`` does about one named straggler: ``straggler_detected``'s decision
    fields (docs/events.md)."""

    action: str  # WARN: training goes on; REPLACE: an agreed save and a restart off the rank's host
    reason: str  # why, in a clause the console shows
    gain_s: float  # the rank's cost to the end of the run: what replacing it would win back
    restart_cost_s: float
    restart_cost_from: str  # MEASURED: the median of this run's restarts; ESTIMATE: RESTART_COST_ESTIMATE_S
    steps_left: int

    def fields(self) -> dict[str, Any]:
        return asdict(self)


def decide_replace(straggler: Straggler, *, policy: str, restart_costs: Sequence[float], cooldown_s: float,
                   since_acted_s: float | None, busy_with: int | None = None) -> ReplaceDecision:
    """The decision on ``straggler`` (pure). ``restart_costs``: this run's measured restarts, in
    seconds (none: the estimate); ``since_acted_s``: seconds since this rank was last replaced in
    this run (None: never); ``busy_with``: a rank this attempt already replaces (one at a time)."""
    measured = [c for c in restart_costs if c >= 0]
    cost = round(statistics.median(measured), 1) if measured else RESTART_COST_ESTIMATE_S
    source = MEASURED if measured else ESTIMATE
    gain = straggler.time_lost_s

    def decided(action: str, reason: str) -> ReplaceDecision:
        return ReplaceDecision(action=action, reason=reason, gain_s=gain, restart_cost_s=cost,
                               restart_cost_from=source, steps_left=straggler.steps_left)

    cost_text = f"{cost:g} s, {'measured in this run' if measured else 'estimated'}"
    if policy != REPLACE:
        return decided(WARN, f"--straggler-policy {policy}")
    if busy_with is not None:
        return decided(WARN, f"the group is already restarting to replace rank {busy_with}")
    if since_acted_s is not None and since_acted_s < cooldown_s:
        return decided(WARN, f"rank {straggler.rank} was replaced {since_acted_s:.0f} s ago "
                             f"(--straggler-cooldown {cooldown_s:g} s)")
    if not gain > cost:
        return decided(WARN, f"its cost to the end of the run ({gain:g} s) does not exceed a restart's ({cost_text})")
    return decided(REPLACE, f"its cost to the end of the run ({gain:g} s) exceeds a restart's ({cost_text})")
