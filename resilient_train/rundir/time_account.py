"""Where a run's wall time went: every second in exactly one category, from ``events.jsonl`` alone.

Pure: a list of parsed events (docs/events.md) in, a :class:`TimeAccount` out. It lives in
``rundir/`` (below both) because the supervisor's end (summary.json's ``time_account``,
supervisor/finish.py) and the report page (commands/report_page.py) build the same account, so
the run has one goodput. The account partitions the wall time: each category is a set of
intervals that do not overlap, or a measured duration carved out of one, and ``other`` is the
wall time minus the sum of the rest, so the categories add up to the wall time by construction
and a second no event explains is shown as ``other``, never hidden.

The timeline, per attempt ``a`` (its events carry ``attempt``):

* its *start*: the supervisor's ``run_state`` to ``starting`` for ``a`` (else its first
  ``worker_started``, else its first event); its *end*: the next attempt's start, or the end
  of its invocation (a ``resilient-train run``: see :func:`invocation_bounds`);
* its *first step*: ``first_step``; its *training end*: the first of a worker's abnormal
  exit, the ``run_state`` leaving ``running``, a hang's last progress (``hang_detected``'s
  ``seconds`` before it), a stop request (``preemption_requested``, the supervisor's or a
  worker's; a ``run_state`` to ``stopping`` for a ``stop requested``),
  ``training_completed`` / ``training_stopped``; without any, its last event from a worker.

Categories (seconds):

* ``startup``: the attempt's start to its first step, split by the chief's (rank 0's)
  ``startup_phases``, laid back from the first step in order; the time before the chief's
  own clock began (the launch of its process, or a standby's hand-over) is ``launch``; the
  supervisor's own preparation before an invocation's first attempt is ``supervisor``;
  an attempt that never trained is all ``never_trained``. Its phases ``trace`` and
  ``first_call`` are ``tracing``, ``fetch`` and ``restore`` are ``restore``, not start-up;
* ``tracing``, ``restore``: those phases (above);
* ``save_blocking``: inside training, the chief's time blocked by saves: an async save's
  snapshot (``checkpoint_committed``'s ``blocked_ms``) and its wait for the previous upload
  (``checkpoint_waited``'s ``waited_ms``); a sync save's ``commit_s`` (its local write before
  the upload is not measured: it stays in ``productive``);
* ``evaluation``: an epoch end's held-out evaluation (``epoch_finished``'s ``eval_s``);
* ``epoch_ends``: the rest of an epoch end (``epoch_finished``'s ``seconds`` minus its
  evaluation and the blocking of its own save, counted above): callbacks, the epoch-end
  checkpoint's commit wait. A run dir written before these fields has none: its epoch ends
  stay in ``productive``;
* ``slow_rank_wait``: the group's wait for a named straggler (``straggler_detected``): its
  excess busy time per step over the others' median (``busy_ms_per_step`` -
  ``others_ms_per_step``) times the steps trained from the start of its detection window
  (``window_s`` before the event) to the training end. 0 without a ``straggler_detected``:
  a slowness below the detector's threshold is not measured and stays in ``productive``;
* ``replayed``: the time of steps that ran and were discarded by the next attempt's restore
  (``attempt_reached`` of ``a`` minus the next attempt's ``restored`` / ``fresh_start``
  step, summary.json's ``lost_steps``) at the run's step rate (steps over seconds between the
  first and the last ``train_progress`` of each attempt, pooled: ``benchmarks/goodput.py``'s
  rate; without two in any attempt, attempt ``a``'s own: its training over the steps it ran),
  carved out of attempt ``a``'s training, where they ran;
* ``productive``: the rest of each attempt's first step to its training end;
* ``standstill``: from a failure (the training end above: an abnormal exit, a hang's last
  progress, a resize) to the next attempt's start: detection, the rescue, teardown, the
  backoff. The next attempt's own start-up is that attempt's ``startup``/``tracing``/
  ``restore`` (the report page's red band is both: :attr:`TimeAccount.failure_cost_s`);
* ``stopping``: from a stop request (SIGTERM, Ctrl-C, a preemption notice) to the end of its
  invocation: the agreed save and the exit;
* ``finish``: from ``training_completed`` to the end of the invocation: the export, the
  workers' exit, the summary;
* ``between_runs``: the gaps between invocations (the report page's *stopped between runs*:
  no ``run`` was under way);
* ``other``: the wall time minus all of the above (the supervisor's clock starts before its
  first event and stops after its last; an invocation without attempts).

*goodput* = ``productive`` / (wall time - ``between_runs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

__all__ = ["CATEGORIES", "DEFINITIONS", "AttemptAccount", "TimeAccount", "account_time", "invocation_bounds", "last_invocation",
           "restart_costs", "timestamp", "INVOCATION_OPENS", "is_preparing"]

# In the order the report's bar and table show them.
CATEGORIES = ("productive", "startup", "tracing", "restore", "replayed", "standstill", "save_blocking", "evaluation",
              "epoch_ends", "slow_rank_wait", "stopping", "finish", "between_runs", "other")
# Each category in one line: the report page's table says it (the module docstring in full).
DEFINITIONS: Mapping[str, str] = {
    "productive": "each attempt's first step to its training end, less everything below measured inside it",
    "startup": "an attempt's start to its first step, by the chief's startup_phases (launch: before its own "
               "clock; supervisor: before the first attempt), tracing and restore apart",
    "tracing": "the startup phases trace and first_call",
    "restore": "the startup phases fetch and restore",
    "replayed": "steps that ran and a restore discarded (lost_steps), at the run's steps/s",
    "standstill": "a failure (an abnormal exit, a hang's last progress, a resize) to the next attempt's start",
    "save_blocking": "the chief blocked by saves: an async save's snapshot and wait, a sync save's commit",
    "evaluation": "epoch ends' held-out evaluation (epoch_finished eval_s)",
    "epoch_ends": "the rest of the epoch ends (epoch_finished seconds): callbacks, the epoch-end commit's wait",
    "slow_rank_wait": "waiting for a named straggler: its excess busy ms per step times the steps since its window",
    "stopping": "a stop request (SIGTERM, Ctrl-C, a notice) to the end of its run: the agreed save and exit",
    "finish": "training_completed to the end of the run: export, the workers' exit",
    "between_runs": "no resilient-train run under way (stopped between runs)",
    "other": "the wall time minus all the above: no event explains it",
}
# The order start-up runs in (runner/process/startup_phases.py); the table lists phases so.
_PHASE_ORDER = ("supervisor", "launch", "standby_import", "handover", "imports", "bootstrap", "reach_peers",
                "recipe_store", "chief_server", "strategy", "model_build", "setup", "agree", "input", "never_trained")
_PHASE_CATEGORY = {"trace": "tracing", "first_call": "tracing", "fetch": "restore", "restore": "restore"}
_WORKER_ROLES = frozenset({"chief", "worker"})
_LEFT_RUNNING = frozenset({"stopping", "hung", "restarting", "resizing"})

# An invocation's first own event: the supervisor writes one of these once per `run`...
INVOCATION_OPENS = frozenset({"run_started", "run_already_complete"})
# ... and these just before it (supervisor.py _prepare), which belong to it too.
_PREPARING = frozenset({"storage_claimed", "job_changed", "storage_retry"})


def timestamp(record: Mapping[str, Any]) -> float:
    """An event's ``ts`` in epoch seconds; NaN when missing or unreadable."""
    try:
        return datetime.fromisoformat(str(record["ts"])).timestamp()
    except (KeyError, ValueError):
        return math.nan


