"""The progress watchdog as pure code: a fake clock, markers given as values."""

from __future__ import annotations

import pytest

from resilient_train.rundir.stacks import Frame, ThreadStack
from resilient_train.rundir.stepmarker import Phase
from resilient_train.supervisor.watchdog import (
    HangPolicy,
    ProgressWatchdog,
    choose_stuck_rank,
    describe_where,
)

TRAIN = Phase("train", 0, 0)
STARTUP = Phase("startup")


def started(policy: HangPolicy, ranks=(0, 1), at: float = 0.0) -> ProgressWatchdog:
    watchdog = ProgressWatchdog(policy)
    watchdog.start_attempt(at, list(ranks))
    return watchdog


def test_no_progress_for_longer_than_the_hang_timeout_is_a_stall_and_any_progress_resets_it():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=100))
    watchdog.observe(10.0, 0, 1, TRAIN)
    watchdog.observe(10.0, 1, 1, TRAIN)
    assert watchdog.check(15.0) is None  # exactly the timeout: not yet
    watchdog.observe(14.0, 1, 2, TRAIN)  # one rank moving is progress of the group
    assert watchdog.check(19.0) is None
    stall = watchdog.check(19.5)
    assert stall is not None
    assert (stall.seconds, stall.allowed_s, stall.phase, dict(stall.steps)) == (5.5, 5, "train", {0: 1, 1: 2})


def test_an_unchanged_or_lower_step_is_not_progress():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=100), ranks=(0,))
    watchdog.observe(1.0, 0, 7, TRAIN)
    watchdog.observe(3.0, 0, 7, TRAIN)
    watchdog.observe(4.0, 0, 6, TRAIN)
    assert watchdog.check(6.1).seconds == pytest.approx(5.1)


def test_until_the_first_step_of_an_attempt_the_startup_allowance_applies():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=30), at=100.0)
    for now in (101.0, 110.0, 129.0):
        watchdog.observe(now, 0, None, STARTUP)
        watchdog.observe(now, 1, None, STARTUP)
    assert watchdog.check(130.0) is None
    stall = watchdog.check(130.5)
    assert (stall.seconds, stall.allowed_s, stall.phase, dict(stall.steps)) == (30.5, 30, "startup", {0: None, 1: None})


def test_a_new_attempt_starts_with_the_startup_allowance_again():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=30), ranks=(0,))
    watchdog.observe(1.0, 0, 4, TRAIN)
    assert watchdog.check(6.5) is not None
    watchdog.start_attempt(7.0, [0, 1])
    assert watchdog.check(36.0) is None and watchdog.check(37.5).allowed_s == 30


@pytest.mark.parametrize("slow", ["input", "eval", "flush", "finish"])
def test_a_rank_in_a_slow_phase_gets_the_startup_allowance_from_when_it_entered_it(slow):
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=60))
    watchdog.observe(1.0, 0, 10, TRAIN)
    watchdog.observe(1.0, 1, 10, TRAIN)
    watchdog.observe(2.0, 0, 10, Phase(slow, 0, 0))  # entering it is progress: the clock restarts
    assert watchdog.check(62.0) is None
    assert (watchdog.check(62.5).allowed_s, watchdog.check(62.5).phase) == (60, slow)


def test_leaving_a_slow_phase_longer_than_the_hang_timeout_is_not_a_hang_but_a_stall_after_it_is():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=600))
    for rank in (0, 1):
        watchdog.observe(1.0, rank, 10, TRAIN)
        watchdog.observe(2.0, rank, 10, Phase("eval", 0, 0))
    for rank in (0, 1):  # a 98 s evaluation ends; training resumes
        watchdog.observe(100.0, rank, 10, Phase("train", 1, 10))
    assert watchdog.check(105.0) is None
    stall = watchdog.check(105.5)
    assert (stall.seconds, stall.allowed_s, stall.phase) == (5.5, 5, "train")


def test_a_worker_that_writes_steps_but_no_phase_counts_as_training():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=60))
    watchdog.observe(1.0, 0, 3, STARTUP)
    assert watchdog.allowance() == (60, "startup")  # rank 1 has not started yet
    watchdog.observe(1.0, 1, 3, STARTUP)
    assert watchdog.allowance() == (5, "train")


def test_auto_is_the_floor_until_calls_are_long_then_ten_times_the_longest_call():
    watchdog = started(HangPolicy(hang_timeout_s=None, startup_timeout_s=600), ranks=(0,))
    assert watchdog.hang_timeout_s == 60.0
    for k, now in enumerate([100.0, 100.5, 101.0, 101.5]):  # first step at 100 (start-up), then 0.5 s calls
        watchdog.observe(now, 0, k + 1, TRAIN)
    assert (watchdog.longest_call_s, watchdog.hang_timeout_s) == (0.5, 60.0)
    watchdog.observe(109.5, 0, 5, TRAIN)  # an 8 s call: auto = 80 s
    assert (watchdog.longest_call_s, watchdog.hang_timeout_s) == (8.0, 80.0)
    assert watchdog.check(189.5) is None and watchdog.check(189.6).allowed_s == 80.0


