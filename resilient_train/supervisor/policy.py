"""Restart policy: what an attempt's exit means, and whether to restart the worker group.

MultiWorkerMirroredStrategy cannot take a worker back mid-run, so the supervisor's only
remedy is a gang restart from the last committed checkpoint. This module decides *whether*
to do that and *how long to wait first*; it never touches a process, a clock or a sleep.
The supervisor loop feeds it one :class:`AttemptOutcome` per attempt and acts on the
:class:`Decision` it returns.

Design, after torch elastic's agent and tenacity's composable policies:

* **One counter holds the budget** (torch elastic's ``remaining_restarts``): only failures
  spend ``max_restarts``. Preemptions are not failures (the group saved at an agreed step
  and exited on request), just as elastic's membership changes do not spend restarts; they
  have their own optional cap, ``max_preemptions``. An elastic run's resizes
  (``--workers MIN:MAX``: the group lost a node and restarts smaller, or capacity returned
  and it grows back) are membership changes in exactly torch elastic's sense: they spend
  nothing, are counted in ``membership_changes`` and restart without a backoff.
* **Stop and wait rules are tenacity objects** (``stop_after_attempt``,
  ``wait_exponential`` + a uniform jitter), evaluated against a ``RetryCallState`` whose
  attempt number is our counter. tenacity's own ``wait_random`` draws from the global
  ``random`` module, so the jitter term here is the same formula drawing from an injected
  ``random.Random``: tests get exact backoffs, production gets real jitter.
* **Crash loops stop early.** A deterministic bug (a NaN check, a bad batch at a fixed
  step) fails the same way at the same step every time; restoring the same checkpoint
  cannot help, so two consecutive failed attempts with the same signature at the same
  ``global_step`` stop the run even if budget remains. An unknown step (``None``) never
  counts as "the same step": without evidence of no progress the budget decides.
* **FATAL stops at once.** Workers exit ``EXIT_FATAL``/``EXIT_USAGE`` when they found a
  problem a restart cannot fix (broken recipe, incompatible checkpoint).

Backoff after a failure is ``min(backoff_max_s, backoff_initial_s * 2**(k-1) +
U(0, backoff_jitter_s))`` where ``k`` counts consecutive failed attempts (with
``first_restart_immediate``, the supervisor's default, the first failure of a streak waits
nothing and ``k`` counts from the second: a kill of a healthy job is not a crash loop, and
the wait was 0.25-0.5 s of every warm restart); a preemption in
between resets it (the group was healthy enough to save on request), and so does a failure
at a later global_step than the previous failure (the job is making progress: on
preemptible nodes unrelated kills must not make each recovery wait longer). A preemption restarts
after ``PREEMPTION_BACKOFF_S``: there is nothing to wait out, the checkpoint is fresh.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol

import tenacity
from tenacity.stop import stop_after_attempt, stop_base, stop_never
from tenacity.wait import wait_base, wait_exponential

from resilient_train.rundir.errorfile import describe_exit
from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED, NOT_RESTARTABLE

__all__ = [
    "ExitClass",
    "classify",
    "describe_exit",
    "RestartPolicy",
    "AttemptOutcome",
    "Decision",
    "RestartTracker",
    "PREEMPTION_BACKOFF_S",
    "EVENT_RESTART_BUDGET_EXHAUSTED",
    "EVENT_CRASH_LOOP_DETECTED",
    "EVENT_FATAL_ERROR",
]

PREEMPTION_BACKOFF_S = 0.0

EVENT_RESTART_BUDGET_EXHAUSTED = "restart_budget_exhausted"
EVENT_CRASH_LOOP_DETECTED = "crash_loop_detected"
EVENT_FATAL_ERROR = "fatal_error"


_REFUSED = "resilient_train.errors.RecipeRefused:"  # a refusal's signature (errors.py RecipeRefused)

class ExitClass(str, Enum):
    """How one worker process (or the worker group, via its root cause) ended.

    Recognised from the process's return code (``Popen.returncode`` convention):

    * ``OK``: exit code ``EXIT_OK`` (0). Training finished.
    * ``PREEMPTED``: exit code ``EXIT_PREEMPTED`` (143). The worker was asked to stop,
      saved at the step the group agreed on and exited cleanly. Restart is free.
    * ``FATAL``: exit code ``EXIT_FATAL`` (3) or ``EXIT_USAGE`` (2). The worker found a
      problem that restarting cannot fix. Never restarted.
    * ``FAILED``: anything else: a negative code (killed by that signal, e.g. -9 for
      SIGKILL by the OOM killer) or any other non-zero code. Restarted within budget.
    """

    OK = "ok"
    PREEMPTED = "preempted"
    FAILED = "failed"
    FATAL = "fatal"


def classify(returncode: int) -> ExitClass:
    """The :class:`ExitClass` of one process's return code (codes: errors.py)."""
    if returncode == EXIT_OK:
        return ExitClass.OK
    if returncode == EXIT_PREEMPTED:
        return ExitClass.PREEMPTED
    if returncode in NOT_RESTARTABLE:
        return ExitClass.FATAL
    return ExitClass.FAILED


