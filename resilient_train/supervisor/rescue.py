"""Who rescues, and the supervisor's bounded wait for its answer (the memory tier's process side).

With ``--snapshot-every`` every worker keeps its newest snapshot of the whole state in
memory (runner/state/memory_tier.py). When a worker of a running attempt fails (not a
clean exit, not a preemption), the lowest-ranked worker still alive is asked, by
``RESCUE_SIGNAL`` through its launcher handle (rundir/rescue_signal.py), to commit its
snapshot; the supervisor waits for that rank's ``rescue_committed`` or ``rescue_skipped``
in events.jsonl, at most ``rescue_deadline_s(--storage-timeout)``, then stops the group as
before. Nobody alive, a preemption, or the tier off: no request and no wait at all.

On a hang (the watchdog's HUNG, supervisor/watchdog.py) every process is alive but the one
named stuck may not be able to answer (SIGSTOPped, frozen host): the lowest-ranked worker
other than it is asked, with the same bounded wait, before the group is killed. Its
training thread is blocked in a collective; the rescue runs on its listener thread.

The choices and :class:`RescueWait` are pure (no processes, no clock); :func:`ask_for_rescue`
makes the request and waits through the loop's control of the group (supervisor/topology.py
``Group``), whose polls feed the wait the events the console's tail reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from resilient_train.errors import EXIT_FATAL, EXIT_OK, EXIT_PREEMPTED
from resilient_train.rundir.events import emit
from resilient_train.rundir.rescue_signal import (RESCUE_ABANDONED, RESCUE_COMMITTED, RESCUE_REQUESTED, RESCUE_SIGNAL,
                                                  RESCUE_SKIPPED)
from resilient_train.supervisor.attempt import Attempt, Worker

if TYPE_CHECKING:  # supervisor/topology.py imports nothing_left_to_commit from here
    from resilient_train.supervisor.topology import Group

__all__ = ["choose_rescuer", "choose_hang_rescuer", "failed_ranks", "nothing_left_to_commit", "RescueWait",
           "ask_for_rescue"]


def failed_ranks(workers: Sequence[Worker]) -> list[int]:
    """The ranks that exited abnormally: neither 0 nor 'preempted' (143)."""
    return [w.rank for w in workers if w.returncode not in (None, EXIT_OK, EXIT_PREEMPTED)]


def choose_rescuer(workers: Sequence[Worker]) -> Worker | None:
    """The lowest-ranked worker still alive after a failure, or None when there is nothing
    to rescue from: no failure, a preemption under way (its peers save anyway), nobody alive,
    or a worker that exited with a fatal error (a bug in the job or a refusal: no restart
    follows, so a rescue would only make the stop slower and promise a restart that never comes)."""
    if not failed_ranks(workers) or any(w.returncode in (EXIT_PREEMPTED, EXIT_FATAL) for w in workers):
        return None
    alive = [w for w in workers if w.returncode is None]
    return min(alive, key=lambda w: w.rank, default=None)


def choose_hang_rescuer(workers: Sequence[Worker], *, stuck: int) -> Worker | None:
    """The lowest-ranked worker still alive that is not the ``stuck`` one, or None."""
    alive = [w for w in workers if w.returncode is None and w.rank != stuck]
    return min(alive, key=lambda w: w.rank, default=None)


def nothing_left_to_commit(answer: dict[str, Any] | None) -> bool:
    """After this rescue answer, can the survivors be killed at once? Yes when the rescuer
    committed, or skipped after its own in-flight persist had finished (``drained``): the
    rescue waited for that persist, and only a rescuer or the chief ever commits, so a
    teardown grace would only wait for a broken group's collectives to time out
    (3 s of every other non-chief kill's restart, benchmarks/README.md)."""
    if answer is None:
        return False
    return answer.get("event") == RESCUE_COMMITTED or (answer.get("event") == RESCUE_SKIPPED and answer.get("drained") is True)


class RescueWait:
    """The answer of ``rank`` in ``attempt``: fed the events the supervisor's tail reads."""

    def __init__(self, *, rank: int, attempt: int) -> None:
        self.rank = rank
        self.attempt = attempt
        self.answer: dict[str, Any] | None = None

    def observe(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            if (self.answer is None and record.get("event") in (RESCUE_COMMITTED, RESCUE_SKIPPED)
                    and record.get("rank") == self.rank and record.get("attempt") == self.attempt):
                self.answer = record


def ask_for_rescue(group: Group, attempt: Attempt, rescuer: Worker, *, deadline_s: float,
                   pump: Callable[[], list[dict[str, Any]]], **why: Any) -> dict[str, Any] | None:
    """Ask ``rescuer`` to commit its snapshot; wait (bounded) for its answer, and return it
    (None: abandoned, ``rescue_abandoned``). ``pump()``: the tail's new events."""
    emit(RESCUE_REQUESTED, rank=rescuer.rank, attempt=attempt.number, deadline_s=deadline_s, **why)
    rescue = attempt.rescue = RescueWait(rank=rescuer.rank, attempt=attempt.number)
    started = group.clock()
    group.send_signal(rescuer, RESCUE_SIGNAL)
    try:
        group.wait(lambda: rescue.answer is not None or rescuer.returncode is not None, deadline_s)
        rescue.observe(pump())  # an answer written just as the rescuer exited
        if rescue.answer is None:
            reason = (f"rank {rescuer.rank} exited without answering" if rescuer.returncode is not None
                      else f"no answer within {deadline_s:g} s")
            emit(RESCUE_ABANDONED, rank=rescuer.rank, attempt=attempt.number, reason=reason,
                 waited_s=round(group.clock() - started, 3))
        return rescue.answer
    finally:
        attempt.rescue = None