def is_preparing(e: Mapping[str, Any]) -> bool:
    """An event a supervisor writes before its ``run_started`` (supervisor.py ``_prepare``)."""
    if e.get("role") in _WORKER_ROLES:
        return False
    return e.get("event") in _PREPARING or (e.get("event") == "run_state" and e.get("from") == "preparing")


def invocation_bounds(events: Sequence[Mapping[str, Any]]) -> list[int]:
    """The index of each ``resilient-train run``'s first event: its ``run_started`` (or
    ``run_already_complete``), moved back over the events its supervisor wrote just before it;
    index 0 always opens one (events before any ``run_started``)."""
    opens: list[int] = []
    for i, e in enumerate(events):
        if e.get("event") in INVOCATION_OPENS:
            first = i
            while first > (opens[-1] + 1 if opens else 0) and is_preparing(events[first - 1]):
                first -= 1
            opens.append(first)
    if not opens or opens[0] > 0:
        opens.insert(0, 0)
    return opens


def last_invocation(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The events of the last invocation (what summary.json's ``wall_time_s`` measures)."""
    return list(events[invocation_bounds(events)[-1]:])


@dataclass(frozen=True)
class AttemptAccount:
    """One attempt's seconds per category (only the categories inside attempts), from its start to its end."""

    attempt: int
    start: float  # seconds since the account's origin
    end: float
    seconds: Mapping[str, float]
    phases: Mapping[str, float]  # its startup seconds, by phase
    replayed_steps: int
    ended: str  # "completed", "failure", "stop", "unknown"

    @property
    def span_s(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class TimeAccount:
    """Seconds per category (:data:`CATEGORIES`; they sum to ``wall_s``), per attempt and for the run."""

    wall_s: float
    seconds: Mapping[str, float]
    phases: Mapping[str, float]  # the run's startup, by phase (sums to seconds["startup"])
    attempts: tuple[AttemptAccount, ...]
    replayed_steps: int
    notes: tuple[str, ...] = field(default=())

    @property
    def goodput(self) -> float | None:
        """productive / (wall time - between runs); None when the run was never under way."""
        under_way = self.wall_s - self.seconds["between_runs"]
        return self.seconds["productive"] / under_way if under_way > 0 else None

    @property
    def failure_cost_s(self) -> float:
        """What failures cost: standstill, replayed steps, and the start-up (with tracing and
        restore) of every attempt that followed a failure: ``benchmarks/goodput.py``'s
        ``lost_s``, summed."""
        after_failure = {a.attempt + 1 for a in self.attempts if a.ended == "failure"}
        restarts = sum(a.seconds[c] for a in self.attempts if a.attempt in after_failure
                       for c in ("startup", "tracing", "restore"))
        return self.seconds["standstill"] + self.seconds["replayed"] + restarts

    def to_json(self) -> dict[str, Any]:
        """summary.json's ``time_account`` (docs/events.md)."""
        return {
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "percent": {k: round(100 * v / self.wall_s, 2) if self.wall_s > 0 else 0.0
                        for k, v in self.seconds.items()},
            "startup_phases": {k: round(v, 3) for k, v in self.phases.items()},
            "wall_s": round(self.wall_s, 3),
            "goodput": round(self.goodput, 4) if self.goodput is not None else None,
            "replayed_steps": self.replayed_steps,
            "failure_cost_s": round(self.failure_cost_s, 3),
            "attempts": {str(a.attempt): {"seconds": {k: round(v, 3) for k, v in a.seconds.items() if v},
                                          "ended": a.ended, "replayed_steps": a.replayed_steps}
                         for a in self.attempts},
            "notes": list(self.notes),
        }


def restart_costs(account: TimeAccount) -> list[float]:
    """The seconds each restart inside one invocation cost, in attempt order: from an attempt's
    training end (a failure or a stop) to the next attempt's first step, less the steps it replays
    (a restart after an agreed save replays none): the first attempt's ``standstill`` and ``stopping``,
    the next one's ``startup``, ``tracing`` and ``restore``. A restart whose attempt never trained
    is left out (it has no first step), and so is one across invocations (a gap between runs).
    The straggler policy's measured cost of a restart (runner/health/stragglers.py)."""
    costs = []
    for before, after in zip(account.attempts, account.attempts[1:]):
        if before.ended not in ("failure", "stop") or before.end != after.start or "never_trained" in after.phases:
            continue
        costs.append(sum(before.seconds.get(c, 0.0) for c in ("standstill", "stopping"))
                     + sum(after.seconds.get(c, 0.0) for c in ("startup", "tracing", "restore")))
    return costs


class _Ledger:
    """Seconds per category and startup phase, filled interval by interval."""

    def __init__(self) -> None:
        self.seconds = {c: 0.0 for c in CATEGORIES}
        self.phases: dict[str, float] = {}

    def add(self, category: str, seconds: float, phase: str | None = None) -> None:
        seconds = max(0.0, seconds)
        self.seconds[category] += seconds
        if phase is not None:
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def merge(self, other: "_Ledger") -> None:
        for c, v in other.seconds.items():
            self.seconds[c] += v
        for p, v in other.phases.items():
            self.phases[p] = self.phases.get(p, 0.0) + v


def account_time(events: Sequence[Mapping[str, Any]], *, wall_s: float | None = None,
                 gaps: Sequence[tuple[float, float]] = ()) -> TimeAccount:
    """The account of ``events`` (file order). ``wall_s``: the wall time to account for, from the
    first event (default: first to last event); ``gaps``: (start, end) seconds since the first
    event when no run was under way (the report page's gaps between invocations)."""
    times = [timestamp(e) for e in events]
    known = [t for t in times if not math.isnan(t)]
    t0 = min(known) if known else 0.0
    rel = [t - t0 for t in times]
    span = (max(known) - t0) if known else 0.0
    wall = span if wall_s is None else float(wall_s)
    run = _Ledger()
    notes: list[str] = []
    for start, end in gaps:
        run.add("between_runs", min(end, wall) - max(0.0, start))

    bounds = [*invocation_bounds(events), len(events)]
    invocations = [(first, stop) for first, stop in zip(bounds, bounds[1:]) if stop > first]
    rate = _pooled_rate(events, rel)
    attempts: list[AttemptAccount] = []
    for first, stop in invocations:
        inv_times = [rel[i] for i in range(first, stop) if not math.isnan(rel[i])]
        if not inv_times:
            continue
        inv_start, inv_end = min(inv_times), max(inv_times)
        mine = [(rel[i], events[i]) for i in range(first, stop) if not math.isnan(rel[i])]
        numbers = sorted({e["attempt"] for _, e in mine if isinstance(e.get("attempt"), int)
                          and not isinstance(e.get("attempt"), bool)})
        starts = {a: _attempt_start(mine, a) for a in numbers}
        if numbers:
            run.add("startup", starts[numbers[0]] - inv_start, "supervisor")
        for n, a in enumerate(numbers):
            end = starts[numbers[n + 1]] if n + 1 < len(numbers) else inv_end
            ledger, account = _attempt(a, starts[a], end, mine, events, rel, rate)
            run.merge(ledger)
            attempts.append(account)
    stragglers = [e for e in events if e.get("event") == "straggler_detected"]
    if not stragglers:
        notes.append("slow_rank_wait: no straggler_detected, so 0 (a slowness under the detector's threshold "
                     "is not measured and stays in productive)")
    if not any(e.get("event") == "epoch_finished" and "seconds" in e for e in events) and \
            any(e.get("event") == "epoch_finished" for e in events):
        notes.append("epoch_ends, evaluation: these events carry no seconds (an older run dir), so 0: "
                     "their time stays in productive")
    accounted = sum(v for c, v in run.seconds.items() if c != "other")
    run.seconds["other"] = wall - accounted
    replayed_steps = sum(a.replayed_steps for a in attempts)
    order = {name: n for n, name in enumerate(_PHASE_ORDER)}
    phases = dict(sorted(run.phases.items(), key=lambda item: order.get(item[0], len(order))))
    return TimeAccount(wall, dict(run.seconds), phases, tuple(attempts), replayed_steps, tuple(notes))


def _attempt_start(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int) -> float:
    for name in ("run_state", "worker_started"):
        for t, e in mine:
            if e.get("attempt") == a and e.get("event") == name and (name != "run_state" or e.get("to") == "starting"):
                return t
    return min(t for t, e in mine if e.get("attempt") == a)


def _of(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int, name: str) -> list[tuple[float, Mapping[str, Any]]]:
    return [(t, e) for t, e in mine if e.get("attempt") == a and e.get("event") == name]


def _is_chief(e: Mapping[str, Any]) -> bool:
    return e.get("role") == "chief" or (e.get("rank") == 0 and e.get("role") != "supervisor")


def _training_end(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int, first_step: float,
                  end: float) -> tuple[float, str]:
    """(when attempt ``a`` stopped training, why: "failure", "stop", "completed", "unknown")."""
    found: list[tuple[float, str]] = []
    for t, e in mine:
        name = e.get("event")
        if e.get("attempt") != a and name != "preemption_requested":
            continue
        if name == "worker_exited" and (e.get("signal") or e.get("exit_code") not in (0, 143)) \
                and e.get("state") != "killed":
            found.append((t, "failure"))
        elif name == "run_state" and e.get("from") == "running" and e.get("to") in _LEFT_RUNNING:
            found.append((t, "stop" if str(e.get("reason", "")).startswith("stop requested") else "failure"))
        elif name == "hang_detected" and isinstance(e.get("seconds"), (int, float)):
            found.append((t - float(e["seconds"]), "failure"))
        elif name == "preemption_requested" and first_step <= t <= end:  # the supervisor's, or a worker's
            found.append((t, "stop"))
        elif name in ("training_completed", "training_stopped") and _is_chief(e):
            found.append((t, "completed"))
    found = [(max(first_step, min(t, end)), why) for t, why in found]
    if found:
        # Ties: a stop request and the run_state it causes are one stop, not a failure.
        return min(found, key=lambda f: (f[0], f[1] != "stop"))
    workers = [t for t, e in mine if e.get("attempt") == a and e.get("role") in _WORKER_ROLES]
    return (max([first_step, *workers]) if workers else end), "unknown"


def _attempt(a: int, start: float, end: float, mine: Sequence[tuple[float, Mapping[str, Any]]],
             events: Sequence[Mapping[str, Any]], rel: Sequence[float],
             rate: float | None) -> tuple[_Ledger, AttemptAccount]:
    ledger = _Ledger()
    firsts = [t for t, _ in _of(mine, a, "first_step")]
    if not firsts or not start <= firsts[0] <= end:
        ledger.add("startup", end - start, "never_trained")
        return ledger, AttemptAccount(a, start, end, dict(ledger.seconds), dict(ledger.phases), 0, "unknown")
    first_step = firsts[0]
    _startup(ledger, _of(mine, a, "startup_phases"), start, first_step)
    train_end, ended = _training_end(mine, a, first_step, end)
    training = train_end - first_step
    carved = _carve(mine, a, first_step, train_end)
    lost_steps, reached = _lost_steps(events, a)
    if lost_steps:
        # the run's rate; without two train_progress in any attempt, this attempt's own average
        first_global = next((e.get("global_step") for _, e in _of(mine, a, "first_step")), None)
        steps_run = reached - first_global + 1 if isinstance(first_global, int) else 0
        per_step = 1.0 / rate if rate else (training / steps_run if steps_run > 0 else 0.0)
        carved["replayed"] = lost_steps * per_step
    remaining = training
    for category in ("save_blocking", "evaluation", "epoch_ends", "slow_rank_wait", "replayed"):
        take = min(max(0.0, carved.get(category, 0.0)), remaining)
        ledger.add(category, take)
        remaining -= take
    ledger.add("productive", remaining)
    after = {"failure": "standstill", "stop": "stopping", "completed": "finish"}.get(ended, "finish")
    ledger.add(after, end - train_end)
    return ledger, AttemptAccount(a, start, end, dict(ledger.seconds), dict(ledger.phases), lost_steps, ended)


def _startup(ledger: _Ledger, reports: Sequence[tuple[float, Mapping[str, Any]]], start: float,
             first_step: float) -> None:
    """The start to the first step, by the chief's phases laid back from the first step."""
    window = max(0.0, first_step - start)
    chief = [e for _, e in reports if e.get("rank") == 0] or [e for _, e in reports]
    phases = chief[0].get("phases") if chief else None
    left, taken = window, []
    if isinstance(phases, Mapping):
        for name, seconds in reversed(list(phases.items())):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
                continue
            take = min(max(0.0, float(seconds)), left)
            taken.append((name, take))
            left -= take
    ledger.add("startup", left, "launch")
    for name, take in reversed(taken):  # in the order they ran
        category = _PHASE_CATEGORY.get(name, "startup")
        ledger.add(category, take, name if category == "startup" else None)


def _carve(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int, lo: float, hi: float) -> dict[str, float]:
    """The measured non-training time inside [lo, hi] of attempt ``a`` (module docstring)."""
    inside = [(t, e) for t, e in mine if e.get("attempt") == a and lo <= t <= hi]
    blocking: dict[Any, float] = {}  # global step -> seconds the save of that step blocked
    for _, e in inside:
        if not _is_chief(e):
            continue
        step = e.get("global_step")
        if e.get("event") == "checkpoint_committed":
            blocked = e.get("blocked_ms")
            seconds = blocked / 1000 if isinstance(blocked, (int, float)) else e.get("commit_s")
            if isinstance(seconds, (int, float)):
                blocking[step] = blocking.get(step, 0.0) + float(seconds)
        elif e.get("event") == "checkpoint_waited" and isinstance(e.get("waited_ms"), (int, float)):
            blocking[step] = blocking.get(step, 0.0) + float(e["waited_ms"]) / 1000
    carved = {"save_blocking": sum(blocking.values()), "evaluation": 0.0, "epoch_ends": 0.0, "slow_rank_wait": 0.0}
    for _, e in inside:
        if e.get("event") != "epoch_finished" or e.get("after_restore") or not isinstance(e.get("seconds"), (int, float)):
            continue
        evaluation = float(e["eval_s"]) if isinstance(e.get("eval_s"), (int, float)) else 0.0
        own_save = blocking.get(e.get("global_step"), 0.0)
        carved["evaluation"] += evaluation
        carved["epoch_ends"] += max(0.0, float(e["seconds"]) - evaluation - own_save)
    for t, e in inside:
        if e.get("event") != "straggler_detected":
            continue
        busy, others = e.get("busy_ms_per_step"), e.get("others_ms_per_step")
        if not isinstance(busy, (int, float)) or not isinstance(others, (int, float)):
            continue
        window = float(e["window_s"]) if isinstance(e.get("window_s"), (int, float)) else 0.0
        steps = _steps_in(mine, a, max(lo, t - window), hi)
        carved["slow_rank_wait"] += max(0.0, busy - others) / 1000 * steps
    return carved


def _progress(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int) -> list[tuple[float, int]]:
    """(time, global step) of attempt ``a``'s first step and train_progress events."""
    return [(t, int(e["global_step"])) for t, e in mine if e.get("attempt") == a
            and e.get("event") in ("first_step", "train_progress") and isinstance(e.get("global_step"), int)]


def _steps_in(mine: Sequence[tuple[float, Mapping[str, Any]]], a: int, lo: float, hi: float) -> float:
    """Steps attempt ``a`` trained between ``lo`` and ``hi``, interpolated between its progress events."""
    points = _progress(mine, a)
    if not points:
        return 0.0
    return max(0.0, _step_at(points, hi) - _step_at(points, lo))


def _step_at(points: Sequence[tuple[float, int]], t: float) -> float:
    if t <= points[0][0]:
        return float(points[0][1])
    for (t1, s1), (t2, s2) in zip(points, points[1:]):
        if t1 <= t <= t2:
            return s1 + (s2 - s1) * ((t - t1) / (t2 - t1) if t2 > t1 else 1.0)
    return float(points[-1][1])


def _pooled_rate(events: Sequence[Mapping[str, Any]], rel: Sequence[float]) -> float | None:
    """Steps over seconds between the first and the last ``train_progress`` of each attempt,
    pooled (benchmarks/goodput.py ``steps_per_s``); None without two of one attempt."""
    spans: dict[int, list[tuple[float, int]]] = {}
    for t, e in zip(rel, events):
        if e.get("event") == "train_progress" and isinstance(e.get("attempt"), int) \
                and isinstance(e.get("global_step"), int) and not math.isnan(t):
            spans.setdefault(e["attempt"], []).append((t, e["global_step"]))
    steps = seconds = 0.0
    for points in spans.values():
        steps += points[-1][1] - points[0][1]
        seconds += points[-1][0] - points[0][0]
    return steps / seconds if seconds > 0 and steps > 0 else None


def _lost_steps(events: Sequence[Mapping[str, Any]], a: int) -> tuple[int, int]:
    """(steps attempt ``a`` ran that attempt ``a+1``'s restore discarded: summary.json's
    ``lost_steps``, the step ``a`` reached); (0, 0) when the events do not say."""
    reached = [e.get("global_step") for e in events if e.get("event") == "attempt_reached" and e.get("attempt") == a]
    resumed = [e.get("global_step") for e in events if e.get("event") in ("restored", "fresh_start")
               and e.get("attempt") == a + 1]
    if not reached or not resumed or not isinstance(reached[-1], int) or not isinstance(resumed[0], int):
        return 0, 0
    return max(0, reached[-1] - resumed[0]), reached[-1]