@dataclass(frozen=True)
class RestartPolicy:
    """How many restarts a run may spend, and how long to wait before each.

    ``max_restarts`` bounds restarts after failures (0 = never restart a failure);
    ``max_preemptions`` bounds restarts after preemptions (``None`` = unbounded).
    ``first_restart_immediate``: the first failure of a streak restarts without a wait and
    the backoff starts at the second (``backoff_s(n)`` is the formula's ``n - 1``).
    """

    max_restarts: int = 3
    max_preemptions: int | None = None
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    backoff_jitter_s: float = 1.0
    first_restart_immediate: bool = False

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"Received max_restarts={self.max_restarts}; expected >= 0")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(
                f"Received max_preemptions={self.max_preemptions}; expected >= 0 or None"
            )
        if not self.backoff_initial_s >= 0:  # also rejects NaN
            raise ValueError(
                f"Received backoff_initial_s={self.backoff_initial_s}; expected >= 0"
            )
        if not self.backoff_max_s >= self.backoff_initial_s:
            raise ValueError(
                f"Received backoff_max_s={self.backoff_max_s}; expected >= "
                f"backoff_initial_s ({self.backoff_initial_s})"
            )
        if not self.backoff_jitter_s >= 0:
            raise ValueError(
                f"Received backoff_jitter_s={self.backoff_jitter_s}; expected >= 0"
            )


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt of the worker group ended, as the tracker needs to know it.

    ``exit_class`` is the class of the root cause's exit (see ``errorfile.RootCause``);
    ``signature`` identifies the failure ("ValueError: loss is NaN", "killed by SIGKILL")
    and ``global_step`` is where it happened (``None`` if unknown). ``preempted`` is true
    when the group stopped because a preemption was requested, even if some worker's exit
    code does not say so (e.g. it was terminated while the others saved).
    ``membership_change`` is true when the supervisor restarts the group at another size
    because capacity changed (an elastic resize): not a failure, whatever the exit codes.
    """

    attempt: int
    exit_class: ExitClass
    signature: str = ""
    global_step: int | None = None
    preempted: bool = False
    membership_change: bool = False

    def __post_init__(self) -> None:
        if self.attempt < 0:
            raise ValueError(f"Received attempt={self.attempt}; expected >= 0")
        if not isinstance(self.exit_class, ExitClass):
            raise ValueError(
                f"Received exit_class={self.exit_class!r}; expected an ExitClass "
                f"({', '.join(c.name for c in ExitClass)})"
            )

    @property
    def is_preemption(self) -> bool:
        """Preempted and not fatal: restartable without spending the failure budget."""
        if self.exit_class in (ExitClass.OK, ExitClass.FATAL):
            return False
        return self.preempted or self.exit_class is ExitClass.PREEMPTED


@dataclass(frozen=True)
class Decision:
    """What the supervisor should do after an attempt.

    ``event`` names the supervisor event to emit when stopping for a policy reason
    (``restart_budget_exhausted``, ``crash_loop_detected``, ``fatal_error``); it is ``None``
    for restarts and for a completed run. ``backoff_s`` is the wait before a restart.
    """

    action: Literal["restart", "stop"]
    reason: str
    event: str | None = None
    backoff_s: float = 0.0


class _Random(Protocol):
    def random(self) -> float: ...


class _wait_uniform(wait_base):
    """tenacity's ``wait_random`` formula, drawing from an injected random source."""

    def __init__(self, low: float, high: float, rng: _Random) -> None:
        self.low = low
        self.high = high
        self.rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.low + self.rng.random() * (self.high - self.low)


_NO_RETRYING = tenacity.Retrying()  # RetryCallState wants an owner; nothing calls it


def _call_state(attempt_number: int) -> tenacity.RetryCallState:
    """A RetryCallState carrying our counter; tenacity's stop/wait objects read only that."""
    state = tenacity.RetryCallState(_NO_RETRYING, fn=None, args=(), kwargs={})
    state.attempt_number = attempt_number
    return state


