"""Deterministic fault injection inside a worker, for tests and the chaos suite.

A fault killed from outside lands wherever the process happens to be; "kill the chief
right after it committed global step 7" needs the worker itself to pull the trigger.
``RT_FAULTS`` (JSON list) arms faults; nothing happens when it is unset::

    [{"point": "after_commit", "global_step": 7, "rank": 0, "attempt": 1, "signal": "SIGKILL"}]

points: ``after_step`` (a step finished), ``mid_upload`` (the chief uploaded the first
file of the checkpoint, the manifest is not written), ``after_commit`` (MANIFEST.json written),
``before_commit`` (checkpoint written locally, nothing uploaded), ``raise`` (an exception from
the step, like a recipe bug), ``input`` (the ``global_step``-th batch this process's input
pipeline reads; pulled only by a recipe that asks for it, as the chaos suite's generated
input-fault recipe does: :func:`input_gate`), ``before_join`` (start-up, before the worker probes its
peers; ``global_step`` 0 and no signal: see below). The epoch end's points, at the epoch's last
global step, in the order of an epoch end (runner/training/epoch_end.py ``EpochEnd.finish``):
``after_evaluation`` (the held-out evaluation returned: before the save with callbacks, after it
without, or after a restore that evaluates again), ``after_epoch_end_callbacks`` (``on_epoch_end``
ran and the stop was agreed, before the save), ``after_epoch_finished`` (the epoch's
``epoch_finished`` was emitted); the commit between them is ``before_commit`` / ``after_commit``. ``attempt`` defaults to 1, so a restarted group runs clean;
``"attempt": "all"`` arms the fault in every attempt, what a poisoned batch is to ``nan_loss`` and
``loss_spike`` (runner/health/injection.py): it comes back whenever its step is trained again.
``RT_FAULTS`` is a user's tool too (a poisoned batch in the user's own recipe, docs/failures.md):
:func:`parse_faults` names a bad value and what is accepted, and ``resilient-train run`` calls it
before anything starts (commands/run.py), so a typo is exit 2, not a crash in every worker.
The signal is real (``os.kill`` on the own pid; SIGSTOP on the calling thread), so the
supervisor sees a real death. Each fault fires once, but ``slow`` (a straggler:
runner/health/injection.py ``Slowdown``), which lasts: ``{"point": "slow", "global_step": 0,
"rank": 1, "factor": 3}`` makes rank 1 about 3 times slower after every call from global step 0 on.

``"signal": "SIGSTOP"`` freezes the whole process instead of killing it (a partitioned
node, a paused VM): with ``mid_upload`` the chief stops between two file uploads of a
checkpoint, its persist thread holding a half-uploaded directory, until a test sends
SIGCONT. tests/integration/test_stale_writer.py uses it to prove generation fencing.

``"signal": "HANG"`` is not a signal: the calling thread sleeps forever while the process,
its other threads and TensorFlow's heartbeats stay alive, the failure only the supervisor's
progress watchdog can end. At ``after_step`` the worker stops calling the training step
between two calls (its peers wait in the next collective); at ``input`` its input pipeline
blocks (a stuck network read, a hung data loader).

``before_join`` kills nothing: the worker asks :meth:`FaultPlan.take` before it probes its
peers (runner/process/worker_main.py), and when the fault is armed it probes a closed port on 127.0.0.1
for every peer instead of the peer's TF_CONFIG address, what a firewall or a wrong address
between two nodes looks like from this rank. The probe and its PeerUnreachableError are
production code (cluster/reach.py); the fault only decides what is unreachable.

``other_host`` kills nothing either (``global_step`` 0): the worker opens its checkpoint store
without the host cache (runner/process/worker_main.py), as a rank on a host that never held this
run would (a replaced node), so its restore reads from the store, not from the chief's copy
beside it (tests/integration/test_sharded_save.py counts those reads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["FaultPlan", "InjectedFault", "input_gate", "parse_faults", "HANG", "EVERY_ATTEMPT"]

POINTS = ("after_step", "before_commit", "mid_upload", "after_commit", "raise", "input", "before_join",
          "after_evaluation", "after_epoch_end_callbacks", "after_epoch_finished", "nan_loss", "loss_spike", "bitflip",
          "slow", "other_host")
HANG = "HANG"  # the pseudo-signal of a fault that blocks its thread forever
EVERY_ATTEMPT = "all"  # an ``attempt`` that arms the fault in every attempt (a poisoned batch)
ENV = "RT_FAULTS"


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws."""


@dataclass(frozen=True)
class _Fault:
    point: str
    global_step: int
    rank: int = 0
    attempt: int | str = 1  # or EVERY_ATTEMPT
    signal: str = "SIGKILL"
    factor: float = 1.0  # ``slow``: how many times slower; ``loss_spike``: times the loss (1: its default 100)

    def armed_in(self, attempt: int) -> bool:
        """Attempt 0 is no worker's (input_gate outside a worker): nothing fires there."""
        return attempt >= 1 and (self.attempt == EVERY_ATTEMPT or self.attempt == attempt)