def test_the_startup_interval_and_intervals_with_a_slow_phase_do_not_scale_auto():
    watchdog = started(HangPolicy(hang_timeout_s=None, startup_timeout_s=600), ranks=(0,))
    watchdog.observe(300.0, 0, 1, TRAIN)  # 300 s of start-up before the first step: not a call
    watchdog.observe(301.0, 0, 2, TRAIN)
    watchdog.observe(305.0, 0, 2, Phase("eval", 0, 0))
    watchdog.observe(500.0, 0, 2, TRAIN)
    watchdog.observe(501.0, 0, 3, TRAIN)  # 200 s since the last step, but evaluation ran in between
    assert (watchdog.longest_call_s, watchdog.hang_timeout_s) == (1.0, 60.0)


def test_a_slow_but_moving_worker_on_a_busier_and_busier_machine_is_never_flagged():
    """Calls slow down 1.5x each (0.1 s ... 38 s, far past the 60 s floor's tenth): never a stall."""
    watchdog = started(HangPolicy(hang_timeout_s=None, startup_timeout_s=600))
    now, call, step = 0.0, 0.1, 0
    while call < 40:
        step += 1
        target = now + call
        while now < target:  # the supervisor looks every 0.25 s
            now = min(target, now + 0.25)
            assert watchdog.check(now) is None, f"flagged at {now:.2f} s during a {call:.1f} s call"
        for rank in (0, 1):
            watchdog.observe(now, rank, step, TRAIN)
        call *= 1.5
    assert watchdog.longest_call_s > 25 and watchdog.hang_timeout_s > 250


def test_a_fixed_timeout_does_not_scale():
    watchdog = started(HangPolicy(hang_timeout_s=5, startup_timeout_s=60), ranks=(0,))
    watchdog.observe(1.0, 0, 1, TRAIN)
    watchdog.observe(4.0, 0, 2, TRAIN)
    assert (watchdog.longest_call_s, watchdog.hang_timeout_s) == (3.0, 5)


@pytest.mark.parametrize(("field", "value"), [("hang_timeout_s", 0), ("startup_timeout_s", -1.0), ("auto_factor", True)])
def test_policy_values_are_checked(field, value):
    with pytest.raises(ValueError, match=f"Received {field}={value!r}; expected a number > 0"):
        HangPolicy(**{field: value})


def test_policy_from_the_job_setting():
    assert HangPolicy.from_setting("auto", 600) == HangPolicy(None, 600.0)
    assert HangPolicy.from_setting(31, 90) == HangPolicy(31.0, 90.0)


# ------------------------------------------------------------------ who and where
TF_EXECUTE = Frame("/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", 53, "quick_execute")
LOOP = Frame("/repo/resilient_train/runner/training/loop.py", 430, "_run_call")
MODULE = Frame("<frozen runpy>", 88, "_run_code")
READ = Frame("/home/me/input_hang.py", 47, "_read")
SLEEPING = Frame("/usr/lib/python3.11/threading.py", 320, "wait")


def main_in_tf(ident: int = 1) -> ThreadStack:
    return ThreadStack(ident, (TF_EXECUTE, LOOP, MODULE), True)


def test_the_rank_behind_is_the_stuck_one():
    assert choose_stuck_rank({0: 25, 1: 24, 2: 25}, {}) == (1, "behind")
    assert choose_stuck_rank({0: 3, 1: None}, {}) == (1, "behind")


def test_among_ranks_at_the_same_step_the_one_in_recipe_code_is_stuck():
    stacks = {
        0: [main_in_tf(1), ThreadStack(2, (SLEEPING,), False)],
        1: [main_in_tf(1), ThreadStack(3, (READ, SLEEPING), False)],
    }
    assert choose_stuck_rank({0: 24, 1: 24}, stacks) == (1, "in recipe code")


def test_among_ranks_at_the_same_step_the_one_not_in_a_tensorflow_op_is_stuck():
    stacks = {0: [main_in_tf()], 1: [ThreadStack(1, (SLEEPING, LOOP, MODULE), True)]}
    assert choose_stuck_rank({0: 24, 1: 24}, stacks) == (1, "main thread not in a TensorFlow op")


def test_an_undecided_tie_names_the_lowest_rank_and_says_so():
    assert choose_stuck_rank({1: 24, 0: 24}, {0: [main_in_tf()], 1: [main_in_tf()]}) == (0, "tie")
    with pytest.raises(ValueError, match="Received no ranks"):
        choose_stuck_rank({}, {})


def test_where_names_the_main_thread_and_the_recipe_frame_of_another_thread():
    stacks = [main_in_tf(), ThreadStack(3, (READ, SLEEPING), False)]
    assert describe_where(stacks) == (
        "main thread in execute.py:53 quick_execute (TensorFlow); recipe code in input_hang.py:47 _read (another thread)"
    )
    assert describe_where([ThreadStack(1, (READ, LOOP, MODULE), True)]) == "main thread in input_hang.py:47 _read"
    assert describe_where([]) == "no stacks (the worker did not answer SIGUSR1)"