class RestartTracker:
    """The single holder of a run's restart counters; decides restart or stop.

    Feed it every attempt's outcome in order with :meth:`record`. Counters:

    * ``restarts``: restarts granted after failures (the ``max_restarts`` budget spent);
    * ``preemptions``: preempted attempts seen;
    * ``failures``: failed attempts seen (one more than ``restarts`` once the budget ran out);
    * ``membership_changes``: elastic resizes (never spend a budget).

    After a ``stop`` decision the tracker refuses further outcomes.
    """

    def __init__(self, policy: RestartPolicy, *, rng: _Random | None = None) -> None:
        self.policy = policy
        self._rng: _Random = rng if rng is not None else random.Random()
        self._failure_budget: stop_base = stop_after_attempt(policy.max_restarts + 1)
        self._preemption_budget: stop_base = (
            stop_never
            if policy.max_preemptions is None
            else stop_after_attempt(policy.max_preemptions + 1)
        )
        self._backoff: wait_base = wait_exponential(
            multiplier=policy.backoff_initial_s, max=policy.backoff_max_s
        ) + _wait_uniform(0.0, policy.backoff_jitter_s, self._rng)
        self.restarts = 0
        self.preemptions = 0
        self.failures = 0
        self.membership_changes = 0
        self.consecutive_failures = 0
        self._last_failure: AttemptOutcome | None = None
        self._stopped: Decision | None = None

    def backoff_s(self, consecutive_failures: int) -> float:
        """The wait before restarting after ``consecutive_failures`` failures in a row."""
        if self.policy.first_restart_immediate:
            if consecutive_failures <= 1:
                return 0.0
            consecutive_failures -= 1
        raw = self._backoff(_call_state(consecutive_failures))
        return min(self.policy.backoff_max_s, raw)

    def record(self, outcome: AttemptOutcome) -> Decision:
        """Count one attempt's outcome and decide what happens next."""
        if self._stopped is not None:
            raise RuntimeError(
                f"Received attempt {outcome.attempt} after the tracker decided to stop "
                f"({self._stopped.reason})"
            )
        decision = self._decide(outcome)
        if decision.action == "stop":
            self._stopped = decision
        return decision

    def _decide(self, outcome: AttemptOutcome) -> Decision:
        what = outcome.signature or outcome.exit_class.value
        if outcome.exit_class is ExitClass.OK:
            return Decision("stop", "worker group completed")
        if outcome.exit_class is ExitClass.FATAL:
            if (outcome.signature or "").startswith(_REFUSED):  # its one line was the root cause: not again
                return Decision("stop", "the job was refused (the line above); fix it and run again", EVENT_FATAL_ERROR)
            return Decision(
                "stop",
                f"fatal error in attempt {outcome.attempt} ({what}); restarting cannot help",
                EVENT_FATAL_ERROR,
            )

        if outcome.membership_change:
            self.membership_changes += 1
            return Decision(
                "restart",
                f"attempt {outcome.attempt} ended by a membership change; restart not counted "
                f"({self.membership_changes} membership changes)",
                backoff_s=PREEMPTION_BACKOFF_S,
            )

        if outcome.is_preemption:
            self.preemptions += 1
            self.consecutive_failures = 0
            self._last_failure = None
            if self._preemption_budget(_call_state(self.preemptions)):
                return Decision(
                    "stop",
                    f"preemption budget exhausted: {self.preemptions} preemptions, "
                    f"max_preemptions={self.policy.max_preemptions}",
                    EVENT_RESTART_BUDGET_EXHAUSTED,
                )
            return Decision(
                "restart",
                f"attempt {outcome.attempt} preempted; restart not counted "
                f"({self.preemptions} preemptions)",
                backoff_s=PREEMPTION_BACKOFF_S,
            )

        self.failures += 1
        previous, self._last_failure = self._last_failure, outcome
        if _made_progress(previous, outcome):
            self.consecutive_failures = 0  # a healthy job hit by unrelated kills: no growing wait
        self.consecutive_failures += 1
        if (
            previous is not None
            and outcome.global_step is not None
            and previous.global_step == outcome.global_step
            and previous.signature == outcome.signature
        ):
            return Decision(
                "stop",
                f"crash loop: attempts {previous.attempt} and {outcome.attempt} both failed "
                f"with {what} at global_step {outcome.global_step}",
                EVENT_CRASH_LOOP_DETECTED,
            )
        if self._failure_budget(_call_state(self.failures)):
            return Decision(
                "stop",
                f"restart budget exhausted: attempt {outcome.attempt} failed ({what}) "
                f"after {self.restarts} restarts, max_restarts={self.policy.max_restarts}",
                EVENT_RESTART_BUDGET_EXHAUSTED,
            )
        self.restarts += 1
        return Decision(
            "restart",
            f"attempt {outcome.attempt} failed ({what}); restart {self.restarts} of "
            f"{self.policy.max_restarts}",
            backoff_s=self.backoff_s(self.consecutive_failures),
        )


def _made_progress(previous: AttemptOutcome | None, outcome: AttemptOutcome) -> bool:
    """The failed attempt got further than the previous failure did."""
    return (
        previous is not None
        and previous.global_step is not None
        and outcome.global_step is not None
        and outcome.global_step > previous.global_step
    )