_KEYS = tuple(f.name for f in dataclasses.fields(_Fault))


def _int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def parse_faults(text: str) -> list[_Fault]:
    """The faults of an ``RT_FAULTS`` value ("" or unset: none); ValueError naming the bad
    value and what is accepted (``resilient-train run`` checks it before it starts anything)."""
    if not text.strip():
        return []
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{ENV} is not JSON ({exc}); expected a list of objects such as "
                         '[{"point": "nan_loss", "global_step": 6, "rank": 0, "attempt": "all"}]') from None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError(f"Received {ENV}={text!r}; expected a JSON list of objects, one per fault")
    faults = []
    for index, item in enumerate(items, start=1):
        where = f"{ENV} fault {index}"
        unknown = sorted(set(item) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; accepted: {', '.join(_KEYS)}")
        for key in ("point", "global_step"):
            if key not in item:
                raise ValueError(f"{where}: missing {key!r} (every fault names a point and a global_step)")
        if item["point"] not in POINTS:
            raise ValueError(f"{ENV} point {item['point']!r}; expected one of {POINTS}")
        for key, minimum in (("global_step", 0), ("rank", 0)):
            if key in item and not _int(item[key], minimum):
                raise ValueError(f"{where}: received {key}={item[key]!r}; expected an integer >= {minimum}")
        attempt = item.get("attempt", 1)
        if not (_int(attempt, 1) or attempt == EVERY_ATTEMPT):
            raise ValueError(f"{where}: received attempt={attempt!r}; expected an integer >= 1 or "
                             f"{EVERY_ATTEMPT!r} (every attempt: a poisoned batch)")
        sig = item.get("signal", "SIGKILL")
        if sig != HANG and not isinstance(getattr(signal, str(sig), None), signal.Signals):
            raise ValueError(f"{ENV} signal {sig!r}; expected a signal name such as SIGKILL or SIGSTOP, or {HANG!r}")
        factor = item.get("factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
            raise ValueError(f"{where}: received factor={factor!r}; expected a number >= 1 (point slow: how many "
                             "times slower; loss_spike: how many times the loss, default 100)")
        faults.append(_Fault(**item))
    return faults


class FaultPlan:
    def __init__(self, faults: list[_Fault], *, rank: int, attempt: int) -> None:
        self._armed = {
            (f.point, f.global_step): f for f in faults if f.rank == rank and f.armed_in(attempt)
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, rank: int, attempt: int) -> "FaultPlan":
        return cls(parse_faults(environ.get(ENV, "")), rank=rank, attempt=attempt)

    def armed_steps(self, point: str) -> list[int]:
        """The global steps armed at ``point`` (for a fault the traced step makes: ``nan_loss``)."""
        return sorted(step for (p, step) in self._armed if p == point)

    def armed(self, point: str) -> list[tuple[int, float]]:
        """(global_step, factor) of every fault armed at ``point``, left armed (``slow``: it lasts)."""
        return sorted((step, fault.factor) for (p, step), fault in self._armed.items() if p == point)

    def take(self, point: str, global_step: int) -> bool:
        """Whether a fault is armed here (once), for a point whose effect the caller makes."""
        return self._armed.pop((point, global_step), None) is not None

    def hit(self, point: str, global_step: int) -> None:
        fault = self._armed.pop((point, global_step), None)  # once: a thawed SIGSTOP goes on
        if fault is None:
            return
        if point == "raise":
            raise InjectedFault(f"injected fault at global_step {global_step}")
        if fault.signal == HANG:
            _hang_forever()
        sig = getattr(signal, fault.signal)
        if sig == signal.SIGSTOP:
            # Directed at the calling thread: a process-directed SIGSTOP is handled by the
            # main thread, and until it is scheduled this thread (the persist thread) would
            # go on uploading. The stop is still the whole process's (a group stop).
            signal.pthread_kill(threading.get_ident(), sig)
            return
        os.kill(os.getpid(), sig)


def _hang_forever() -> None:
    """The stuck thread: never returns (the supervisor's SIGKILL ends the process)."""
    while True:
        time.sleep(3600)


def input_gate(environ: Mapping[str, str], *, rank: int):
    """A function for a recipe's input pipeline to call once per batch it reads: it pulls
    this process's ``input`` faults (``RT_FAULTS``), numbering the batches from 1.

    The attempt is the worker's ``RT_ATTEMPT`` (0 outside a worker: nothing fires there,
    e.g. in the supervisor's input check).
    """
    plan = FaultPlan.from_env(environ, rank=rank, attempt=int(environ.get("RT_ATTEMPT") or 0))
    batches = [0]

    def read_batch() -> None:
        batches[0] += 1
        plan.hit("input", batches[0])

    return read_batch
