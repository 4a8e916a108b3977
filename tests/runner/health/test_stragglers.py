"""The straggler detector's statistics (runner/health/stragglers.py): pure logic on a stepped clock."""

from __future__ import annotations

import pytest

from resilient_train.runner.health.stall_probe import StallProbe
from resilient_train.runner.health.stragglers import StragglerDetector, StragglerOptions, slowness, stall_slowness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _feed(detector: StragglerDetector, clock: Clock, per_step_s: list[list[float]], *, steps: int = 10,
          call_s: float = 1.0, start_step: int = 0, total: int = 10_000, stalled: list[float] | None = None) -> list:
    """One call per entry: ``steps`` steps of ``call_s`` wall seconds, each rank's host seconds per step
    before it (a step of 0.1 s: a rank with 0.05 s more host time is busy twice as long as the others);
    ``stalled``: each rank's fraction of every call it could not run (None: not measured)."""
    found, step = [], start_step
    for ranks in per_step_s:
        clock.now += call_s
        step += steps
        stall_s = () if stalled is None else [f * call_s for f in stalled]
        found += detector.observed([s * steps for s in ranks], steps, global_step=step, steps_left=total - step,
                                   stall_s=stall_s)
    return found


def test_slowness_compares_each_rank_with_the_median_of_the_others():
    assert slowness([0.02, 0.01]) == [2.0, 0.5]
    assert slowness([0.01, 0.01, 0.03, 0.01]) == [1.0, 1.0, 3.0, 1.0]
    assert slowness([0.0, 0.0]) == [1.0, 1.0]


SLOW1 = [0.001, 0.051]  # rank 1: 50 ms more host time per 100 ms step: busy 100 ms, rank 0 busy 50 ms


def test_a_rank_slow_for_the_whole_window_is_named_once_with_its_cost():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    # Buckets of 5 s (1 s calls): the first call is start-up (not counted); 3 full buckets end at call 16.
    assert _feed(detector, clock, [SLOW1] * 15) == []
    [straggler] = _feed(detector, clock, [SLOW1], start_step=150)
    assert (straggler.rank, straggler.host, straggler.global_step, straggler.action) == (1, "h1", 160, "warn")
    assert straggler.slower == 2.0
    assert (straggler.busy_ms_per_step, straggler.others_ms_per_step) == (100.0, 50.0)
    # 10 steps per 1 s call: 0.1 s a step, 50 ms of it rank 1's excess: 1/0.05 steps/s without it.
    assert (straggler.steps_per_s, straggler.steps_per_s_without, straggler.steps_per_s_lost) == (10.0, 20.0, 10.0)
    assert (straggler.steps_left, straggler.time_lost_s) == (10_000 - 160, 492.0)
    assert detector.latest_ms == [50.0, 100.0]
    assert _feed(detector, clock, [SLOW1] * 20) == []  # once per attempt


def test_the_chiefs_own_host_work_names_nothing():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=3.0), ["h0", "h1"], clock)
    # The chief's events and progress: 4 times the other rank's host time, 1.5 % of the step.
    assert _feed(detector, clock, [[0.002, 0.0005]] * 40) == []
    assert detector.latest_ms == [100.0, 98.5]


def test_one_even_bucket_in_the_window_names_nothing():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    slow, even = SLOW1, [0.001, 0.001]
    # start-up, then buckets of 5 calls: slow, slow, even, slow, slow: never 3 slow in a row.
    assert _feed(detector, clock, [slow] + [slow] * 10 + [even] * 5 + [slow] * 10) == []
    assert [s.rank for s in _feed(detector, clock, [slow] * 5)] == [1]  # the third slow bucket in a row


def test_below_the_threshold_and_unmeasured_calls_name_nothing():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=3.0), ["h0", "h1", "h2"], clock)
    assert _feed(detector, clock, [[0.001, 0.029, 0.001]] * 40) == []  # 100 ms against 72: 39 % slower
    assert detector.latest_ms == [72.0, 100.0, 72.0]
    assert [s.rank for s in _feed(detector, clock, [[0.001, 0.001, 0.041]] * 4)] == [2]  # 100 against 60


def test_the_first_call_of_an_attempt_is_not_counted():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=3.0), ["h0", "h1"], clock)
    # A huge first call (tracing, first allocations on one rank), then even calls: nothing.
    assert _feed(detector, clock, [[0.001, 5.0]] + [[0.001, 0.001]] * 10) == []


