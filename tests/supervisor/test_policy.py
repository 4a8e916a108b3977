"""Restart policy: exit classes, budgets, crash loops and exact backoffs."""

from __future__ import annotations

import pytest

from resilient_train.errors import EXIT_FATAL, EXIT_FAILURE, EXIT_PREEMPTED, EXIT_USAGE
from resilient_train.supervisor.policy import (
    PREEMPTION_BACKOFF_S,
    AttemptOutcome,
    Decision,
    ExitClass,
    RestartPolicy,
    RestartTracker,
    classify,
    describe_exit,
)


class FixedRandom:
    """A random source whose draws are given in advance."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.calls = 0

    def random(self) -> float:
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        return value


def failed(attempt: int, step: int | None = None, signature: str = "ValueError: boom"):
    return AttemptOutcome(attempt, ExitClass.FAILED, signature, global_step=step)


def preempted(attempt: int, step: int | None = None):
    return AttemptOutcome(attempt, ExitClass.PREEMPTED, "preempted (exit 143)", step)


def tracker(rng: FixedRandom | None = None, **policy) -> RestartTracker:
    return RestartTracker(RestartPolicy(**policy), rng=rng or FixedRandom(0.0))


# --- exit codes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        (0, ExitClass.OK),
        (EXIT_PREEMPTED, ExitClass.PREEMPTED),
        (EXIT_FATAL, ExitClass.FATAL),
        (EXIT_USAGE, ExitClass.FATAL),
        (EXIT_FAILURE, ExitClass.FAILED),
        (-9, ExitClass.FAILED),
        (-15, ExitClass.FAILED),
        (137, ExitClass.FAILED),
        (255, ExitClass.FAILED),
    ],
)
def test_classify(returncode: int, expected: ExitClass) -> None:
    assert classify(returncode) is expected


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (-11, "killed by SIGSEGV"),
        (-200, "killed by signal 200"),
        (1, "exit code 1"),
        (137, "exit code 137"),
        (0, "completed (exit 0)"),
        (143, "preempted (exit 143)"),
        (3, "fatal error (exit 3)"),
        (2, "usage error (exit 2)"),
    ],
)
def test_describe_exit(returncode: int, expected: str) -> None:
    assert describe_exit(returncode) == expected


def test_exit_class_is_a_str_enum() -> None:
    assert ExitClass.PREEMPTED == "preempted"
    assert [c.name for c in ExitClass] == ["OK", "PREEMPTED", "FAILED", "FATAL"]


# --- policy validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_restarts": -1}, "Received max_restarts=-1; expected >= 0"),
        ({"max_preemptions": -2}, "Received max_preemptions=-2; expected >= 0 or None"),
        ({"backoff_initial_s": -0.5}, "Received backoff_initial_s=-0.5; expected >= 0"),
        ({"backoff_initial_s": float("nan")}, "Received backoff_initial_s=nan; expected >= 0"),
        (
            {"backoff_initial_s": 10.0, "backoff_max_s": 5.0},
            "Received backoff_max_s=5.0; expected >= backoff_initial_s (10.0)",
        ),
        ({"backoff_jitter_s": -1.0}, "Received backoff_jitter_s=-1.0; expected >= 0"),
    ],
)
def test_policy_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        RestartPolicy(**kwargs)
    assert str(info.value) == message


def test_policy_defaults() -> None:
    policy = RestartPolicy()
    assert (policy.max_restarts, policy.max_preemptions) == (3, None)
    assert (policy.backoff_initial_s, policy.backoff_max_s, policy.backoff_jitter_s) == (
        1.0,
        30.0,
        1.0,
    )


def test_outcome_rejects_negative_attempt_and_plain_strings() -> None:
    with pytest.raises(ValueError, match=r"Received attempt=-1; expected >= 0"):
        AttemptOutcome(-1, ExitClass.FAILED)
    with pytest.raises(ValueError, match=r"Received exit_class='failed'; expected an ExitClass"):
        AttemptOutcome(0, "failed")  # type: ignore[arg-type]


# --- budgets ----------------------------------------------------------------------------


def test_budget_of_one_allows_one_restart_then_stops() -> None:
    t = tracker(max_restarts=1)
    first = t.record(failed(0, step=3))
    second = t.record(failed(1, step=9))
    assert first.action == "restart" and first.event is None
    assert second == Decision(
        "stop",
        "restart budget exhausted: attempt 1 failed (ValueError: boom) after 1 restarts, "
        "max_restarts=1",
        "restart_budget_exhausted",
        0.0,
    )
    assert (t.restarts, t.failures, t.preemptions) == (1, 2, 0)


def test_zero_budget_stops_on_first_failure() -> None:
    t = tracker(max_restarts=0)
    decision = t.record(failed(0, step=1))
    assert (decision.action, decision.event) == ("stop", "restart_budget_exhausted")
    assert t.restarts == 0


def test_budget_of_three_gives_exactly_three_restarts() -> None:
    t = tracker(max_restarts=3)
    actions = [t.record(failed(i, step=10 * i)).action for i in range(4)]
    assert actions == ["restart", "restart", "restart", "stop"]
    assert t.restarts == 3


def test_fatal_stops_at_once_with_budget_left() -> None:
    t = tracker(max_restarts=5)
    decision = t.record(AttemptOutcome(0, ExitClass.FATAL, "fatal error (exit 3)", 4))
    assert decision == Decision(
        "stop",
        "fatal error in attempt 0 (fatal error (exit 3)); restarting cannot help",
        "fatal_error",
        0.0,
    )
    assert (t.restarts, t.failures) == (0, 0)


def test_a_refusal_stops_without_repeating_its_line() -> None:
    # the root cause already printed the refusal's one line (rundir/errorfile.py): the stop says what to do
    t = tracker(max_restarts=5)
    signature = "resilient_train.errors.RecipeRefused: Script s.py: its model was compiled with 2 outputs; ..."
    decision = t.record(AttemptOutcome(1, ExitClass.FATAL, signature, 0))
    assert decision == Decision("stop", "the job was refused (the line above); fix it and run again", "fatal_error", 0.0)


def test_fatal_wins_over_preempted_flag() -> None:
    t = tracker()
    decision = t.record(AttemptOutcome(0, ExitClass.FATAL, "x", preempted=True))
    assert decision.event == "fatal_error"
    assert t.preemptions == 0


def test_ok_stops_without_event() -> None:
    assert tracker().record(AttemptOutcome(2, ExitClass.OK)) == Decision(
        "stop", "worker group completed", None, 0.0
    )


def test_no_outcomes_accepted_after_stop() -> None:
    t = tracker(max_restarts=0)
    t.record(failed(0))
    with pytest.raises(RuntimeError, match=r"Received attempt 1 after the tracker decided"):
        t.record(failed(1))


# --- preemptions ------------------------------------------------------------------------


def test_preemptions_do_not_spend_restart_budget() -> None:
    t = tracker(max_restarts=1)
    decisions = [t.record(preempted(i, step=i)) for i in range(5)]
    assert [d.action for d in decisions] == ["restart"] * 5
    assert [d.backoff_s for d in decisions] == [PREEMPTION_BACKOFF_S] * 5 == [0.0] * 5
    assert decisions[-1].reason == "attempt 4 preempted; restart not counted (5 preemptions)"
    assert (t.restarts, t.preemptions) == (0, 5)
    assert t.record(failed(5, step=50)).action == "restart"
    assert t.record(failed(6, step=60)).event == "restart_budget_exhausted"


def test_max_preemptions_caps_preemption_restarts() -> None:
    t = tracker(max_restarts=3, max_preemptions=2)
    assert t.record(preempted(0)).action == "restart"
    assert t.record(preempted(1)).action == "restart"
    third = t.record(preempted(2))
    assert third == Decision(
        "stop",
        "preemption budget exhausted: 3 preemptions, max_preemptions=2",
        "restart_budget_exhausted",
        0.0,
    )
    assert (t.restarts, t.preemptions) == (0, 3)


def test_zero_max_preemptions_stops_on_first_preemption() -> None:
    decision = tracker(max_preemptions=0).record(preempted(0))
    assert (decision.action, decision.event) == ("stop", "restart_budget_exhausted")


def test_preempted_flag_counts_as_preemption_whatever_the_exit_code() -> None:
    t = tracker(max_restarts=0)
    outcome = AttemptOutcome(0, ExitClass.FAILED, "killed by SIGTERM", 5, preempted=True)
    assert outcome.is_preemption
    assert t.record(outcome).action == "restart"
    assert (t.restarts, t.failures, t.preemptions) == (0, 0, 1)


# --- crash loops ------------------------------------------------------------------------


def test_same_failure_at_same_step_twice_is_a_crash_loop() -> None:
    t = tracker(max_restarts=10)
    assert t.record(failed(0, step=7)).action == "restart"
    second = t.record(failed(1, step=7))
    assert second == Decision(
        "stop",
        "crash loop: attempts 0 and 1 both failed with ValueError: boom at global_step 7",
        "crash_loop_detected",
        0.0,
    )
    assert (t.restarts, t.failures) == (1, 2)


def test_same_failure_at_different_steps_restarts() -> None:
    t = tracker(max_restarts=10)
    decisions = [t.record(failed(i, step=7 + i)) for i in range(3)]
    assert [d.action for d in decisions] == ["restart"] * 3


def test_different_failures_at_same_step_restart() -> None:
    t = tracker(max_restarts=10)
    assert t.record(failed(0, step=7, signature="killed by SIGKILL")).action == "restart"
    assert t.record(failed(1, step=7, signature="ValueError: boom")).action == "restart"


def test_unknown_step_is_never_the_same_step() -> None:
    t = tracker(max_restarts=10)
    assert t.record(failed(0, step=None)).action == "restart"
    assert t.record(failed(1, step=None)).action == "restart"


def test_crash_loop_needs_consecutive_failures() -> None:
    t = tracker(max_restarts=10)
    t.record(failed(0, step=7))
    t.record(preempted(1, step=7))
    assert t.record(failed(2, step=7)).action == "restart"
    assert t.record(failed(3, step=7)).event == "crash_loop_detected"


def test_crash_loop_reported_even_when_budget_also_ran_out() -> None:
    t = tracker(max_restarts=1)
    t.record(failed(0, step=7))
    assert t.record(failed(1, step=7)).event == "crash_loop_detected"


# --- backoff ----------------------------------------------------------------------------


def test_backoff_is_exponential_with_jitter_and_capped() -> None:
    rng = FixedRandom(0.25)
    t = tracker(
        rng, max_restarts=10, backoff_initial_s=1.0, backoff_max_s=5.0, backoff_jitter_s=1.0
    )
    backoffs = [t.record(failed(i, step=None)).backoff_s for i in range(5)]
    assert backoffs == [1.25, 2.25, 4.25, 5.0, 5.0]
    assert rng.calls == 5


def test_jitter_cannot_push_backoff_past_the_cap() -> None:
    t = tracker(FixedRandom(0.75), backoff_initial_s=2.0, backoff_max_s=4.5, backoff_jitter_s=2.0)
    assert [t.backoff_s(n) for n in (1, 2, 3)] == [3.5, 4.5, 4.5]


def test_backoff_without_jitter_is_exact_powers_of_two() -> None:
    t = tracker(backoff_initial_s=0.5, backoff_max_s=30.0, backoff_jitter_s=0.0)
    assert [t.backoff_s(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_preemption_resets_the_failure_streak() -> None:
    t = tracker(max_restarts=10, backoff_jitter_s=0.0)
    assert t.record(failed(0, step=None)).backoff_s == 1.0
    assert t.record(failed(1, step=None)).backoff_s == 2.0
    assert t.record(preempted(2, step=3)).backoff_s == 0.0
    assert t.consecutive_failures == 0
    assert t.record(failed(3, step=4)).backoff_s == 1.0


def test_progress_between_failures_resets_the_backoff() -> None:
    """A healthy job killed again and again (preemptible nodes) does not wait longer each time."""
    t = tracker(max_restarts=10, backoff_jitter_s=0.0)
    assert [t.record(failed(i, step=10 * (i + 1))).backoff_s for i in range(4)] == [1.0, 1.0, 1.0, 1.0]
    assert t.record(failed(4, step=40, signature="OtherError: x")).backoff_s == 2.0  # no progress: grows
    assert t.restarts == 5


def test_the_first_failure_of_a_streak_can_restart_at_once() -> None:
    """The supervisor's default: a kill of a healthy job waits nothing; a streak backs off."""
    rng = FixedRandom(0.5)
    t = tracker(rng, max_restarts=10, backoff_initial_s=0.25, backoff_jitter_s=0.25, first_restart_immediate=True)
    assert [t.record(failed(i, step=None)).backoff_s for i in range(4)] == [0.0, 0.375, 0.625, 1.125]
    assert rng.calls == 3  # no draw for the immediate restart
    assert t.record(failed(4, step=50)).backoff_s == 2.125  # no evidence of progress yet: the streak grows
    # a later step than the previous failure's ends the streak: each restarts at once
    assert [t.record(failed(i, step=10 * (i + 1))).backoff_s for i in range(5, 8)] == [0.0, 0.0, 0.0]


def test_default_random_source_stays_within_bounds() -> None:
    t = RestartTracker(RestartPolicy(backoff_initial_s=1.0, backoff_jitter_s=1.0))
    values = [t.backoff_s(1) for _ in range(50)]
    assert all(1.0 <= v <= 2.0 for v in values)
    assert len(set(values)) > 1


def test_a_membership_change_restarts_at_once_and_spends_no_budget() -> None:
    t = tracker(max_restarts=0, max_preemptions=0)
    decision = t.record(AttemptOutcome(1, ExitClass.FAILED, "killed by SIGKILL", 4, membership_change=True))
    assert decision == Decision(
        "restart", "attempt 1 ended by a membership change; restart not counted (1 membership changes)", None, 0.0)
    assert (t.restarts, t.failures, t.preemptions, t.membership_changes) == (0, 0, 0, 1)


def test_a_fatal_error_stops_even_during_a_membership_change() -> None:
    t = tracker()
    decision = t.record(AttemptOutcome(1, ExitClass.FATAL, "bad recipe", 4, membership_change=True))
    assert (decision.action, decision.event) == ("stop", "fatal_error")
