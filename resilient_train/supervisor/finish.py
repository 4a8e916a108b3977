"""The run's last words: summary.json, ``run_finished``, the final console line, the exit code.

Written once the loop reached a terminal state (or found the run already complete in
storage): lost steps counted from the markers and events (supervisor/summary.py), the summary
built with the topology's own keys, then the one line a person reads last. The exit code is
the terminal state's: 0 completed, 143 preempted, 3 fatal, 1 failed (errors.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.errors import EXIT_FAILURE, EXIT_FATAL, EXIT_OK, EXIT_PREEMPTED
from resilient_train.job.config import JobConfig
from resilient_train.rundir.events import emit, read_events
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor.attempt import Failed
from resilient_train.supervisor.console import Console, inexact_text
from resilient_train.supervisor.state import RunState
from resilient_train.supervisor.summary import RunTotals, build_summary, count_lost_steps, write_summary
from resilient_train.supervisor.topology import Topology

__all__ = ["RunEnd"]

# What each terminal state reports as summary.json's / run_finished's ``status``.
_STATUS = {RunState.SUCCEEDED: "completed", RunState.PREEMPTED: "preempted", RunState.FAILED: "failed"}


class RunEnd:
    """Ends one run (see the module docstring)."""

    def __init__(self, job: JobConfig, run_dir: RunDir, store: CheckpointStore, totals: RunTotals,
                 topology: Topology, out: Console, pump: Callable[[], object], clock: Callable[[], float]) -> None:
        """``pump()``: print new events.jsonl lines (the console catches up before our line)."""
        self.job = job
        self.run_dir = run_dir
        self.store = store
        self.totals = totals
        self.topology = topology
        self.out = out
        self._pump = pump
        self._clock = clock
        self._started: float | None = None

    def begin(self) -> None:
        """The run starts now: summary.json's wall time counts from here."""
        self._started = self._clock()

    def already_complete(self, done: Manifest, *, run_id: str) -> int:
        """Storage held the completed checkpoint before any attempt: say so, nothing to do."""
        emit("run_already_complete", global_step=done.global_step, weights_sha256=done.weights_sha256)
        self._pump()
        self.out.write(
            f"Run {self.run_dir.path} already completed{_not_exact(done.inexact)} at global step {done.global_step} "
            f"(weights_sha256 {done.weights_sha256[:16]}...){_not_exact_why(done.inexact)}; nothing to do.\n"
        )
        self.write_summary("completed", done, run_id=run_id)
        return EXIT_OK

    def finish(self, state: RunState, carried: object, *, run_id: str) -> int:
        """The run reached terminal ``state`` (entered carrying ``carried``): count lost steps,
        write summary.json, announce and print the end; the exit code."""
        status = _STATUS[state]
        manifest = self.store.latest_manifest()
        self.totals.lost_steps = count_lost_steps(self.run_dir, read_events(self.run_dir.events))
        summary = self.write_summary(status, manifest, run_id=run_id)
        emit(
            "run_finished",
            status=status,
            global_step=summary["global_step"],
            weights_sha256=summary["weights_sha256"],
            restarts=self.totals.restarts,
            preemptions=self.totals.preemptions,
            lost_steps=self.totals.lost_steps,
            exact=summary["exact"],
            inexact=summary["inexact"],
        )
        self._pump()
        self.out.write(
            f"Run {status}{_not_exact(summary['inexact'])}: global step {summary['global_step']}, weights_sha256 "
            f"{summary['weights_sha256']}{_not_exact_why(summary['inexact'])}\nSummary: {self.run_dir.summary}  "
            f"Events: {self.run_dir.events}  Logs: {self.run_dir.worker_logs_glob}\n"
        )  # the run command writes the page next and prints its path (commands/run.py)
        if status == "completed":
            return EXIT_OK
        if status == "preempted":
            return EXIT_PREEMPTED
        return EXIT_FATAL if isinstance(carried, Failed) and carried.fatal else EXIT_FAILURE

    def write_summary(self, status: str, manifest: Manifest | None, *, run_id: str) -> dict[str, Any]:
        if self._started is None:
            raise RuntimeError("the run's end is written after begin()")
        started = self._started
        summary = build_summary(
            status=status,
            run_id=run_id,
            recipe=self.job.recipe,
            workers=self.job.workers,
            run_dir=self.run_dir,
            storage_url=self.store.url,
            manifest=manifest,
            totals=self.totals,
            records=read_events(self.run_dir.events),
            wall_time_s=self._clock() - started,
            finished_at=dt.datetime.now(dt.timezone.utc),
        )
        summary.update(self.topology.summary_fields())
        write_summary(self.run_dir, summary)
        return summary


def _not_exact(inexact: list[dict[str, Any]]) -> str:
    """``, NOT exact`` after the run's status when its newest checkpoint records inexact resumes."""
    return ", NOT exact" if inexact else ""


def _not_exact_why(inexact: list[dict[str, Any]]) -> str:
    """Why, at the end of the final line (console.inexact_text's words)."""
    return f"; not an uninterrupted run's weights: {inexact_text(inexact)}" if inexact else ""