def test_a_call_that_traced_starts_the_bucket_over():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    # Rank 1 slow throughout; two slow buckets, then a call that traced (the replicas' check's
    # variant: 8 s, every rank alike) would make the third bucket even. It is not counted.
    assert _feed(detector, clock, [SLOW1] * 11) == []
    clock.now += 8.0
    assert detector.observed([0.0, 0.0], 1, global_step=111, steps_left=100, traced=True) == []
    assert [s.rank for s in _feed(detector, clock, [SLOW1] * 5, start_step=111)] == [1]
    # Counted, the same trace hides the straggler: the third bucket is nearly even.
    clock = Clock()
    other = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    assert _feed(other, clock, [SLOW1] * 11) == []
    clock.now += 8.0
    assert other.observed([0.0, 0.0], 1, global_step=111, steps_left=100) == []
    assert _feed(other, clock, [SLOW1] * 5, start_step=111) == []  # slow, even, slow: not 3 in a row


@pytest.mark.parametrize("kwargs", [{"threshold": 0}, {"threshold": float("inf")}, {"window_s": -1},
                                    {"threshold": True}])
def test_options_are_validated(kwargs):
    with pytest.raises(ValueError, match="Received"):
        StragglerOptions(**kwargs)


def test_the_slow_fault_sleeps_factor_minus_one_calls_on_its_rank_only(monkeypatch):
    import json

    from resilient_train.runner.failures.faults import FaultPlan
    from resilient_train.runner.health import injection
    from resilient_train.runner.health.injection import Slowdown

    env = {"RT_FAULTS": json.dumps([{"point": "slow", "global_step": 10, "rank": 1, "factor": 3}])}
    slept: list[float] = []
    monkeypatch.setattr(injection.time, "sleep", slept.append)
    slow = Slowdown.from_plan(FaultPlan.from_env(env, rank=1, attempt=1))
    slow.after_call(5, 0.25)  # before step 10: nothing
    slow.after_call(10, 0.25)
    slow.after_call(20, 0.125)  # it lasts: every call after
    assert slept == [0.5, 0.25]
    Slowdown.from_plan(FaultPlan.from_env(env, rank=0, attempt=1)).after_call(20, 1.0)  # another rank: never
    Slowdown.from_plan(FaultPlan.from_env(env, rank=1, attempt=2)).after_call(20, 1.0)  # another attempt: never
    assert slept == [0.5, 0.25]
    with pytest.raises(ValueError, match="factor"):
        Slowdown(0, 0.5)


EVEN = [0.001, 0.001]


def test_stall_slowness_is_the_others_running_share_over_the_ranks():
    assert stall_slowness([0.5, 0.0]) == [2.0, 0.5]
    assert stall_slowness([0.04, 0.52, 0.04]) == [pytest.approx(0.75), pytest.approx(2.0), pytest.approx(0.75)]
    assert stall_slowness([0.0, 1.0]) == [pytest.approx(0.01), pytest.approx(100.0)]  # stopped all along: counted 99 %


def test_a_rank_stalled_half_the_time_is_named_from_its_stall_with_its_cost():
    # A throttled rank (chaos throttle_worker: SIGSTOP 50 ms / SIGCONT 50 ms) is slow inside the
    # compiled step: its host time is the others' (every rank waits alike), its process could not
    # run 52 % of the wall time against the other's 4 %: (1 - 0.04) / (1 - 0.52) = 2 times slower.
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    # Not counted: the first call (start-up), and the next one's stalls (they began in the first).
    assert _feed(detector, clock, [EVEN] * 15, stalled=[0.04, 0.52]) == []
    [straggler] = _feed(detector, clock, [EVEN], start_step=150, stalled=[0.04, 0.52])
    assert (straggler.rank, straggler.host, straggler.global_step, straggler.evidence) == (1, "h1", 160, "stalled")
    assert (straggler.slower, straggler.stalled, straggler.others_stalled) == (2.0, 0.52, 0.04)
    # Busy (or stalled) the whole 100 ms step; at the other's pace it would take 50 ms.
    assert (straggler.busy_ms_per_step, straggler.others_ms_per_step) == (100.0, 50.0)
    assert (straggler.steps_per_s, straggler.steps_per_s_without, straggler.steps_per_s_lost) == (10.0, 20.0, 10.0)
    assert (straggler.steps_left, straggler.time_lost_s) == (10_000 - 160, 492.0)
    assert detector.latest_stalled == [0.04, 0.52]


