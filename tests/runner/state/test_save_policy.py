"""SavePolicy: where compiled calls end and which call ends are saved (no TensorFlow)."""

import pytest

from resilient_train.runner.state.save_policy import SavePolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(every_steps=0, every_seconds=None, is_chief=True, clock=None):
    return SavePolicy(every_steps=every_steps, every_seconds=every_seconds, is_chief=is_chief,
                      clock=clock or FakeClock())


def call_ends(p, *, start_global, start_in_epoch, steps_per_epoch, max_steps):
    """The global steps at which successive calls end, from a position to the epoch end."""
    ends, g, s = [], start_global, start_in_epoch
    while s < steps_per_epoch:
        n = p.call_length(global_step=g, step_in_epoch=s, steps_per_epoch=steps_per_epoch, max_steps=max_steps)
        g, s = g + n, s + n
        ends.append(g)
    return ends


def test_calls_end_at_every_save_point_and_the_epoch_end():
    p = policy(every_steps=4)
    assert call_ends(p, start_global=0, start_in_epoch=0, steps_per_epoch=10, max_steps=3) == [3, 4, 7, 8, 10]
    assert call_ends(p, start_global=10, start_in_epoch=0, steps_per_epoch=10, max_steps=3) == [12, 15, 16, 19, 20]


def test_without_step_saves_calls_are_max_steps_cut_at_the_epoch_end():
    p = policy(every_steps=0)
    assert call_ends(p, start_global=0, start_in_epoch=0, steps_per_epoch=10, max_steps=4) == [4, 8, 10]
    assert call_ends(p, start_global=5, start_in_epoch=5, steps_per_epoch=10, max_steps=100) == [10]


def test_one_step_per_call_visits_every_step():
    p = policy(every_steps=4)
    assert call_ends(p, start_global=3, start_in_epoch=3, steps_per_epoch=7, max_steps=1) == [4, 5, 6, 7]


def test_resuming_from_a_save_point_gives_the_same_later_save_points():
    """A run restored at a committed step ends calls at the same save points as one that
    never stopped, so the committed step set does not depend on N or on restarts."""
    p = policy(every_steps=5)
    uninterrupted = call_ends(p, start_global=0, start_in_epoch=0, steps_per_epoch=20, max_steps=3)
    resumed = call_ends(p, start_global=10, start_in_epoch=10, steps_per_epoch=20, max_steps=3)
    saves = lambda ends: [g for g in ends if g % 5 == 0]
    assert saves(uninterrupted)[2:] == saves(resumed) == [15, 20]


def test_call_length_refuses_a_finished_epoch():
    with pytest.raises(ValueError, match="step_in_epoch=10 with steps_per_epoch=10"):
        policy().call_length(global_step=10, step_in_epoch=10, steps_per_epoch=10, max_steps=2)


def test_save_after_counts_steps_and_leaves_the_epoch_end_to_the_loop():
    p = policy(every_steps=4)
    assert p.save_after(global_step=8, step_in_epoch=8, steps_per_epoch=10, agreed_time_flag=False)
    assert not p.save_after(global_step=7, step_in_epoch=7, steps_per_epoch=10, agreed_time_flag=False)
    assert not p.save_after(global_step=20, step_in_epoch=10, steps_per_epoch=10, agreed_time_flag=False)
    assert p.save_after(global_step=7, step_in_epoch=7, steps_per_epoch=10, agreed_time_flag=True)
    assert not policy(every_steps=0).save_after(global_step=8, step_in_epoch=8, steps_per_epoch=10,
                                                agreed_time_flag=False)


def test_time_flag_is_the_chiefs_and_restarts_after_any_save():
    clock = FakeClock()
    chief = policy(every_seconds=30.0, clock=clock)
    other = policy(every_seconds=30.0, is_chief=False, clock=clock)
    assert chief.time_flag() == 0.0
    clock.now += 30.0
    assert (chief.time_flag(), other.time_flag()) == (1.0, 0.0)
    chief.saved()
    assert chief.time_flag() == 0.0
    assert policy(every_seconds=None, clock=clock).time_flag() == 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"every_steps": -1}, "every_steps=-1"),
    ({"every_steps": True}, "every_steps=True"),
    ({"every_seconds": 0}, "every_seconds=0"),
])
def test_bad_settings_are_refused_with_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        policy(**kwargs)


def test_step_count_save_points_are_known_before_the_call():
    # the call that reaches one fingerprints its last step, so the save's comparison of the
    # workers rides the call's all-reduce (runner/training/train_call.py TrainCall.run)
    p = policy(every_steps=20)
    assert [s for s in range(1, 61) if p.counts_to(s)] == [20, 40, 60]
    assert not any(policy(every_steps=0).counts_to(s) for s in range(1, 61))
