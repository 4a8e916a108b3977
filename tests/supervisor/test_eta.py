"""The progress display's steady rate (supervisor/eta.py): no rate from an attempt's first
call nor the window after it, none until a few seconds were measured, a restart starts over
(fake clock: the times are passed in)."""

import pytest

from resilient_train.supervisor.eta import MIN_STEADY_EVENTS, MIN_STEADY_S, SteadyRate, eta_seconds


def test_the_first_call_and_the_window_after_it_are_left_out():
    rate = SteadyRate()
    # The first call ran 1 step in 10 s (tracing): first_step and the first progress event at t=10;
    # the calls up to the next event are one step each (20 steps in 1 s).
    rate.started(1, 1, 10.0)
    rate.progress(1, 1, 10.0)
    rate.progress(1, 21, 11.0)  # the measurement starts here
    assert rate.steps_per_s is None
    rate.progress(1, 71, 12.0)
    rate.progress(1, 121, 13.0)
    assert rate.steps_per_s is None  # 2 events, 2 s: not yet
    rate.progress(1, 171, 14.0)
    assert rate.steps_per_s == 50.0  # (171 - 21) / (14 - 11)
    assert (MIN_STEADY_S, MIN_STEADY_EVENTS) == (3.0, 3)


def test_without_first_step_the_attempts_first_progress_event_is_its_first_call():
    rate = SteadyRate()
    for step, at in ((1, 10.0), (21, 11.0), (71, 12.0), (121, 13.0), (171, 14.0)):
        rate.progress(1, step, at)
    assert rate.steps_per_s == 50.0


def test_a_slow_second_call_does_not_make_an_eta_fifty_times_too_long():
    # Issue 51: "step 2/300  0%  ETA 12m25s" on a run that finished 5-10 s later: the
    # second call took 2.5 s for its one step. No rate comes from it.
    rate = SteadyRate()
    rate.started(1, 1, 5.0)
    rate.progress(1, 1, 5.0)
    rate.progress(1, 2, 7.5)
    assert rate.steps_per_s is None and eta_seconds(global_step=2, total_steps=300, steps_per_s=rate.steps_per_s) is None
    for step, at in ((52, 8.5), (102, 9.5)):
        rate.progress(1, step, at)
        assert rate.steps_per_s is None
    rate.progress(1, 152, 10.5)
    assert rate.steps_per_s == 50.0
    assert eta_seconds(global_step=152, total_steps=300, steps_per_s=rate.steps_per_s) == 2.96


def test_a_restart_starts_the_measurement_over():
    rate = SteadyRate()
    for step, at in ((1, 0.0), (51, 1.0), (101, 2.0), (151, 3.0), (201, 4.0)):
        rate.progress(1, step, at)
    assert rate.steps_per_s == 50.0
    rate.restart()  # restored at step 100; the restart's first call took 20 s (start-up, restore, trace)
    rate.started(2, 101, 40.0)
    rate.progress(2, 101, 40.0)
    rate.progress(2, 102, 41.5)  # its second call, one step
    assert rate.steps_per_s is None
    for step, at in ((122, 42.5), (142, 43.5), (162, 44.5)):
        rate.progress(2, step, at)
    assert rate.steps_per_s == 20.0  # (162 - 102) / (44.5 - 41.5): attempt 2's steady calls only


def test_another_attempts_event_or_a_step_that_went_back_starts_over_too():
    rate = SteadyRate()
    for step, at in ((1, 0.0), (51, 1.0), (101, 2.0), (151, 3.0), (201, 4.0)):
        rate.progress(1, step, at)
    rate.progress(2, 160, 30.0)  # attempt 2's first event (its restored event not seen)
    assert rate.steps_per_s is None
    for step, at in ((170, 31.0), (180, 32.0), (190, 33.0), (200, 34.0)):
        rate.progress(2, step, at)
    assert rate.steps_per_s == 10.0
    rate.progress(2, 100, 35.0)  # back to step 100: a restore
    assert rate.steps_per_s is None


def test_the_rate_follows_the_last_minute():
    rate = SteadyRate()
    rate.started(1, 0, 0.0)
    for second in range(1, 61):  # 10 steps/s for a minute, then 50 steps/s for two
        rate.progress(1, 10 * second, float(second))
    assert rate.steps_per_s == 10.0
    for second in range(61, 181):
        rate.progress(1, 600 + 50 * (second - 60), float(second))
    assert rate.steps_per_s == 50.0


def test_events_of_the_same_call_add_nothing():
    rate = SteadyRate()
    rate.started(1, 4, 1.0)
    for _ in range(5):
        rate.progress(1, 4, 1.0)  # first_step's call: its progress event, repeated
    assert rate.steps_per_s is None


@pytest.mark.parametrize("step, total, per_s, expected", [
    (0, 8_000, 10.0, 800.0), (8_000, 8_000, 2.0, 0.0), (9_000, 8_000, 2.0, 0.0),
    (10, None, 1.0, None), (10, 100, None, None), (10, 100, 0.0, None),
])
def test_eta_seconds(step, total, per_s, expected):
    assert eta_seconds(global_step=step, total_steps=total, steps_per_s=per_s) == expected


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window_s=1.0, min_s=3.0"):
        SteadyRate(window_s=1.0, min_s=3.0)
    with pytest.raises(ValueError, match="min_events=0"):
        SteadyRate(min_events=0)
