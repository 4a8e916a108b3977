"""The progress watchdog: a worker group that is alive but makes no progress is a failure.

The supervisor only hears of a worker that *exits*. A worker whose input blocks forever
(a stuck network read, a hung data loader) exits never: its peers wait in their
all-reduce, TensorFlow's heartbeats stay happy, and the run would hang until a person
notices. Every worker already rewrites its step marker after each call and its phase
marker when its phase changes (rundir/stepmarker.py); the supervisor feeds what it reads
there to :class:`ProgressWatchdog`, on every launcher alike, and gang-restarts the group
like after a crash when the watchdog reports a :class:`Stall`.

Pure, like policy.py: no files, no processes, no clock of its own. ``observe`` and
``check`` take the time as an argument, so tests drive it with a fake clock.

**What counts as progress**: any rank's step marker advancing, or any rank's phase marker
changing (entering or leaving evaluation, a save, an epoch's input). The group is stalled
when there was no progress for longer than the allowance of the moment:

* before any rank finished a step in this attempt (strategy, restore, first trace), or
  while any rank says it is in a slow phase (``eval``, ``flush``, ``finish``, or no phase
  yet): ``startup_timeout_s`` (``--startup-timeout``, default 600 s), or the hang timeout
  where that is longer;
* otherwise the hang timeout: ``--hang-timeout SECONDS``, or ``auto`` (the default):

      auto = max(AUTO_FLOOR_S, AUTO_FACTOR x longest observed call)
           = max(60 s, 10 x the longest interval between two consecutive step-marker
                 advances of one rank, over the whole run, intervals that overlapped a
                 slow phase left out)

  so a model whose calls take 20 s gets 200 s, a fast one 60 s, and a machine that gets
  busier and slows every call down stretches the timeout as the calls stretch (a worker
  that keeps moving, however slowly, is never flagged while each call stays within the
  timeout the calls before it set).

**Who is stuck** (:func:`choose_stuck_rank`): the rank whose step marker is behind; among
ranks at the same step, one with a thread in recipe code (its input function), then one
whose main thread is not inside a TensorFlow op (the others wait in the collective for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resilient_train.rundir.stacks import ThreadStack, in_tensorflow, is_recipe_code
from resilient_train.rundir.stepmarker import PHASE_STARTUP, PHASE_TRAIN, Phase

__all__ = ["HangPolicy", "ProgressWatchdog", "Stall", "choose_stuck_rank", "describe_where",
           "AUTO", "AUTO_FLOOR_S", "AUTO_FACTOR"]

AUTO = "auto"
AUTO_FLOOR_S = 60.0
AUTO_FACTOR = 10.0


@dataclass(frozen=True)
class HangPolicy:
    """``hang_timeout_s`` None means auto (see the module docstring)."""

    hang_timeout_s: float | None = None
    startup_timeout_s: float = 600.0
    auto_floor_s: float = AUTO_FLOOR_S
    auto_factor: float = AUTO_FACTOR

    def __post_init__(self) -> None:
        for name in ("hang_timeout_s", "startup_timeout_s", "auto_floor_s", "auto_factor"):
            value = getattr(self, name)
            if value is None and name == "hang_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Received {name}={value!r}; expected a number > 0")

    @classmethod
    def from_setting(cls, hang_timeout: float | str, startup_timeout: float) -> HangPolicy:
        """From the job's ``hang_timeout`` (seconds or ``"auto"``) and ``startup_timeout``."""
        return cls(None if hang_timeout == AUTO else float(hang_timeout), float(startup_timeout))


@dataclass(frozen=True)
class Stall:
    """No rank advanced for ``seconds`` (> ``allowed_s``, the allowance of ``phase``)."""

    seconds: float
    allowed_s: float
    phase: str
    steps: Mapping[int, int | None]  # each rank's last finished step of the attempt
    phases: Mapping[int, Phase]


