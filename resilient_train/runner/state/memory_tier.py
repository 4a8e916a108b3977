"""The memory tier: every worker's newest snapshot of the whole state, and its rescue.

Under MultiWorkerMirroredStrategy every worker holds the whole model and optimizer state,
so when one worker dies the survivors still have everything a checkpoint needs. With
``--snapshot-every N`` every worker (not only the chief) keeps a twin of the saved state
(runner/state/checkpointing.py) and snapshots into it at agreed call boundaries; when the
supervisor sees a worker die it asks the lowest-ranked survivor (rundir/rescue_signal.py)
to commit that snapshot as an ordinary checkpoint, so the gang restart resumes from it and
loses at most about N steps instead of a save interval.

Why a snapshot and never the live variables: a survivor's next collective only fails
seconds after a peer's death (TensorFlow's heartbeat), and after that failed call its live
state is torn (weights of step s, ``optimizer.iterations`` of s+1). The snapshot was taken
at a call boundary before the failure, by the training thread, and is marked complete only
after its assign returned; a snapshot interrupted mid-way is never committed.

# Implementation:
#   schedule (training thread, every worker alike)
#     SnapshotSchedule: with an explicit N a call ends where global_step reaches last
#     snapshot + N (like a save point), and a snapshot is due there (auto: due at the end of
#     the call that reaches it; calls are not cut); any save is also a snapshot and restarts
#     the interval. Every input of the rule is agreed (steps, saves), so all workers
#     snapshot at the same steps (a snapshot may all-reduce: iterator states,
#     sync-on-read variables).
#   the input's capture (iterator_state path only: runner/input/reentry.py)
#     a tf.data iterator state is the dear part of a snapshot (recipes/digits_cnn.py: its
#     ~570 KB shuffle buffer, 50-70 ms, against ~1 ms for the variables), so a snapshot
#     captures it only every capture_every steps (and at the first snapshot after a new
#     iterator); the others carry the newest capture of the same iterator, whose manifest
#     extra says the step it was taken at, and a restore replays the batches in between
#     (at most capture_every; the input pipeline only, no training). Mid-epoch saves capture
#     on the same interval (a preemption save always does: its restore comes next).
#   auto (the default, --snapshot-every auto; decided early in each attempt, revised as the step time moves)
#     until decided, a snapshot (with a capture) is due after every call; the chief times
#     the first AUTO_PROBES of them, the capture apart (the first includes tracing and is not
#     counted), and knows its per-step time (runner/training/call_size.py); then it proposes
#       every         = ceil(rest_s / ((1 - CAPTURE_SHARE) * SNAPSHOT_BUDGET * step_s)), rounded up
#                       to a whole number of calls (a snapshot mid-call would cut the call in two)
#                       (the whole budget where there is nothing to capture: other input paths)
#       capture_every = every * ceil(capture_s / (CAPTURE_BUDGET * step_s) / every)
#                       (the captures' own budget: mid-epoch saves capture on this interval too,
#                       runner/state/saving.py _save_captures, so it also bounds what any restore replays)
#     in the call's packed all-reduce (two columns beside the next call's size: no extra
#     collective), and every worker adopts the SUMs it reads (only the chief adds them), at
#     the same call, so the intervals are the same everywhere. Early steps may be slow (the
#     warm standbys import TensorFlow beside them: 155 ms against 4 ms later, measured), so
#     the chief keeps timing: when its per-step time stays over REVISE_RATIO from the one it
#     decided with for REVISE_CALLS calls in a row, it proposes again from the newest
#     snapshot times, the same way (event snapshot_interval_revised). An explicit N captures at
#     every snapshot. A --config key, snapshot_capture_every, sets the capture interval of either.
#   rescue (the rescue listener's thread, on the supervisor's request)
#     hold the twin: no new snapshot starts; wait (bounded) for one in progress and for
#     this worker's in-flight persist (which reads the twin); then
#       no complete snapshot / not newer than the newest commit  -> rescue_skipped(reason, drained)
#       else commit it through the store's ordinary path (persist_twin: manifest last,
#       fence-checked), extra["rescue"] = {rank, snapshot_age_s} -> rescue_committed
#     a commit that raises -> rescue_skipped naming the error (RescueUnavailable: its reason)
#   The live variables are never read by the rescue.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from resilient_train.rundir.events import emit as _default_emit
from resilient_train.rundir.rescue_signal import RESCUE_COMMITTED, RESCUE_SKIPPED

__all__ = ["SnapshotSchedule", "Snapshot", "Rescuer", "RescueUnavailable", "AutoInterval", "rescue_skip_reason",
           "RESCUE_EXTRA_KEY", "SNAPSHOT_BUDGET", "CAPTURE_SHARE", "CAPTURE_BUDGET", "AUTO_PROBES"]

RESCUE_EXTRA_KEY = "rescue"  # the manifest's extra: {rank, snapshot_age_s} of a rescued checkpoint
SNAPSHOT_BUDGET = 0.02  # auto: the snapshots' share of training time, at most
CAPTURE_SHARE = 0.25  # auto: the part of that budget kept for the input's captures (the rest: 1.5%)
# auto: the input's captures' own share of training time, at most. A capture serves every
# restore, not only a rescue: a save carries the newest one (runner/state/saving.py _save_captures),
# and a restore replays the batches since it, so this budget also bounds that replay
# (digits_cnn, 2026-11-28: a capture every 252 steps; a restore at step 1180 of a 1200-step
# epoch replayed 140 batches, its input phase 0.31 s against 0.11-0.15 s with nothing to
# replay; at CAPTURE_SHARE of the snapshot budget, 0.5%, the interval was 1836 steps and the
# same restore replayed 1177 batches, 0.60-0.68 s).
CAPTURE_BUDGET = 0.02
AUTO_PROBES = 3  # auto: snapshots the chief times before it proposes (the first is not counted)
MAX_AUTO_EVERY = 1 << 20  # auto never proposes more (the proposal rides a float32 column: exact)
REVISE_RATIO = 1.5  # auto: a per-step time this far (either way) from the decided one ...
REVISE_CALLS = 20  # ... for this many calls in a row makes the chief propose again
_RECENT = 5  # auto: the newest snapshot times a revision reads (the slowest decides)


def _check_every(every_steps: int) -> None:
    if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
        raise ValueError(f"Received every_steps={every_steps!r}; expected an integer >= 1")


class RescueUnavailable(Exception):
    """Raised by a Rescuer's ``commit`` before it writes anything: why this worker cannot
    commit this snapshot (the message is the ``rescue_skipped`` reason)."""


class SnapshotSchedule:
    """Snapshot when ``every_steps`` steps passed since the last snapshot (or save).

    ``every_steps=None``: ``auto`` not decided yet: a snapshot is due after every call
    (the chief times them) until ``decide`` sets the interval agreed by every worker.

    Pure: the loop asks ``call_length`` (an explicit N caps a call so it ends at the next snapshot step),
    ``due`` after each call, and reports every snapshot and save with ``taken``.
    """

    def __init__(self, every_steps: int | None, *, start_step: int = 0, capture_every: int | None = None) -> None:
        if every_steps is not None:
            _check_every(every_steps)
        if capture_every is not None:
            _check_every(capture_every)
        self.every_steps = every_steps
        # An explicit N snapshots at exactly every N steps, ending calls there; auto's interval
        # is a budget, so its snapshots wait for the end of the call that reaches it: a call cut
        # short costs its fixed part again (measured: 16-step calls instead of 26 made
        # digits_cnn's steps ~4% slower), and a rescue loses at most the interval plus one call.
        self.cuts_calls = every_steps is not None
        self._configured_capture = capture_every  # snapshot_capture_every: over auto's choice too
        # an explicit N captures the input at every snapshot, unless told otherwise
        self.capture_every = None if every_steps is None else max(every_steps, capture_every or every_steps)
        self.last = start_step
        self.last_capture: int | None = None  # None: the next snapshot captures

    @property
    def pending(self) -> bool:
        """``auto`` has not decided yet."""
        return self.every_steps is None

    def decide(self, every_steps: int, capture_every: int | None = None) -> None:
        """``auto``'s intervals, as every worker read them from the same call's all-reduce
        (``capture_every``: None or under ``every_steps``: at every snapshot; a configured
        capture interval wins)."""
        _check_every(every_steps)
        self.every_steps = every_steps
        self.capture_every = max(every_steps, self._configured_capture or capture_every or every_steps)

    def call_length(self, *, global_step: int, max_steps: int) -> int:
        """At most ``max_steps``, ending no later than the next snapshot step (>= 1; auto: not cut)."""
        if self.every_steps is None or not self.cuts_calls:
            return max_steps
        return max(1, min(max_steps, self.last + self.every_steps - global_step))

    def due(self, global_step: int) -> bool:
        if self.every_steps is None:
            return global_step > self.last
        return global_step - self.last >= self.every_steps

    def taken(self, global_step: int) -> None:
        """A snapshot (or a save, which snapshots too) of ``global_step`` was taken."""
        self.last = global_step

    def capture_due(self, global_step: int) -> bool:
        """Does the snapshot of ``global_step`` capture the input? (always while undecided;
        the loop also captures at the first snapshot of a new iterator)."""
        if self.capture_every is None or self.last_capture is None:
            return True
        return global_step - self.last_capture >= self.capture_every

    def captured(self, global_step: int) -> None:
        """The input was captured at ``global_step`` (a save's capture counts too)."""
        self.last_capture = global_step


class AutoInterval:
    """The chief's side of ``--snapshot-every auto``: time the first snapshots, then propose.

    ``snapshot_took(seconds, capture_s=)`` after each of the chief's snapshots while
    undecided (``capture_s``: the part spent capturing the input);
    ``proposal(step_s=, call_steps=)``: 0 while it cannot decide yet, else the interval
    (every worker adopts the same value, read from the call's all-reduce);
    ``capture_every``: the capture interval proposed with it (0 before). ``chosen``: what
    the ``memory_tier`` event reports, once proposed. Pure, clock-free (tests/runner/).
    """

    def __init__(self, *, budget: float = SNAPSHOT_BUDGET, probes: int = AUTO_PROBES,
                 capture_share: float = CAPTURE_SHARE, capture_budget: float = CAPTURE_BUDGET) -> None:
        if not 0 < budget < 1:
            raise ValueError(f"Received budget={budget!r}; expected a fraction in (0, 1)")
        if probes < 2:
            raise ValueError(f"Received probes={probes!r}; expected >= 2 (the first snapshot is not counted)")
        if not 0 < capture_share < 1:
            raise ValueError(f"Received capture_share={capture_share!r}; expected a fraction in (0, 1)")
        if not 0 < capture_budget < 1:
            raise ValueError(f"Received capture_budget={capture_budget!r}; expected a fraction in (0, 1)")
        self.budget = budget
        self.capture_budget = capture_budget
        self.probes = probes
        self.capture_share = capture_share
        self._seconds: list[tuple[float, float]] = []  # (the rest, the capture) per probe
        self._recent_rest: deque[float] = deque(maxlen=_RECENT)  # after the decision
        self._recent_capture: deque[float] = deque(maxlen=_RECENT)
        self._off_calls = 0  # calls in a row whose per-step time is off the decided one
        self.chosen: dict[str, Any] | None = None

    def snapshot_took(self, seconds: float, *, capture_s: float = 0.0) -> None:
        rest = max(0.0, seconds - capture_s)
        if self.chosen is None:
            self._seconds.append((rest, capture_s))
            return
        self._recent_rest.append(rest)
        if capture_s > 0:
            self._recent_capture.append(capture_s)

    @property
    def capture_every(self) -> int:
        return 0 if self.chosen is None else self.chosen["capture_every_steps"]

    def proposal(self, *, step_s: float | None, call_steps: int) -> int:
        """The interval to propose now (0: not yet). The slowest counted snapshot decides
        (a shared machine's slow moment makes snapshots rarer, never too frequent)."""
        if self.chosen is not None:
            return self.chosen["every_steps"]
        if len(self._seconds) < self.probes or not step_s or step_s <= 0:
            return 0
        rest_s = max(rest for rest, _ in self._seconds[1:])
        capture_s = max(capture for _, capture in self._seconds[1:])
        self.chosen = self._choose(rest_s=rest_s, capture_s=capture_s, step_s=step_s, call_steps=call_steps)
        return self.chosen["every_steps"]

    def revision(self, *, step_s: float | None, call_steps: int) -> int:
        """After the decision, once per call: a new interval to propose (0: keep the current).
        The step time must stay over REVISE_RATIO off the decided one for REVISE_CALLS calls in
        a row (one slow moment changes nothing); the snapshot times are the newest ones."""
        if self.chosen is None or not step_s or step_s <= 0:
            return 0
        ratio = step_s / (self.chosen["step_ms"] / 1e3)
        if 1 / REVISE_RATIO <= ratio <= REVISE_RATIO:
            self._off_calls = 0
            return 0
        self._off_calls += 1
        if self._off_calls < REVISE_CALLS:
            return 0
        self._off_calls = 0
        rest_s = max(self._recent_rest) if self._recent_rest else self.chosen["snapshot_ms"] / 1e3 - self.chosen["capture_ms"] / 1e3
        capture_s = max(self._recent_capture) if self._recent_capture else self.chosen["capture_ms"] / 1e3
        previous = self.chosen
        self.chosen = self._choose(rest_s=rest_s, capture_s=capture_s, step_s=step_s, call_steps=call_steps)
        if (self.chosen["every_steps"], self.chosen["capture_every_steps"]) == (
                previous["every_steps"], previous["capture_every_steps"]):
            return 0  # the same intervals (now measured against this step time)
        return self.chosen["every_steps"]

    def _choose(self, *, rest_s: float, capture_s: float, step_s: float, call_steps: int) -> dict[str, Any]:
        rest_budget = self.budget * (1 - self.capture_share) if capture_s > 0 else self.budget  # nothing to capture: all of it
        by_budget = math.ceil(rest_s / (rest_budget * step_s))
        # A whole number of calls, so that snapshots fall where calls end anyway (auto's
        # snapshots wait for the end of the call that reaches the interval).
        call = max(1, call_steps)
        every = min(MAX_AUTO_EVERY, call * math.ceil(max(1, by_budget) / call))
        captures = math.ceil(capture_s / (self.capture_budget * step_s))
        capture_every = min(MAX_AUTO_EVERY, every * max(1, math.ceil(captures / every)))
        return {"every_steps": every, "capture_every_steps": capture_every,
                "snapshot_ms": round((rest_s + capture_s) * 1e3, 3), "capture_ms": round(capture_s * 1e3, 3),
                "step_ms": round(step_s * 1e3, 3), "budget": self.budget, "capture_budget": self.capture_budget,
                "call_steps": call_steps,
                "limited_by": "call" if by_budget < call else "budget"}


@dataclass(frozen=True)
class Snapshot:
    """A complete snapshot: the request captured with it and the wall time it completed."""

    request: Any  # runner/state/checkpointing.py SaveRequest
    completed_at: float


def rescue_skip_reason(snapshot_step: int | None, last_committed: int | None, *, incomplete: bool = False) -> str | None:
    """Why a snapshot of ``snapshot_step`` is not committed, or None when it should be."""
    if incomplete:
        return "snapshot incomplete: one was being taken when the rescue was asked (never committed)"
    if snapshot_step is None:
        return "no snapshot yet"
    if last_committed is not None and snapshot_step <= last_committed:
        return f"snapshot of step {snapshot_step} is not newer than the last commit (step {last_committed})"
    return None


class Rescuer:
    """Commits this worker's newest complete snapshot, once asked (any thread but the training one).

    ``saver``: the AsyncCheckpointer whose twin holds the snapshot (``rescue_hold``).
    ``commit(request)``: the ordinary commit of the twin (persist_twin through the store).
    ``last_committed()``: the newest committed step in the store (None: none).
    ``deadline_s``: the longest this worker waits for a snapshot or persist in progress.
    ``unable()``: why this worker's snapshots can never be committed (None: they can), asked
    when the request comes, e.g. a non-chief without the chief-only callbacks' state.
    """

    def __init__(
        self,
        saver: Any,
        *,
        rank: int,
        commit: Callable[[Any], Any],
        last_committed: Callable[[], int | None],
        deadline_s: float,
        unable: Callable[[], str | None] = lambda: None,
        emit: Callable[..., None] = _default_emit,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._saver = saver
        self._rank = rank
        self._commit = commit
        self._last_committed = last_committed
        self._deadline_s = deadline_s
        self._unable = unable
        self._emit = emit
        self._clock = clock
        self._wall_clock = wall_clock

    def rescue(self) -> None:
        started = self._clock()
        unable = self._unable()
        if unable is not None:
            self._skip(unable, drained=False)
            return
        with self._saver.rescue_hold(self._deadline_s) as (snapshot, busy):
            if busy is not None:
                self._skip(busy, drained=False)
                return
            try:
                committed = self._last_committed()
            except Exception as exc:  # the store cannot be listed: no commit is safe to compare with
                self._skip(f"commit failed: cannot list the store: {type(exc).__name__}: {exc}")
                return
            step = None if snapshot is None else snapshot.request.global_step
            reason = rescue_skip_reason(step, committed)
            if reason is not None:
                self._skip(reason)
                return
            age = round(self._wall_clock() - snapshot.completed_at, 3)
            request = dataclasses.replace(snapshot.request, blocked_ms=None, extra={
                **snapshot.request.extra, RESCUE_EXTRA_KEY: {"rank": self._rank, "snapshot_age_s": age}})
            try:
                self._commit(request)
            except RescueUnavailable as exc:
                self._skip(str(exc), global_step=step)
                return
            except Exception as exc:  # e.g. StaleWriterError, StorageUnavailableError: the restart falls back
                self._skip(f"commit failed: {type(exc).__name__}: {exc}", global_step=step)
                return
        self._emit(RESCUE_COMMITTED, global_step=step, rank=self._rank, snapshot_age_s=age,
                   seconds=round(self._clock() - started, 3))

    def _skip(self, reason: str, *, drained: bool = True, **fields: Any) -> None:
        """``drained``: this worker's in-flight persist had finished (the hold waited for it),
        so nothing of it is left to commit and the supervisor need not wait for its exit."""
        self._emit(RESCUE_SKIPPED, rank=self._rank, reason=reason, drained=drained, **fields)
