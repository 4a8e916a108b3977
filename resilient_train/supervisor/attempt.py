"""One attempt of a run, and what the supervisor's transitions carry from one state to the next.

The supervisor (supervisor/supervisor.py) keeps everything it knows about the attempt it is
running in one :class:`Attempt`: created when STARTING has started the workers, replaced by
the next attempt's, so nothing of one attempt (a worker's restarts in place, its markers)
can leak into the next. What a state needs from the transition that entered it travels with
that transition (``RunStateMachine.transition(..., carrying=...)``, supervisor/state.py), in
the manner of Ray Train v2's ``RestartingState(error)``:

    PREPARING -> STARTING    a :class:`Start`: the number of the first attempt
    RUNNING -> HUNG          the watchdog's :class:`~resilient_train.supervisor.watchdog.Stall`
    RUNNING -> RESIZING      a :class:`Resize` (the size the group grows or shrinks to, and why)
    RUNNING -> STOPPING      a :class:`Stop`: why (a failure, everyone exited, a stop request)
                             and, with the memory tier, the rescuer's answer
    HUNG -> STOPPING         a :class:`Stop` with the hang (hang_detected's fields) and the
                             rescuer's answer
    RESIZING -> STOPPING     a :class:`Stop` with the :class:`Resize` being carried out
    STOPPING -> RESTARTING   a :class:`Restart` (the policy's decision, and the next size)
    RESTARTING -> STARTING   a :class:`Start`: the next number, and the :class:`Resize` a
                             membership change decided, or None
    STARTING, STOPPING -> FAILED   a :class:`Failed`: whether the error was fatal (the exit code)

So a step cannot act on data its state was entered without; no field is written in one
state to be read in another. The one input that can arrive in any state, a request to stop
(SIGTERM, the launcher, a notice), is not carried: it is the supervisor's ``StopRequest``
(supervisor/signals.py), set once and read where it matters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, TypeAlias

from resilient_train.supervisor.launchers import WorkerHandle
from resilient_train.supervisor.policy import Decision
from resilient_train.supervisor.state import RunState, WorkerState
from resilient_train.supervisor.watchdog import Stall

if TYPE_CHECKING:  # supervisor/rescue.py imports Worker from here
    from resilient_train.supervisor.rescue import RescueWait

__all__ = ["Worker", "Attempt", "Start", "Resize", "StopCause", "Stop", "Restart", "Failed", "Carried", "CARRIED_BY",
           "expect_carried"]


@dataclass
class Worker:
    """One process of an attempt, as the supervisor sees it."""

    rank: int
    attempt: int
    process: WorkerHandle
    log_path: Path
    state: WorkerState = WorkerState.RUNNING
    returncode: int | None = None
    exit_time: float | None = None
    frozen: bool = False  # SIGSTOPped (a chaos fault, a debugger) when we had to SIGKILL it
    address: str | None = None  # where its peers reach it (host:port, or the node's IP), when the launcher says


@dataclass(frozen=True)
class Resize:
    """An elastic membership change: the next attempt starts ``size`` workers, because ``reason``."""

    size: int
    reason: str


@dataclass(frozen=True)
class Start:
    """What STARTING carries in: the number of the attempt to start and, after a membership
    change, the size it starts at (None: as many as the launcher can place)."""

    number: int
    resize: Resize | None = None


class StopCause(str, Enum):
    """Why STOPPING was entered."""

    EXITED = "exited"  # every worker exited, and the run is not complete
    FAILURE = "failure"  # a worker (the parameter-server tier: a role) failed
    REQUEST = "request"  # a stop was requested (StopRequest, supervisor/signals.py)
    HANG = "hang"  # the watchdog found no progress (HUNG)
    RESIZE = "resize"  # an elastic resize asked the group to save and stop (RESIZING)


@dataclass(frozen=True)
class Stop:
    """What STOPPING carries in: why the attempt stops (``reason`` is the transition's), and
    what the teardown and the settling need to know of it."""

    cause: StopCause
    reason: str
    hang: dict[str, Any] | None = None  # HANG: the stuck rank, hang_detected's fields
    resize: Resize | None = None  # RESIZE: the membership change being carried out
    rescue_answer: dict[str, Any] | None = None  # memory tier: the rescuer's rescue_committed / rescue_skipped

    def __post_init__(self) -> None:
        if (self.hang is not None) != (self.cause is StopCause.HANG):
            raise ValueError(f"Received cause={self.cause.value} with hang={self.hang!r}; only a hang carries one")
        if (self.resize is not None) != (self.cause is StopCause.RESIZE):
            raise ValueError(f"Received cause={self.cause.value} with resize={self.resize!r}; only a resize carries one")


@dataclass(frozen=True)
class Restart:
    """What RESTARTING carries out: the policy's decision and, after a membership change,
    the size the next attempt starts at (None: as many as the launcher can place)."""

    decision: Decision
    resize: Resize | None = None


@dataclass(frozen=True)
class Failed:
    """What FAILED carries: whether the run failed on a fatal error (EXIT_FATAL, not EXIT_FAILURE)."""

    fatal: bool = False


# What a transition carries into the state it enters (supervisor/state.py holds it until the next);
# the module docstring lists which state takes which.
Carried: TypeAlias = Start | Resize | Stall | Stop | Restart | Failed | None

# The one type each state is entered carrying (a state not listed carries nothing): the loop
# checks every transition against it (``expect_carried``).
CARRIED_BY: Mapping[RunState, type] = MappingProxyType({
    RunState.STARTING: Start,
    RunState.HUNG: Stall,
    RunState.RESIZING: Resize,
    RunState.STOPPING: Stop,
    RunState.RESTARTING: Restart,
    RunState.FAILED: Failed,
})


def expect_carried(state: RunState, carrying: Carried) -> None:
    """RuntimeError (a bug in the loop, like an illegal transition) unless ``carrying`` is what
    ``state`` is entered with."""
    expected = CARRIED_BY.get(state, type(None))
    if not isinstance(carrying, expected):
        raise RuntimeError(f"{state.value} is entered carrying a {expected.__name__}, not {carrying!r}")


@dataclass
class Attempt:
    """The attempt the supervisor runs: its workers and what happens to it while it runs."""

    number: int
    size: int  # workers (processes of the group) it was started with
    workers: list[Worker]
    watched_at: float  # when the hang watchdog last read the step and phase markers
    # (rank, step marker, phase marker) of each watched worker, read every WATCH_EVERY_S
    # (built once: benchmarks/supervisor_scaling.py)
    markers: list[tuple[int, str, str]] = field(default_factory=list)
    restarts_in_place: Counter[int] = field(default_factory=Counter)  # rank -> restarts (parameter-server tier)
    # A survivor's rescue answer being waited for, within one step (RUNNING or HUNG; supervisor/rescue.py)
    rescue: RescueWait | None = None
