"""``--straggler-policy replace``: the chief's decision on a named straggler, and the way it acts.

The detector (runner/health/stragglers.py) names a slow rank on every worker; the chief decides
(:func:`~resilient_train.runner.health.stragglers.decide_replace`, pure) with what only the run's
record holds: the cost of this run's own restarts (its ``events.jsonl``, read through
rundir/time_account.py ``restart_costs``) and when this rank was last replaced (the newest
``straggler_detected`` of action ``replace`` for it, ``--straggler-cooldown``). The numbers go
into ``straggler_detected`` under either policy, so a ``warn`` run says what a replace would win.

Acting reuses the preemption-notice path (runner/process/preemption_notices.py), not a second
one: a ``notice-<rank>.json`` marker for the slow rank, of provider ``straggler`` (kind
``replace``, ``host``: the rank's TF_CONFIG host, Slurm's node name), and this worker's stop
request, so the group saves at an agreed step (zero lost steps) and every worker exits 143.
The supervisor reads the marker as it reads a cloud's: Ray and Slurm place no worker of the run
on that node again (supervisor/launchers/api.py ``avoid_noticed``) and restart the group; the
local launcher cannot place a worker elsewhere, so its restart starts a fresh process on the
same host (a new pid: what throttled the old one, a stop/continue duty cycle, a quota on that
process, is gone; a slow host is not). A straggler's host is not going away: the local
launcher does not read this marker as a doomed host (launchers/local.py ``host_doomed``), and
the supervisor says what moved in ``straggler_replaced`` (supervisor/supervisor.py).

Like the transient-anomaly count (runner/health/anomaly_policy.py), the history is read from the
run dir's ``events.jsonl`` on the chief's side: where a launcher's nodes share no run dir with
the supervisor, the chief sees only its own node's events (no measured restart: the estimate).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

from resilient_train.job.config import STRAGGLER_PROVIDER
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.events import read_events
from resilient_train.rundir.layout import AttemptDir
from resilient_train.rundir.time_account import account_time, restart_costs, timestamp
from resilient_train.runner.health.stragglers import REPLACE, WARN, ReplaceDecision, Straggler, decide_replace

__all__ = ["StragglerReplacement", "STOP_SOURCE"]

STOP_SOURCE = "straggler"  # preemption_requested's source: "straggler:<rank>"


class StragglerReplacement:
    """The chief's side of ``--straggler-policy`` (see the module docstring).

    ``attempt_dir``: where the marker goes (None: nowhere, and never ``replace``); ``events``: the
    run's ``events.jsonl``; ``wall_clock``: epoch seconds (the events' ``ts``; injected by tests)."""

    def __init__(self, policy: str, cooldown_s: float, *, attempt_dir: Path | None, events: Path | None,
                 run_id: str, wall_clock: Callable[[], float] = time.time) -> None:
        self.policy, self.cooldown_s = policy, cooldown_s
        self._attempt_dir, self._events, self._run_id, self._wall_clock = attempt_dir, events, run_id, wall_clock
        self.replacing: Straggler | None = None  # the rank this attempt replaces, once decided

    def decide(self, straggler: Straggler) -> ReplaceDecision:
        """The policy's decision on ``straggler``, with its numbers."""
        costs, since = self._history(straggler.rank)
        decision = decide_replace(straggler, policy=self.policy, restart_costs=costs, cooldown_s=self.cooldown_s,
                                  since_acted_s=since,
                                  busy_with=self.replacing.rank if self.replacing is not None else None)
        if decision.action == REPLACE and self._attempt_dir is None:  # a fit script's own process: no supervisor
            return dataclasses.replace(decision, action=WARN,
                                       reason="no supervisor to restart the group (no attempt directory)")
        return decision

    def replace(self, straggler: Straggler, decision: ReplaceDecision) -> None:
        """Write the slow rank's marker and ask this worker to stop (the group's agreed save)."""
        assert self._attempt_dir is not None and decision.action == REPLACE
        write_atomic(AttemptDir.at(self._attempt_dir).notice(straggler.rank), json.dumps({
            "provider": STRAGGLER_PROVIDER, "kind": REPLACE, "host": straggler.host, "rank": straggler.rank,
            "global_step": straggler.global_step, "gain_s": decision.gain_s,
            "restart_cost_s": decision.restart_cost_s}))
        self.replacing = straggler

    def stop_requested(self) -> bool:
        return self.replacing is not None

    def source(self) -> str | None:
        """``preemption_requested``'s source once a replace is decided (``straggler:<rank>``)."""
        return f"{STOP_SOURCE}:{self.replacing.rank}" if self.replacing is not None else None

    def _history(self, rank: int) -> tuple[Sequence[float], float | None]:
        """(this run's measured restart costs, seconds since ``rank`` was last replaced or None)."""
        if self._events is None:
            return [], None
        try:
            records = [r for r in read_events(self._events) if r.get("run_id") == self._run_id]
            costs = restart_costs(account_time(records))
        except (OSError, ValueError, KeyError, TypeError):  # an unreadable record: the estimate, no cooldown known
            return [], None
        acted = [timestamp(r) for r in records if r.get("event") == "straggler_detected"
                 and r.get("action") == REPLACE and r.get("rank") == rank]
        acted = [t for t in acted if not math.isnan(t)]
        return costs, (max(0.0, self._wall_clock() - max(acted)) if acted else None)