def test_a_rank_slow_in_its_host_loop_is_still_named_by_its_host_time():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=15.0), ["h0", "h1"], clock)
    [straggler] = _feed(detector, clock, [SLOW1] * 16, stalled=[0.03, 0.05])
    assert (straggler.rank, straggler.evidence, straggler.slower) == (1, "host_time", 2.0)
    assert (straggler.stalled, straggler.others_stalled) == (0.05, 0.03)


def test_stalls_every_rank_shares_or_below_the_threshold_name_nothing():
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=3.0), ["h0", "h1", "h2"], clock)
    # A loaded machine: every rank waits for a CPU alike (clean runs here: 1-13 %).
    assert _feed(detector, clock, [[0.001] * 3] * 40, stalled=[0.2, 0.25, 0.2]) == []
    # One rank stalled 30 % against 4 %: (1 - 0.04) / 0.7 = 1.37 times slower, under 1.5.
    assert _feed(detector, clock, [[0.001] * 3] * 40, stalled=[0.04, 0.04, 0.3]) == []
    # 40 %: 1.6 times slower: named.
    assert [s.rank for s in _feed(detector, clock, [[0.001] * 3] * 4, stalled=[0.04, 0.04, 0.4])] == [2]


def test_the_stall_of_the_call_after_a_restart_is_not_counted():
    # A call's stalled seconds run from the previous call's start: the one after a trace carries the
    # trace's (seconds, on a throttled rank), not the new bucket's. Its host time still counts.
    clock = Clock()
    detector = StragglerDetector(StragglerOptions(threshold=0.5, window_s=6.0), ["h0", "h1"], clock)
    assert _feed(detector, clock, [EVEN], stalled=[0.0, 0.0]) == []  # start-up
    # A 2 s bucket: the call after start-up (stalls 0.9 s, from the first call: not counted), then
    # one whose rank 1 stalled 0.5 s of its 1 s.
    assert _feed(detector, clock, [EVEN], stalled=[0.0, 0.9]) == []
    assert _feed(detector, clock, [EVEN], stalled=[0.0, 0.5]) == []
    assert detector.latest_stalled == [0.0, 0.5]  # 0.5 s of the 1 s counted
    clock.now += 8.0
    assert detector.observed([0.0, 0.0], 1, global_step=1, steps_left=100, traced=True, stall_s=[0.0, 4.0]) == []
    clock.now += 1.0
    assert detector.observed([0.01, 0.01], 10, global_step=11, steps_left=100, stall_s=[0.0, 4.5]) == []
    assert _feed(detector, clock, [EVEN], stalled=[0.0, 0.25]) == []
    assert detector.latest_stalled == [0.0, 0.25]  # the call after the trace was not counted
    assert detector.latest_ms == [100.0, 100.0]  # both calls' host time and wall were


class FakeTime:
    def __init__(self, late: list[float]) -> None:
        self.now, self.late = 0.0, list(late)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late.pop(0)


def test_the_stall_probe_adds_how_late_its_sleeps_wake_and_take_resets_it():
    fake = FakeTime([0.0, 0.045, 0.002, 0.03])
    probe = StallProbe(0.01, clock=fake.clock, sleep=fake.sleep)
    assert [probe.tick() for _ in range(2)] == [0.0, pytest.approx(0.045)]  # stopped for 45 ms of a sleep
    assert probe.take() == pytest.approx(0.045)
    assert probe.take() == 0.0
    probe.tick(), probe.tick()
    assert probe.take() == pytest.approx(0.032)
    with pytest.raises(ValueError, match="Received tick_s=0"):
        StallProbe(0)


def test_the_stall_probe_thread_runs_until_stopped():
    probe = StallProbe(0.001).start()
    probe.stop()
    assert probe._thread is not None
    probe._thread.join(timeout=5)
    assert not probe._thread.is_alive()


def test_a_process_has_one_probe_whatever_its_trainers():
    from resilient_train.runner.health import stall_probe

    assert stall_probe.shared() is stall_probe.shared()
    assert stall_probe.shared()._thread is not None and stall_probe.shared()._thread.is_alive()
