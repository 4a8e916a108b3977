"""HUNG's evidence: every watched worker's stacks, the stuck rank, hang_detected's fields.

The watchdog (supervisor/watchdog.py) says *that* the attempt made no progress (a Stall);
this module asks the watched workers for their stacks (SIGUSR1, rundir/stacks.py), waits up
to STACKS_WAIT_S for the dumps, names the stuck rank (``choose_stuck_rank``) and returns
what ``hang_detected`` announces and STOPPING carries (supervisor/attempt.py ``Stop.hang``).
"""

from __future__ import annotations

from typing import Any

from resilient_train.rundir.layout import AttemptDir
from resilient_train.rundir.stacks import STACKS_SIGNAL, ThreadStack, dump_size, read_dump
from resilient_train.supervisor.attempt import Worker
from resilient_train.supervisor.topology import POLL_S, Group
from resilient_train.supervisor.watchdog import Stall, choose_stuck_rank, describe_where

__all__ = ["collect_hang", "STACKS_WAIT_S"]

STACKS_WAIT_S = 2.0  # how long a hung group gets to dump its stacks before it is killed


def collect_hang(attempt_dir: AttemptDir, stall: Stall, watched: list[Worker], group: Group) -> dict[str, Any]:
    """Collect the ``watched`` workers' stacks and name the stuck rank: hang_detected's fields."""
    ranks = {w.rank for w in watched}
    alive = [w for w in group.alive() if w.rank in ranks]
    offsets = {w.rank: dump_size(attempt_dir.stacks(w.rank)) for w in alive}
    for worker in alive:
        group.send_signal(worker, STACKS_SIGNAL)
    deadline = group.clock() + STACKS_WAIT_S
    while group.clock() < deadline:
        group.pause()  # a launcher brings the dumps back; a worker may exit meanwhile
        if all(dump_size(attempt_dir.stacks(rank)) > offset for rank, offset in offsets.items()):
            group.sleep_fully(POLL_S)  # let a dump that has begun finish
            group.poll()
            break
    stacks: dict[int, list[ThreadStack]] = {
        rank: read_dump(attempt_dir.stacks(rank), offset) for rank, offset in offsets.items()
    }
    rank, why = choose_stuck_rank(stall.steps, stacks)
    step = stall.steps.get(rank)
    phase = stall.phases.get(rank)
    hang: dict[str, Any] = {
        "rank": rank,
        "pid": next((w.process.pid for w in group.workers if w.rank == rank), None),
        "global_step": step,
        "epoch": phase.epoch if phase is not None else None,
        "step_in_epoch": phase.step_in_epoch(step) if phase is not None else None,
        "seconds": round(stall.seconds, 1),
        "timeout_s": round(stall.allowed_s, 1),
        "phase": stall.phase,
        "where": describe_where(stacks.get(rank, [])),
        "stacks": str(attempt_dir.stacks(rank)),
        "chosen_by": why,
        "steps": {str(r): s for r, s in sorted(stall.steps.items())},
    }
    # A rank that never finished a step never joined training (a peer it cannot reach,
    # a slow restore): name each with its address, the first thing to check.
    never = {str(w.rank): w.address for w in watched if stall.steps.get(w.rank) is None}
    if never:
        hang["never_trained"] = never
    return hang
