"""What the run does about a non-finite step: ``--on-anomaly`` (job/config.py).

Every worker reads the same reduced rows, so every worker finds the same anomaly after the
same call and acts alike, before any save or snapshot of that call: the step's state is never
saved. Before a worker leaves on one, it waits for the in-flight commit of the save before it
(``settle``), so nothing committed is lost and the newest commit is healthy.

``stop``: the worker exits ``EXIT_FATAL`` with one line naming the step, the batch and the
values (a restart would replay the same batch and meet the same NaN).

``rollback`` (the default): the workers exit ``EXIT_FAILURE`` (:class:`AnomalyRollbackError`),
the supervisor's ordinary gang restart restores the newest commit, and the restarted attempt
replays up to the anomaly's step; this run's events.jsonl tells it which step that was
(:func:`pending_rollback`, read by the chief and agreed by every worker). The replay decides:

* the anomaly comes back at the same step: ``deterministic`` (the data or the model). With
  ``--deterministic-anomaly skip`` (the default) and a non-finite step, the workers leave once
  more and the next attempt replays from the newest commit without that batch: its
  ``replay_verdict`` (action ``skip``) is the record every later attempt reads
  (:meth:`HealthGuard.arm_replay`), every later checkpoint carries the skip list
  (``skipped_steps`` in its manifest's extra), and the batch is consumed but not trained on
  (runner/training/train_call.py ``TrainCall.run``), so a resume, a re-run of the same job
  and the run itself agree. With ``stop`` (and for replicas that differ, which no batch
  explains) the run stops as with ``stop``;
* the replay passes that step with finite values: ``transient`` (a flipped bit, a bad
  read): training goes on from the replay, which is exact. The verdict names the hosts the
  anomaly points at (``hosts``: those of the ranks it named; a non-finite step names no rank,
  so only a run on one host has one). After ``--max-transients-per-host`` N transients on one
  host in this run (counted from events.jsonl by the chief), that host is treated like one
  with a preemption notice (runner/process/preemption_notices.py): ``host_suspected``, a
  ``notice-<rank>.json`` marker of provider ``suspect-hardware`` for each of its ranks, and
  this worker's stop request, so the group saves at an agreed step and exits 143; the
  supervisor stops a local run (its only host is the suspect) and has Ray and Slurm place no
  worker there again (supervisor/launchers/api.py ``avoid_noticed``).

An anomaly at another step during a replay is a new one: rolled back again. The restart
budget (``--max-restarts``) bounds the rollbacks like any restart.

``ignore``: the old behaviour (train on, commit whatever the state is), the first anomaly
reported. For a user who knows the NaN is harmless.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from resilient_train.errors import AnomalyRollbackError, NumericalAnomalyError
from resilient_train.job.config import (
    ON_ANOMALY_CHOICES as ON_ANOMALY, ON_ANOMALY_IGNORE, ON_ANOMALY_ROLLBACK, ON_ANOMALY_STOP,
)
from resilient_train.runner.health.detector import NONFINITE, REPLICAS, SPIKE, Anomaly
from resilient_train.runner.health.spikes import LossSpikes

__all__ = ["HealthGuard", "HostSuspicion", "check_finite_state", "event_value", "implicated_hosts", "pending_rollback",
           "transients_per_host", "SUSPECT_HARDWARE"]

DETERMINISTIC = "deterministic"
TRANSIENT = "transient"
SUSPECT_HARDWARE = "suspect-hardware"  # the provider of a suspected host's notice markers


def event_value(value: float) -> float | str:
    """A value for events.jsonl: JSON has no NaN or Infinity, so those are written as text."""
    return value if math.isfinite(value) else repr(value)


def pending_rollback(records: Iterable[dict[str, Any]], *, run_id: str) -> dict[str, Any] | None:
    """This run's newest ``anomaly_detected`` that was rolled back and has no verdict yet."""
    pending = None
    for record in records:
        if record.get("run_id") != run_id:
            continue
        if record.get("event") == "anomaly_detected" and record.get("action") == ON_ANOMALY_ROLLBACK:
            pending = record
        elif record.get("event") == "replay_verdict" and pending is not None \
                and record.get("global_step") == pending.get("global_step"):
            pending = None
    return pending


def transients_per_host(records: Iterable[dict[str, Any]], *, run_id: str) -> dict[str, int]:
    """This run's ``transient`` replay verdicts, counted per host they named."""
    counts: dict[str, int] = {}
    for record in records:
        if record.get("run_id") == run_id and record.get("event") == "replay_verdict" \
                and record.get("verdict") == TRANSIENT:
            for host in record.get("hosts") or []:
                counts[host] = counts.get(host, 0) + 1
    return counts


def implicated_hosts(ranks: Sequence[int] | None, hosts: Sequence[str]) -> list[str]:
    """The hosts an anomaly points at: those of the ``ranks`` it names (``hosts[rank]``);
    when it names none (a non-finite step: every rank's flag summed), the one host every rank
    runs on, or none when they are on several."""
    if ranks:
        return sorted({hosts[rank] for rank in ranks if 0 <= rank < len(hosts)})
    return list(set(hosts)) if len(set(hosts)) == 1 else []


