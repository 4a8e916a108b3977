"""What ended an attempt: the root cause, and the AttemptOutcome the restart policy decides on.

STOPPING has torn the group down (supervisor/topology.py); before the run goes anywhere the
attempt is judged once, here (and an attempt the launcher could not start, ``not_started``): finished (None), a hang (the stuck rank is the root cause), every
worker out with exit 0 but no completed checkpoint (never success), or the earliest failure
among the error files and exit codes (rundir/errorfile.py ``choose_root_cause``). The root
cause is recorded in the run's totals (summary.json's ``root_cause``) and printed unless the
run itself was stopping.
"""

from __future__ import annotations

from typing import Any, Callable

from resilient_train.errors import EXIT_OK, EXIT_PREEMPTED
from resilient_train.rundir.errorfile import choose_root_cause, log_tail, read_errors
from resilient_train.rundir.events import emit
from resilient_train.rundir.layout import AttemptDir, RunDir
from resilient_train.supervisor.attempt import Stop, Worker
from resilient_train.supervisor.console import Console, hang_line
from resilient_train.supervisor.policy import AttemptOutcome, ExitClass, classify
from resilient_train.supervisor.state import WorkerState
from resilient_train.supervisor.summary import RootCauseRecord, RunTotals, reached_step
from resilient_train.supervisor.topology import Topology

__all__ = ["OutcomeJudge"]

_FROZEN_NOTE = "stopped responding (process stopped, e.g. SIGSTOP; the supervisor SIGKILLed it)"


class OutcomeJudge:
    """Judges each attempt of one run (see the module docstring); writes ``totals.root_cause``."""

    def __init__(self, run_dir: RunDir, totals: RunTotals, out: Console, storage_url: str, topology: Topology,
                 completed: Callable[[], bool]) -> None:
        self.run_dir = run_dir
        self.totals = totals
        self.out = out
        self.storage_url = storage_url
        self.topology = topology
        self.completed = completed

    def outcome(self, attempt: int, workers: list[Worker], stop: Stop, *, stop_requested: bool) -> AttemptOutcome | None:
        """None when the attempt finished the run (the topology's ``finished``: with the run's
        final checkpoint committed); otherwise what ended the attempt ``stop`` stopped."""
        attempt_dir: AttemptDir = self.run_dir.attempt(attempt)
        if self.topology.finished(workers, self.completed):
            return None
        if all(w.returncode == EXIT_OK for w in workers):
            return self._exited_without_completing(attempt)
        if stop.hang is not None and not stop_requested:
            return self._hung_outcome(attempt, stop.hang)
        exits = {w.rank: (w.process.pid, w.returncode, w.exit_time) for w in workers  # those that exited
                 if w.returncode is not None and w.exit_time is not None}
        reached = self.reached(attempt)
        root = choose_root_cause(
            exits, read_errors(attempt_dir.path), lambda rank: log_tail(attempt_dir.log(rank), 15),
            exit_notes={w.rank: _FROZEN_NOTE for w in workers if w.frozen},
            torn_down={w.rank for w in workers if w.state is WorkerState.KILLED and not w.frozen},
            reached=reached,
        )
        if reached is not None:
            emit("attempt_reached", attempt=attempt, global_step=reached)
        preempted = stop_requested or any(w.returncode == EXIT_PREEMPTED for w in workers)
        if root is None:  # everyone exited 0 or 143: a clean preemption
            return AttemptOutcome(attempt, ExitClass.PREEMPTED, "preempted", reached, preempted=True)
        self.totals.root_cause = RootCauseRecord(
            rank=root.rank,
            pid=root.pid,
            exit=root.exit_description,
            type=root.error.type if root.error else None,
            message=root.error.message if root.error else None,
            global_step=root.global_step,
            attempt=attempt,
        )
        if not preempted:
            self.out.write(root.render() + "\n")
        exit_class = classify(root.returncode) if root.returncode is not None else ExitClass.FAILED
        if preempted and exit_class is not ExitClass.FATAL:
            exit_class = ExitClass.PREEMPTED
        return AttemptOutcome(attempt, exit_class, root.signature, root.global_step, preempted=preempted)

    def _hung_outcome(self, attempt: int, hang: dict[str, Any]) -> AttemptOutcome:
        """The attempt hung (``hang``: hang_detected's fields) and was killed: the stuck rank
        is the root cause.

        Its signature names the rank, so a hang at the same step on the same rank in two
        attempts in a row is a crash loop (policy.py); each hang spends the failure budget.
        """
        reached = self.reached(attempt)
        if reached is not None:
            emit("attempt_reached", attempt=attempt, global_step=reached)
        self.totals.root_cause = RootCauseRecord(
            rank=hang["rank"], pid=hang["pid"], exit="hung (no progress; the supervisor SIGKILLed the group)",
            type="Hang", message=hang_line(hang), global_step=hang["global_step"], attempt=attempt,
            seconds=hang["seconds"], stacks=hang["stacks"], where=hang["where"],
        )
        return AttemptOutcome(attempt, ExitClass.FAILED, f"hang on rank {hang['rank']}", hang["global_step"])

    def _exited_without_completing(self, attempt: int) -> AttemptOutcome:
        """Every worker exited 0, yet storage holds no completed checkpoint.

        A worker only exits 0 after the chief committed the final, ``completed`` manifest,
        so this is never success: the checkpoints went where the supervisor cannot see
        them (a per-process ``memory://`` filesystem) or a worker quit early. Reporting
        "completed" here would hand the user a digest of nothing.
        """
        reached = self.reached(attempt)
        signature = "workers exited 0 but no completed checkpoint is in storage"
        self.totals.root_cause = RootCauseRecord(
            rank=None, pid=None, exit="exit code 0", type="IncompleteRun",
            message=f"{signature} ({self.storage_url})", global_step=reached, attempt=attempt,
        )
        emit("attempt_incomplete", attempt=attempt, global_step=reached, storage=self.storage_url)
        self.out.write(f"Attempt {attempt}: {signature} ({self.storage_url}).\n")
        return AttemptOutcome(attempt, ExitClass.FAILED, signature, reached)

    def not_started(self, attempt: int, exc: Exception, *, launcher: str, pump: Callable[[], object]) -> None:
        """The launcher could not start a restart (e.g. no node for a lost slot): the run fails.

        Like an exhausted budget: root cause, ``launch_failed``, ``summary.json`` naming the
        last commit, ``EXIT_FAILURE``; a re-run (once the cluster can place it) resumes there.
        """
        self.totals.root_cause = RootCauseRecord(
            rank=None, pid=None, exit="not started", type=type(exc).__name__,
            message=str(exc), global_step=self.reached(attempt - 1), attempt=attempt,
        )
        emit("launch_failed", attempt=attempt, launcher=launcher, reason=str(exc))
        pump()
        self.out.write(f"Stopping: attempt {attempt} could not start: {exc}\n")

    def reached(self, attempt: int) -> int | None:
        """The highest global step any worker of ``attempt`` finished (from its step marker)."""
        return reached_step(self.run_dir, attempt)