class ProgressWatchdog:
    """Decides, from what the step and phase markers say over time, whether the group hangs."""

    def __init__(self, policy: HangPolicy) -> None:
        self.policy = policy
        self.longest_call_s = 0.0  # over the whole run: a restart does not make calls faster
        self.start_attempt(0.0, [])

    def start_attempt(self, now: float, ranks: Sequence[int]) -> None:
        """A new attempt's workers started at ``now``: nobody has progressed yet."""
        self._last_progress = now
        self._steps: dict[int, int | None] = {rank: None for rank in ranks}
        self._moved_at: dict[int, float | None] = {rank: None for rank in ranks}
        self._slow_since_move: dict[int, bool] = {rank: False for rank in ranks}
        self._phases: dict[int, Phase] = {rank: Phase(PHASE_STARTUP) for rank in ranks}

    @property
    def hang_timeout_s(self) -> float:
        """The allowance of the training phase now (fixed, or auto from the calls seen so far)."""
        if self.policy.hang_timeout_s is not None:
            return self.policy.hang_timeout_s
        return max(self.policy.auto_floor_s, self.policy.auto_factor * self.longest_call_s)

    def observe(self, now: float, rank: int, step: int | None, phase: Phase) -> None:
        """What ``rank``'s markers say at ``now`` (``step`` None: no step finished yet)."""
        if step is not None and phase.name == PHASE_STARTUP:
            phase = Phase(PHASE_TRAIN)  # a worker that writes steps but no phase trains
        if phase != self._phases.get(rank, phase):
            # A changed phase is progress: the clock restarts, so an evaluation longer
            # than the hang timeout is not a hang the moment training resumes after it.
            self._last_progress = now
        self._phases[rank] = phase
        if phase.name != PHASE_TRAIN:
            self._slow_since_move[rank] = True
        previous = self._steps.get(rank)
        if step is None or (previous is not None and step <= previous):
            return
        moved_at = self._moved_at.get(rank)
        if moved_at is not None and not self._slow_since_move.get(rank, False):
            self.longest_call_s = max(self.longest_call_s, now - moved_at)
        self._steps[rank] = step
        self._moved_at[rank] = now
        self._slow_since_move[rank] = phase.name != PHASE_TRAIN
        self._last_progress = now

    def allowance(self) -> tuple[float, str]:
        """(seconds without progress allowed now, the phase that decides it)."""
        if all(step is None for step in self._steps.values()):
            return max(self.policy.startup_timeout_s, self.hang_timeout_s), PHASE_STARTUP
        slow = sorted({p.name for p in self._phases.values() if p.name != PHASE_TRAIN})
        if slow:
            return max(self.policy.startup_timeout_s, self.hang_timeout_s), slow[0]
        return self.hang_timeout_s, PHASE_TRAIN

    def check(self, now: float) -> Stall | None:
        """A Stall when no rank advanced for longer than the allowance; else None."""
        allowed, phase = self.allowance()
        idle = now - self._last_progress
        if idle <= allowed:
            return None
        return Stall(idle, allowed, phase, dict(self._steps), dict(self._phases))


def choose_stuck_rank(
    steps: Mapping[int, int | None], stacks: Mapping[int, Sequence[ThreadStack]]
) -> tuple[int, str]:
    """(the rank to blame, why): behind, else in recipe code, else not in a TensorFlow op.

    ``steps``: each rank's last finished step (None: none yet); ``stacks``: each rank's dump
    (empty when none came). Undecided ties name the lowest rank, with the reason ``tie``.
    """
    if not steps:
        raise ValueError("Received no ranks; expected the steps of at least one")
    lowest = min(-1 if s is None else s for s in steps.values())
    candidates = sorted(r for r, s in steps.items() if (-1 if s is None else s) == lowest)
    if len(candidates) < len(steps):
        reason = "behind"
    else:
        reason = "tie"
    if len(candidates) > 1:
        in_recipe = [r for r in candidates if any(_recipe_frame(t) for t in stacks.get(r, ()))]
        outside_tf = [r for r in candidates if any(t.is_main and not in_tensorflow(t) for t in stacks.get(r, ()))]
        if len(in_recipe) == 1:
            return in_recipe[0], "in recipe code"
        if len(outside_tf) == 1:
            return outside_tf[0], "main thread not in a TensorFlow op"
    return candidates[0], reason


def describe_where(stacks: Sequence[ThreadStack]) -> str:
    """``main thread in execute.py:53 quick_execute (TensorFlow); recipe code in
    input_hang.py:47 _read (another thread)``, or ``no stacks`` when no dump came."""
    if not stacks:
        return "no stacks (the worker did not answer SIGUSR1)"
    main = next((t for t in stacks if t.is_main), None)
    parts = []
    if main is not None and main.frames:
        own = _recipe_frame(main)
        if own is not None:
            return f"main thread in {own.short()}"
        parts.append(f"main thread in {main.frames[0].short()}" + (" (TensorFlow)" if in_tensorflow(main) else ""))
    for thread in stacks:
        own = _recipe_frame(thread)
        if own is not None and not thread.is_main:
            parts.append(f"recipe code in {own.short()} (another thread)")
            break
    return "; ".join(parts) or "no Python frames"


def _recipe_frame(thread: ThreadStack):
    return next((f for f in thread.frames if is_recipe_code(f)), None)
