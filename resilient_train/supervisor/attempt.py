"""One attempt of a run, and what the supervisor's transitions carry from one state to the next.

The supervisor (supervisor/supervisor.py) keeps everything it knows about the attempt it is
running in one :class:`Attempt`: created when STARTING has started the workers, replaced by
the next attempt's, so nothing of one attempt (a hang, a resize under way, a worker's
restarts in place) can leak into the next. What a state needs from the transition that
entered it travels with that transition (``RunStateMachine.transition(..., carrying=...)``,
supervisor/state.py), in the manner of Ray Train v2's ``RestartingState(error)``:

    RUNNING -> HUNG          the watchdog's :class:`~resilient_train.supervisor.watchdog.Stall`
    RUNNING -> RESIZING      a :class:`Resize` (the size the group grows to, and why)
    STOPPING -> RESTARTING   a :class:`Restart` (the policy's decision, and the next size)
    RESTARTING -> STARTING   the :class:`Resize` a membership change decided, or None

So a step cannot act on data its state was entered without; no field is written in one
state to be read in another.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from resilient_train.supervisor.launchers import WorkerHandle
from resilient_train.supervisor.policy import Decision
from resilient_train.supervisor.state import WorkerState
from resilient_train.supervisor.watchdog import Stall

if TYPE_CHECKING:  # supervisor/rescue.py imports Worker from here
    from resilient_train.supervisor.rescue import RescueWait

__all__ = ["Worker", "Attempt", "Resize", "Restart", "Carried"]


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
class Restart:
    """What RESTARTING carries out: the policy's decision and, after a membership change,
    the size the next attempt starts at (None: as many as the launcher can place)."""

    decision: Decision
    resize: Resize | None = None


# What a transition carries into the state it enters (supervisor/state.py holds it until the next):
# STARTING after a membership change and RESIZING a Resize, HUNG the Stall, RESTARTING the Restart.
Carried: TypeAlias = Resize | Restart | Stall | None


@dataclass
class Attempt:
    """The attempt the supervisor runs: its workers and what happened to it so far."""

    number: int
    size: int  # workers (processes of the group) it was started with
    workers: list[Worker]
    watched_at: float  # when the hang watchdog last read the step and phase markers
    hang: dict[str, Any] | None = None  # HUNG named the stuck rank: hang_detected's fields
    resize: Resize | None = None  # RESIZING asked the group to save and stop for this resize
    restarts_in_place: Counter[int] = field(default_factory=Counter)  # rank -> restarts (parameter-server tier)
    rescue: RescueWait | None = None  # a survivor's rescue answer being waited for (supervisor/rescue.py)
    rescue_answer: dict[str, Any] | None = None  # its rescue_committed / rescue_skipped, once it came
