"""CallSizer: how many steps the next compiled call may run (no TensorFlow, no clock)."""

import pytest

from resilient_train.runner.training.call_size import CallSizer


def test_a_fixed_size_is_proposed_whatever_the_calls_took():
    sizer = CallSizer(8)
    assert (sizer.initial, sizer.proposal()) == (8, 8)
    for _ in range(5):
        sizer.observed(8, 10.0)
    assert sizer.proposal() == 8


def test_auto_starts_at_one_step_and_ignores_the_first_call_which_traces():
    sizer = CallSizer("auto", target_s=0.1)
    assert (sizer.initial, sizer.proposal()) == (1, 1)
    sizer.observed(1, 5.0)  # tracing: would mean "1 step per call" forever if counted
    assert sizer.proposal() == 1
    sizer.observed(1, 0.004)
    assert sizer.proposal() == 25  # 0.1 s / 4 ms
    sizer.observed(1, 0.7, traced=True)  # a later call that traced (the memory tier's variant)
    assert sizer.proposal() == 25


def test_auto_sizes_calls_by_the_median_step_time_of_the_last_five_calls():
    sizer = CallSizer("auto", target_s=0.1)
    sizer.observed(1, 1.0)
    for steps, seconds in [(1, 0.01), (10, 0.1), (10, 0.1), (10, 3.0), (10, 0.1)]:
        sizer.observed(steps, seconds)
    assert sizer.proposal() == 10  # the one 300 ms/step call (a stall) does not swing it
    for _ in range(5):
        sizer.observed(10, 0.5)  # the steps became 5x slower
    assert sizer.proposal() == 2


def test_auto_keeps_slow_steps_at_one_per_call_and_caps_fast_ones():
    slow = CallSizer("auto", target_s=0.1)
    fast = CallSizer("auto", target_s=0.1, max_steps=64)
    for sizer, seconds in [(slow, 0.5), (fast, 1e-6)]:
        sizer.observed(1, 9.0)
        sizer.observed(1, seconds)
    assert (slow.proposal(), fast.proposal()) == (1, 64)


@pytest.mark.parametrize("setting", [0, -2, "8", "fast", True, 2.5])
def test_a_bad_setting_is_refused_naming_it(setting):
    with pytest.raises(ValueError, match=f"steps_per_execution={setting!r}; expected 'auto' or an integer >= 1"):
        CallSizer(setting)
