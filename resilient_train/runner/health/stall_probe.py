"""How long this process could not run when it wanted to: the straggler detector's view of a
rank slowed from outside (a CPU quota, a noisy neighbour, a stopped process).

Why not time the compiled step: every rank's step lasts as long as the slowest's (the others
wait in the all-reduce), and ``tf.timestamp`` is refused under op determinism. Why not a short
compute probe (a fixed matmul timed now and then): a CPU quota or a stop/continue duty cycle
takes the CPU away in slices of tens of milliseconds (cgroup ``cpu.cfs_period_us`` is 100 ms),
and a probe sees a slice only when one starts while it runs: at 1 % of the time spent probing it
sees about 1 % of them. Measured (a 0.14 ms numpy probe twice a second in a loop of compute and
short waits, 10 s, 2026-11-29, load 2.5): a 50 ms stop / 50 ms run duty cycle halved the loop's
work and moved the probe's median 0.136 -> 0.171 ms (mean 0.143 -> 0.229); two busy processes on
the machine's 2 cores halved it and moved the median 0.142 -> 0.146 ms.

What is measured instead: a daemon thread sleeps ``tick_s`` (10 ms) again and again and adds up
how late it wakes. A thread that sleeps is woken as soon as the process may run again, so every
slice taken away shows, at a few microseconds of CPU per tick: the same loop's fraction of wall
time spent late was 0.03 clean, 0.48 under the duty cycle, 0.23 beside the two busy processes
(the scheduler favours a waking sleeper, so a CPU shared with a neighbour reads as less than it
costs: 2x slower read as 1.25x). Waiting for the GIL shows too (up to ``sys.getswitchinterval()``,
5 ms, per tick while the main thread runs Python); every rank pays it alike, and the detector
compares each rank with the others' median (runner/health/stragglers.py).

Cost: 0.005 CPU seconds per second (0.5 % of one core; 100 wake-ups a second), and 0.75 % of
the work of a main thread that runs Python all the time (the GIL each wake-up takes); measured
2026-11-29 at load 6-7 (benchmarks/README.md). A 20 ms tick would halve it but read a 50 ms stop
as 40 ms (a sleep is cut short by half a tick on average): too close to the default threshold.

A slower CPU clock (thermal throttling) takes no slice away: it is not seen here (nor in the
host time, unless the host loop is where the time goes).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["StallProbe", "TICK_S", "shared"]

TICK_S = 0.01
_SHARED: "StallProbe | None" = None


class StallProbe:
    """A daemon thread adding up how late its ``tick_s`` sleeps wake; ``take()`` returns the
    seconds since the previous ``take()`` (only whole ticks: a tick under way counts at its end).

    ``clock`` and ``sleep``: injected by tests (``tick()`` then runs one tick in the caller)."""

    def __init__(self, tick_s: float = TICK_S, *, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not 0 < tick_s < 1:
            raise ValueError(f"Received tick_s={tick_s!r}; expected seconds in (0, 1)")
        self.tick_s, self.clock, self.sleep = tick_s, clock, sleep
        self._late = 0.0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StallProbe":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def tick(self) -> float:
        """One sleep of ``tick_s``; adds and returns how late it woke."""
        started = self.clock()
        self.sleep(self.tick_s)
        late = max(0.0, self.clock() - started - self.tick_s)
        with self._lock:
            self._late += late
        return late

    def take(self) -> float:
        """The seconds this process woke late since the previous call (0.0 at first)."""
        with self._lock:
            late, self._late = self._late, 0.0
        return late

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.tick()


def shared() -> StallProbe:
    """This process's one probe, started at first use: a fit script may train several times in one
    process, and each Trainer takes from the same thread (its first call's take is not counted)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = StallProbe().start()
    return _SHARED
