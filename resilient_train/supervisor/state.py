"""The run's state machine: one enum, one transition table, every transition announced.

The supervisor loop (supervisor/supervisor.py) branches on :class:`RunState` and changes it
only through :meth:`RunStateMachine.transition`, which refuses any move the table below
does not list and emits one ``run_state`` event per move (``from``, ``to``, ``attempt``,
and ``reason`` where there is one). So ``events.jsonl`` holds the run's exact path through
the table, and a new behaviour (the hang watchdog's HUNG, an elastic resize) is a new state and new
rows here, never a new flag in the loop. A transition may carry what the entered state acts on
(STARTING: the attempt to start; HUNG: the stall; RESIZING: the resize; STOPPING: why it stops;
RESTARTING: the restart; FAILED: whether fatally; supervisor/attempt.py lists them): the machine
holds it as ``carried`` until the next transition, and never emits it.

An illegal transition is a bug in the supervisor, not a condition of the run: it raises
``RuntimeError`` naming both states, and nothing is emitted.

Transitions (``TRANSITIONS``, the only ones the loop may make)::

    PREPARING -> STARTING      run dir, storage and launcher are ready; first attempt
    PREPARING -> SUCCEEDED     storage already holds the run's completed checkpoint
    STARTING -> RUNNING        every worker of the attempt was started
    STARTING -> FAILED         the launcher could not start the attempt (RestartNotPlacedError)
    RUNNING -> SUCCEEDED       every worker exited 0 and the completed checkpoint is committed
    RUNNING -> STOPPING        a worker failed, a stop was requested, or the attempt ended
                               without completing the run
    RUNNING -> HUNG            every worker is alive but none made progress for longer than
                               the watchdog allows (supervisor/watchdog.py)
    RUNNING -> RESIZING        an elastic run (``--workers MIN:MAX``) runs below MAX and the
                               launcher can place more workers now, or a preemption notice
                               on one node (not the supervisor's) leaves it without that node
    RESIZING -> STOPPING       the group was asked (SIGTERM) to agree on a step and save it;
                               the stop is settled as a membership change, not a failure
    HUNG -> STOPPING           the stacks are collected and the stuck rank is named
                               (``hang_detected``); the group is killed like after a crash
    STOPPING -> SUCCEEDED      the workers finished the run while the stop was under way
    STOPPING -> RESTARTING     the restart policy grants another attempt
    STOPPING -> FAILED         fatal error, budget exhausted, crash loop
    STOPPING -> PREEMPTED      the supervisor itself was asked to stop
    RESTARTING -> STARTING     after the backoff, with the next attempt number

SUCCEEDED, FAILED and PREEMPTED are terminal: nothing leaves them.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # attempt.py imports WorkerState from here
    from resilient_train.supervisor.attempt import Carried

__all__ = ["RunState", "WorkerState", "RunStateMachine", "TRANSITIONS", "EVENT_RUN_STATE"]

EVENT_RUN_STATE = "run_state"


class RunState(str, Enum):
    """Where the run is; see the module docstring for every legal transition."""

    PREPARING = "preparing"
    STARTING = "starting"
    RUNNING = "running"
    HUNG = "hung"
    RESIZING = "resizing"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"

    @property
    def is_terminal(self) -> bool:
        return not TRANSITIONS[self]


class WorkerState(str, Enum):
    """A worker's state within one attempt: RUNNING -> EXITED (by itself) or KILLED (by us)."""

    RUNNING = "running"
    EXITED = "exited"
    KILLED = "killed"


_S = RunState
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = MappingProxyType({
    _S.PREPARING: frozenset({_S.STARTING, _S.SUCCEEDED}),
    _S.STARTING: frozenset({_S.RUNNING, _S.FAILED}),
    _S.RUNNING: frozenset({_S.SUCCEEDED, _S.STOPPING, _S.HUNG, _S.RESIZING}),
    _S.HUNG: frozenset({_S.STOPPING}),
    _S.RESIZING: frozenset({_S.STOPPING}),
    _S.STOPPING: frozenset({_S.SUCCEEDED, _S.RESTARTING, _S.FAILED, _S.PREEMPTED}),
    _S.RESTARTING: frozenset({_S.STARTING}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.PREEMPTED: frozenset(),
})


class RunStateMachine:
    """Holds the current :class:`RunState`; moves it only along ``TRANSITIONS``.

    ``emit(event, **fields)`` is called once per transition (``rundir.events.emit`` in the
    supervisor, a list's append in tests).
    """

    def __init__(self, emit: Callable[..., None], *, state: RunState = RunState.PREPARING) -> None:
        self._emit = emit
        self._state = state
        self._carried: Carried = None

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def is_terminal(self) -> bool:
        return self._state.is_terminal

    @property
    def carried(self) -> Carried:
        """What the transition into the current state carried (None when nothing)."""
        return self._carried

    def transition(self, to: RunState, *, attempt: int | None, reason: str | None = None, carrying: Carried = None,
                   **fields: Any) -> RunState:
        """Move to ``to`` with ``carrying`` for its step, and announce it; returns the previous state.

        RuntimeError (nothing changes, nothing is emitted) when the table has no such row.
        """
        previous = self._state
        if to not in TRANSITIONS[previous]:
            raise RuntimeError(f"Illegal run state transition {previous.value} -> {RunState(to).value}")
        self._state = to
        self._carried = carrying
        record: dict[str, Any] = {"from": previous.value, "to": to.value, "attempt": attempt}
        if reason is not None:
            record["reason"] = reason
        self._emit(EVENT_RUN_STATE, **record, **fields)
        return previous
