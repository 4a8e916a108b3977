"""The elastic decisions (``--workers MIN:MAX``), as one policy object with typed decisions.

The supervisor loop asks and acts; the policy decides, from the job's sizes and the
launcher's capacity, and touches nothing else (no events, no signals):

* ``room_to_grow``: RUNNING below MAX, once the attempt trains, every CAPACITY_EVERY_S: a
  :class:`Resize` to the larger size the launcher can place now (-> RESIZING), or None.
* ``notice_elsewhere``: a preemption notice from a worker's node that is not the
  supervisor's, or a replaced straggler's marker (runner/health/straggler_replace.py) (Ray, Slurm:
  launchers/api.py ``avoid_noticed``): a :class:`NodeAvoided`
  saying what the run does without that node: ``stop`` (fewer than MIN placeable: 143 as
  on a notice for this host), ``restart`` (a fixed-size run that still fits: the attempt
  ends 143 and restarts elsewhere as a preemption), ``shrink`` or ``move`` (elastic: a
  planned resize, settled as a membership change).
* ``membership_change``: STOPPING settles an attempt whose ending was a membership change,
  not a failure: a clean stop for a resize, or a broken group whose launcher now places
  fewer workers than it had but at least MIN (a node lost, no spare). The :class:`Resize`
  the next attempt starts at, or None (anything else, and any fatal error).

Membership changes spend no restart budget (policy.py), as in torch elastic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from resilient_train.job.config import STRAGGLER_PROVIDER, JobConfig
from resilient_train.rundir.layout import AttemptDir
from resilient_train.supervisor.attempt import Resize, Stop
from resilient_train.supervisor.launchers import Launcher
from resilient_train.supervisor.launchers.api import read_notices
from resilient_train.supervisor.policy import AttemptOutcome, ExitClass

__all__ = ["ElasticPolicy", "NodeAvoided", "CAPACITY_EVERY_S"]

CAPACITY_EVERY_S = 1.0  # how often an elastic run below MAX asks the launcher for room


@dataclass(frozen=True)
class NodeAvoided:
    """The decision on a preemption notice elsewhere: ``node_avoided``'s fields, and what follows."""

    nodes: list[str]
    providers: list[str]
    placeable: int  # workers the launcher can place without those nodes (at most the attempt's size)
    action: str  # stop | restart | shrink | move (see the module docstring)
    resize: Resize | None  # shrink or move: the resize the group goes through (RESIZING)

    @property
    def stop_source(self) -> str | None:
        """``stop``: the stop request's source (``notice:<provider>``); None otherwise."""
        return f"notice:{self.providers[0]}" if self.action == "stop" else None


class ElasticPolicy:
    """Decides the elastic membership changes of one run (see the module docstring)."""

    def __init__(self, job: JobConfig, launcher: Launcher, clock: Callable[[], float]) -> None:
        self._job = job
        self._launcher = launcher
        self._clock = clock
        self._asked_at = 0.0  # room_to_grow asks the launcher at most every CAPACITY_EVERY_S

    def placeable(self) -> int:
        """min(MAX, the launcher's capacity): the size to start an attempt at."""
        capacity = self._launcher.capacity()
        return self._job.workers if capacity is None else min(self._job.workers, capacity)

    def room_to_grow(self, size: int, training: Callable[[], bool]) -> Resize | None:
        """Elastic, below MAX and ``training()``: a resize to the larger size the launcher can
        place now, if any (asked every CAPACITY_EVERY_S)."""
        if not self._job.elastic or size >= self._job.workers:
            return None
        now = self._clock()
        if now - self._asked_at < CAPACITY_EVERY_S or not training():
            return None
        self._asked_at = now
        placeable = self.placeable()
        if placeable <= size:
            return None
        return Resize(placeable, f"capacity returned: the launcher can place {placeable} workers")

    def notice_elsewhere(self, attempt_dir: AttemptDir, size: int) -> NodeAvoided | None:
        """The attempt (of ``size`` workers) got a notice from a node the launcher can avoid:
        what the run does without it. None while nothing was noticed, on a doomed host (the
        supervisor stops the run when it settles) and where the launcher cannot avoid a node."""
        if not attempt_dir.notices():
            return None
        if self._launcher.host_doomed(attempt_dir) is not None:
            return None
        nodes = self._launcher.avoid_noticed(attempt_dir)
        if not nodes:
            return None
        providers = sorted({str(f.get("provider") or "unknown") for f in read_notices(attempt_dir).values()})
        placeable = min(self.placeable(), size)
        why = (f"a straggler replaced off node {', '.join(nodes)}" if providers == [STRAGGLER_PROVIDER]
               else f"preemption notice ({', '.join(providers)}) on node {', '.join(nodes)}")
        if placeable < self._job.world_sizes.start:
            action = "stop"
        elif not self._job.elastic:
            action = "restart"
        else:
            action = "shrink" if placeable < size else "move"
        resize = (Resize(placeable, f"{why}: the group continues without it at {placeable} workers")
                  if action in ("shrink", "move") else None)
        return NodeAvoided(nodes, providers, placeable, action, resize)

    def membership_change(self, outcome: AttemptOutcome, stop: Stop, size: int) -> Resize | None:
        """The resize the next attempt starts at when the attempt (of ``size`` workers) that
        ``stop`` ended is an elastic membership change; None for any other ending.

        Two cases, neither a failure: the group stopped cleanly for a resize (RESIZING), or
        it broke and the launcher can now place fewer workers than it had but at least MIN
        (a node lost, no spare; the lost worker is why it broke). Anything else, and any
        fatal error, stays what it was.
        """
        if not self._job.elastic or outcome.exit_class is ExitClass.FATAL:
            return None
        if stop.resize is not None:
            # the resize stop went wrong (not a clean 143): settle it as what it was
            return stop.resize if outcome.exit_class is ExitClass.PREEMPTED else None
        placeable = self.placeable()
        if self._job.world_sizes.start <= placeable < size:
            return Resize(placeable, f"capacity fell: the launcher can place {placeable} of {size} workers")
        return None