class HostSuspicion:
    """The chief's answer to a suspected host (``HealthGuard``'s ``suspect``): a preemption
    notice marker of provider ``suspect-hardware`` for each of its ranks, which the supervisor
    reads as it reads a cloud's (supervisor/launchers/api.py), and this worker's stop request."""

    def __init__(self, attempt_dir: Path | None) -> None:
        self._attempt_dir = attempt_dir
        self.host: str | None = None  # the host suspected, once one is

    def __call__(self, host: str, ranks: list[int]) -> None:
        if self._attempt_dir is not None:
            from resilient_train.rundir.atomic import write_atomic
            from resilient_train.rundir.layout import AttemptDir

            for rank in ranks:
                write_atomic(AttemptDir.at(self._attempt_dir).notice(rank), json.dumps(
                    {"provider": SUSPECT_HARDWARE, "kind": "transient-anomalies", "host": host}))
        self.host = host

    def stop_requested(self) -> bool:
        return self.host is not None

    def source(self) -> str | None:
        """The stop's source once a host is suspected (the supervisor's own for such a notice)."""
        return f"notice:{SUSPECT_HARDWARE}" if self.host is not None else None


class HealthGuard:
    """Acts on a call's first anomaly by policy, and judges a replay (rollback)."""

    def __init__(self, on_anomaly: str, *, emit: Callable[..., None], run_id: str = "",
                 events_path: Path | None = None, skip: bool = False, spikes: LossSpikes | None = None,
                 hosts: Sequence[str] = (), max_transients: int | None = None,
                 suspect: Callable[[str, list[int]], None] = lambda host, ranks: None) -> None:
        """``hosts``: each rank's host (its TF_CONFIG address). ``max_transients``: transients on
        one host before ``suspect(host, its ranks)`` is called (None: never); see the module
        docstring."""
        if on_anomaly not in ON_ANOMALY:
            raise ValueError(f"Received on_anomaly={on_anomaly!r}; expected one of {ON_ANOMALY}")
        self.on_anomaly = on_anomaly
        self._emit = emit
        self._run_id, self._events_path = run_id, events_path  # where a rollback's replay is read (arm_replay)
        self._skip = skip and on_anomaly == ON_ANOMALY_ROLLBACK  # --deterministic-anomaly skip
        self.skipped: tuple[int, ...] = ()  # the global steps whose batches are consumed, not trained on
        self.spikes = spikes  # --loss-spike (runner/health/spikes.py), None: off
        self._reported = False  # ignore: the first anomaly is reported, the NaNs after it are its consequence
        self._replaying: int | None = None  # rollback: the anomaly's global step this attempt replays to
        self._before: dict[str, Any] = {}  # ... and its values as first seen
        self.hosts, self._max_transients, self._suspect = list(hosts), max_transients, suspect
        self._implicated: list[str] = []  # the chief: the hosts the replayed anomaly points at
        self._transients: dict[str, int] = {}  # the chief: this run's transients per host so far

    @property
    def requires_finite_commit(self) -> bool:
        """Does the commit path refuse a non-finite state (the second guard)?"""
        return self.on_anomaly != ON_ANOMALY_IGNORE

    @property
    def rolls_back(self) -> bool:
        return self.on_anomaly == ON_ANOMALY_ROLLBACK

    def replay_to(self, anomaly_step: int, *, restored_step: int, values: dict[str, Any]) -> None:
        """This attempt restored ``restored_step`` after a rollback from ``anomaly_step`` (every
        worker, with the step the chief read: :func:`pending_rollback`)."""
        if anomaly_step <= restored_step:  # the rollback never reached a commit before it: nothing to replay
            return
        self._replaying, self._before = anomaly_step, dict(values)
        self._emit("rolled_back", group=True, global_step=restored_step, anomaly_step=anomaly_step)

    def after_call(self, anomaly: Anomaly | None, *, last_global_step: int,
                   settle: Callable[[], Any] = lambda: None) -> None:
        """Judge the call: nothing when healthy, else report and act by policy.

        ``last_global_step``: the call's last step (a replay that passed its anomaly's step
        cleanly is transient). ``settle``: called before a raise, to let the in-flight commit
        of an earlier, healthy save finish (a worker's failed exit does not wait for it)."""
        if self._replaying is not None:
            if anomaly is not None and anomaly.global_step == self._replaying:
                skip = self._skip and anomaly.kind in (NONFINITE, SPIKE)
                self._verdict(DETERMINISTIC, anomaly, action="skip" if skip else "stop")
                settle()
                if skip:
                    raise AnomalyRollbackError(
                        f"{anomaly.describe()}; it came back when replayed from the newest commit (deterministic: "
                        "the data or the model), so that batch is skipped: rolling back to replay without it "
                        "(--deterministic-anomaly skip)")
                raise NumericalAnomalyError(
                    f"{anomaly.describe()}; it came back when replayed from the newest commit (deterministic: "
                    "the data or the model), so the run stops; skipping that batch is not supported yet")
            if anomaly is None or anomaly.global_step > self._replaying:
                if last_global_step >= self._replaying:
                    self._verdict(TRANSIENT, None)
        if anomaly is None or self._reported:
            return
        if self.on_anomaly == ON_ANOMALY_IGNORE:
            self._reported = True
        extra: dict[str, Any] = ({"ranks": list(anomaly.ranks)} if anomaly.kind == REPLICAS
                                 else dict(anomaly.reference or {}))  # spike: median, threshold
        self._emit("anomaly_detected", group=True, kind=anomaly.kind, global_step=anomaly.global_step,
                   epoch=anomaly.epoch, step_in_epoch=anomaly.step_in_epoch, replicas=anomaly.replicas,
                   values={name: event_value(v) for name, v in anomaly.values.items()}, action=self.on_anomaly,
                   **extra)
        if self.on_anomaly == ON_ANOMALY_STOP:
            settle()
            raise NumericalAnomalyError(f"{anomaly.describe()}; stopped (--on-anomaly stop), its state is not "
                                        "saved and the newest commit is the run's last healthy state")
        if self.on_anomaly == ON_ANOMALY_ROLLBACK:
            settle()
            raise AnomalyRollbackError(f"{anomaly.describe()}; rolling back to the newest commit to replay it "
                                       "(--on-anomaly rollback)")

    def arm_replay(self, *, is_chief: bool, restored_step: int, gather: Callable[[int], list[int]]) -> None:
        """After the restore, with ``rollback``: the chief reads whether this attempt replays a
        rolled-back anomaly and which batches are skipped (this run's events.jsonl) and every
        worker adopts its answer (one all-reduce, every worker; more when there are skips),
        added to the restored checkpoint's skip list (:meth:`load_extra`)."""
        assert self._events_path is not None, "arm_replay needs the run's events path"
        records = []
        if is_chief and self._events_path.exists():
            from resilient_train.rundir.events import read_events

            records = [r for r in read_events(self._events_path) if r.get("run_id") == self._run_id]
        pending = pending_rollback(records, run_id=self._run_id) if is_chief else None
        if is_chief:
            self._transients = transients_per_host(records, run_id=self._run_id)
            self._implicated = implicated_hosts((pending or {}).get("ranks"), self.hosts) if pending else []
        decided = [int(r["global_step"]) for r in records
                   if r.get("event") == "replay_verdict" and r.get("action") == "skip"]
        step, skips = gather(int(pending["global_step"]) if pending else 0)[0], gather(len(decided))[0]
        if skips:  # the chief's list, one step per worker slot at a time (each a gather)
            decided = [gather(decided[k] if is_chief else 0)[0] for k in range(skips)]
        self.skipped = tuple(sorted(set(decided) | set(self.skipped)))
        if step > 0:
            self.replay_to(step, restored_step=restored_step, values=(pending or {}).get("values") or {})

    def extra(self) -> dict[str, Any]:
        """What a checkpoint's manifest extra carries: the skip list and the loss window (nothing
        when there are neither)."""
        extra = {"skipped_steps": list(self.skipped)} if self.skipped else {}
        return extra if self.spikes is None else {**extra, **self.spikes.to_extra()}

    def load_extra(self, extra: dict[str, Any]) -> None:
        """From the restored checkpoint's manifest (the same on every worker)."""
        self.skipped = tuple(int(s) for s in extra.get("skipped_steps", []))
        if self.spikes is not None:
            self.spikes.load_extra(extra)

    def skips(self, global_step: int) -> bool:
        """Is the batch of ``global_step`` skipped (consumed, not trained on)?"""
        return global_step in self.skipped

    def _verdict(self, verdict: str, anomaly: Anomaly | None, *, action: str | None = None) -> None:
        assert self._replaying is not None
        fields: dict[str, Any] = {"global_step": self._replaying, "verdict": verdict, "values_before": self._before}
        if action is not None:
            fields["action"] = action
        if anomaly is not None:
            fields["values"] = {name: event_value(v) for name, v in anomaly.values.items()}
        if verdict == TRANSIENT:
            fields["hosts"] = self._implicated
        self._emit("replay_verdict", group=True, **fields)
        self._replaying = None
        if verdict == TRANSIENT:
            self._count_transient()

    def _count_transient(self) -> None:
        """The chief: one more transient on each implicated host; a host at the limit is suspected."""
        for host in self._implicated:
            self._transients[host] = self._transients.get(host, 0) + 1
            if self._max_transients is not None and self._transients[host] >= self._max_transients:
                ranks = [rank for rank, where in enumerate(self.hosts) if where == host]
                self._emit("host_suspected", group=True, host=host, ranks=ranks,
                           transients=self._transients[host], limit=self._max_transients)
                self._suspect(host, ranks)
        self._implicated = []


def check_finite_state(named_values: list[tuple[str, Any]], *, global_step: int) -> None:
    """The commit path's second guard: raise if any floating tensor of the state is not finite."""
    for name, value in named_values:
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise NumericalAnomalyError(f"the state of global step {global_step} holds a non-finite value in "
                                        f"{name}; it is not committed")
