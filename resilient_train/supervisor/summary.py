"""``summary.json``: the run's outcome, and the totals it reports.

Everything here is computed from what the run dir holds (``events.jsonl``, the step markers
of each ``attempt-<n>/``) plus the supervisor's counters, never from a live process, so the
same numbers come out after a supervisor was SIGKILLed and a later one finishes the run.
The summary is written atomically (rundir/atomic.py): a reader sees the previous summary or
the new one, never half of one.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, fields
from typing import Any, Iterable

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.redact import redact
from resilient_train.rundir import stepmarker
from resilient_train.rundir.time_account import account_time, last_invocation

__all__ = ["RootCauseRecord", "RunTotals", "reached_step", "count_lost_steps", "final_validation", "attempt_world_sizes", "anomalies", "stragglers", "build_summary", "write_summary"]


@dataclass(frozen=True)
class RootCauseRecord:
    """``summary.json``'s ``root_cause``: what ended the last attempt that failed.

    One record for every way an attempt fails: a worker's error or exit (the rank
    rundir/errorfile.py ``choose_root_cause`` names), a hang (``type`` ``"Hang"``, with
    the stall's ``seconds``, the ``stacks`` dump and ``where`` the stuck rank was), an
    attempt that could not start (``exit`` ``"not started"``), or workers that exited 0
    without a completed checkpoint (``type`` ``"IncompleteRun"``). ``rank`` and ``pid``
    are None where no worker is to blame.
    """

    rank: int | None
    pid: int | None
    exit: str
    type: str | None
    message: str | None
    global_step: int | None
    attempt: int
    # A hang's only: written after ``attempt`` when set, left out otherwise.
    seconds: float | None = None
    stacks: str | None = None
    where: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``root_cause`` object (key order is the file's order)."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _HANG_ONLY:
            if record[name] is None:
                del record[name]
        return record


_HANG_ONLY = ("seconds", "stacks", "where")


@dataclass
class RunTotals:
    """The supervisor's counters for ``run_finished`` and ``summary.json``."""

    restarts: int = 0
    preemptions: int = 0
    membership_changes: int = 0  # elastic resizes (spend no budget)
    lost_steps: int = 0
    root_cause: RootCauseRecord | None = None


def reached_step(run_dir: RunDir, attempt: int) -> int | None:
    """The highest global step any worker of ``attempt`` finished (rundir/stepmarker.py
    ``reached_step``: step markers and error files); None when it left neither, or for
    attempt 0 (there is none before the first)."""
    if attempt < 1:
        return None
    return stepmarker.reached_step(run_dir.attempt(attempt).path)


def count_lost_steps(run_dir: RunDir, records: Iterable[dict[str, Any]]) -> int:
    """Steps executed that a later restore discarded, over the run's whole history.

    For every ``restored`` event of attempt ``a``, the steps attempt ``a-1`` reached
    (:func:`reached_step`: its step markers and error files survive any kill, even of the
    supervisor) beyond the restored step;
    a ``fresh_start`` (nothing was committed before the kill) restores step 0.
    """
    lost = 0
    for record in records:
        if record.get("event") in ("restored", "fresh_start") and isinstance(record.get("attempt"), int):
            reached = reached_step(run_dir, record["attempt"] - 1)
            if reached is not None:
                lost += max(0, reached - record["global_step"])
    return lost


def final_validation(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The last evaluated epoch's val_loss / val_metrics / val_examples (empty if none ran)."""
    last = None
    for record in records:
        if record.get("event") == "epoch_finished" and "val_loss" in record:
            last = record
    if last is None:
        return {}
    return {"val_epoch": last["epoch"] + 1, **{k: last.get(k) for k in ("val_loss", "val_metrics", "val_examples")}}


def anomalies(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``anomaly_detected`` (runner/health/): the step, the batch, the kind, what was done, the
    replay's ``verdict`` (``transient`` / ``deterministic``; None without a replay), and whether
    its batch was then ``skipped`` (--deterministic-anomaly skip)."""
    keys = ("global_step", "epoch", "step_in_epoch", "kind", "replicas", "ranks", "values", "action")
    records = list(records)
    verdicts = {r.get("global_step"): r.get("verdict") for r in records if r.get("event") == "replay_verdict"}
    skipped = {r.get("global_step") for r in records if r.get("event") == "batch_skipped"}
    return [{**{k: record.get(k) for k in keys}, "verdict": verdicts.get(record.get("global_step")),
             "skipped": record.get("global_step") in skipped}
            for record in records if record.get("event") == "anomaly_detected"]


def stragglers(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``straggler_detected`` (runner/health/stragglers.py), with its attempt, the policy's
    decision and numbers, and for a replaced one its ``straggler_replaced``'s (``moved``, ``nodes``,
    ``saved_step``; None otherwise)."""
    keys = ("attempt", "rank", "host", "global_step", "slower", "evidence", "stalled", "others_stalled",
            "busy_ms_per_step", "others_ms_per_step", "steps_per_s", "steps_per_s_lost", "time_lost_s", "action",
            "reason", "gain_s", "restart_cost_s", "restart_cost_from", "steps_left")
    records = list(records)
    replaced = {(r.get("attempt"), r.get("rank")): r for r in records if r.get("event") == "straggler_replaced"}
    out = []
    for record in records:
        if record.get("event") != "straggler_detected":
            continue
        moved = replaced.get((record.get("attempt"), record.get("rank"))) if record.get("action") == "replace" else None
        out.append({**{key: record.get(key) for key in keys},
                    "moved": moved.get("moved") if moved else None, "nodes": moved.get("nodes") if moved else None,
                    "saved_step": moved.get("global_step") if moved else None})
    return out


def attempt_world_sizes(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """``{attempt: workers it ran at}`` (as strings, JSON's keys), from ``worker_started``."""
    ranks: dict[int, set[int | None]] = {}  # a record without a rank still counts once
    for record in records:
        if record.get("event") == "worker_started" and isinstance(record.get("attempt"), int):
            ranks.setdefault(record["attempt"], set()).add(record.get("rank"))
    return {str(attempt): len(ranks[attempt]) for attempt in sorted(ranks)}


def build_summary(
    *,
    status: str,
    run_id: str,
    recipe: str,
    workers: int,
    run_dir: RunDir,
    storage_url: str,
    manifest: Manifest | None,
    totals: RunTotals,
    records: Iterable[dict[str, Any]],
    wall_time_s: float,
    finished_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` object (key order is the file's order)."""
    records = list(records)
    finished_at = finished_at or dt.datetime.now(dt.timezone.utc)
    return {
        "status": status,
        "run_id": run_id,
        "recipe": recipe,
        "epochs": manifest.epoch if manifest else 0,
        "global_step": manifest.global_step if manifest else 0,
        "weights_sha256": manifest.weights_sha256 if manifest else None,
        "checkpoint": f"{storage_url}/{CheckpointStore.dir_name(manifest.global_step)}" if manifest else None,
        # Whether those weights are the ones an uninterrupted run would have (the checkpoint's
        # own record of the inexact resumes behind it: checkpoint/manifest.py); None: no checkpoint.
        "exact": not manifest.inexact if manifest else None,
        "inexact": manifest.inexact if manifest else [],
        "attempts": len(run_dir.attempts()),
        "restarts": totals.restarts,
        "preemptions": totals.preemptions,
        "membership_changes": totals.membership_changes,
        "lost_steps": totals.lost_steps,
        "anomalies": anomalies(records),
        "stragglers": stragglers(records),
        "root_cause": totals.root_cause.to_json() if totals.root_cause is not None else None,
        "workers": workers,
        "world_sizes": attempt_world_sizes(records),
        "run_dir": str(run_dir.path),
        "storage": storage_url,
        "events": str(run_dir.events),
        **final_validation(records),
        # This invocation's wall time, every second in one category (rundir/time_account.py).
        "time_account": account_time(last_invocation(records), wall_s=wall_time_s).to_json(),
        "wall_time_s": round(wall_time_s, 3),
        "finished_at": finished_at.isoformat(timespec="seconds"),
    }


def write_summary(run_dir: RunDir, summary: dict[str, Any]) -> None:
    """Write ``summary`` with URL user info and the run's secrets as ``***`` (its keys are a fixed vocabulary)."""
    write_atomic(run_dir.summary, json.dumps(redact(summary, by_key=False), indent=2) + "\n")
