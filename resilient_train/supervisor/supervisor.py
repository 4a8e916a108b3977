"""The supervisor: start the worker group, watch it, gang-restart it, report.

MultiWorkerMirroredStrategy cannot re-admit a restarted worker: when one dies, the others
hang in (or fail out of) their collectives. So the unit of recovery is the whole group:
stop every worker, wait a backoff, start a new *attempt* with fresh ports, and let the
workers restore the last committed checkpoint.

# Implementation:
# One loop, one state variable (RunState). Each attempt:
#   STARTING   pick free loopback ports, write attempt-<n>/job.json, start N workers with
#              TF_CONFIG / RT_ATTEMPT / RT_RUN_ID: a warm standby from the StandbyPool
#              (supervisor/standby.py: TensorFlow already imported) where one is alive,
#              else a cold spawn; each worker gets the Linux parent-death signal so it can
#              never outlive a SIGKILLed supervisor.
#   RUNNING    poll children every POLL_S (the OS tells us of a death at once: no waiting
#              for TensorFlow's ~10 s collective timeout), print new events.jsonl lines,
#              let the pool reap and refill its standbys.
#   STOPPING   a worker exited abnormally -> SIGTERM the rest, SIGKILL after
#              teardown_grace_s, or at once when the chief is gone (only the chief commits
#              and a broken group cannot agree on a save: the survivors have nothing left to
#              finish, and waiting for them is pure recovery time); or the supervisor
#              itself got SIGTERM/SIGINT -> forward
#              SIGTERM (the workers agree on a step, save it and exit 143) and SIGKILL
#              whoever is left after grace_period.
#   then       SUCCEEDED (all exited 0), or the RestartTracker decides: RESTARTING (sleep
#              the backoff, next attempt) or FAILED / PREEMPTED (stop, write summary.json).
#
# Everything that touches the outside world (spawning, clock, sleep, signals) is a
# constructor argument, so the loop can be driven by fakes in unit tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, TextIO

from resilient_train.rundir import events
from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.job.config import JobConfig
from resilient_train.rundir.errorfile import choose_root_cause, log_tail, read_errors
from resilient_train.errors import (
    EXIT_FAILURE,
    EXIT_FATAL,
    EXIT_OK,
    EXIT_PREEMPTED,
    LaunchError,
)
from resilient_train.rundir.events import emit, read_events
from resilient_train.job.fingerprint import guard_job
from resilient_train.job.recipe import recipe_name
from resilient_train.rundir.stepmarker import highest_step
from resilient_train.supervisor.console import EventTail
from resilient_train.supervisor.launchers import Launcher, WorkerHandle, WorkerSpec, make_launcher
from resilient_train.supervisor.policy import (
    AttemptOutcome,
    ExitClass,
    RestartPolicy,
    RestartTracker,
    classify,
)
from resilient_train.supervisor.ownership import claim_storage, generation_for
from resilient_train.rundir.lock import RunDirLock

__all__ = ["Supervisor", "RunState", "WorkerState"]

POLL_S = 0.05


class RunState(str, Enum):
    """The run's state. Transitions (the only ones the loop makes):

    STARTING -> RUNNING                   workers spawned
    RUNNING -> SUCCEEDED                  every worker exited 0
    RUNNING -> STOPPING                   a worker failed, or the supervisor was signalled
    STOPPING -> RESTARTING                the policy grants a restart
    STOPPING -> FAILED                    fatal error, budget exhausted, crash loop
    STOPPING -> PREEMPTED                 the supervisor itself was asked to stop
    RESTARTING -> STARTING                after the backoff
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"


class WorkerState(str, Enum):
    """A worker's state within one attempt: RUNNING -> EXITED (by itself) or KILLED (by us)."""

    RUNNING = "running"
    EXITED = "exited"
    KILLED = "killed"


@dataclass
class Worker:
    rank: int
    attempt: int
    process: WorkerHandle
    log_path: Path
    state: WorkerState = WorkerState.RUNNING
    returncode: int | None = None
    exit_time: float | None = None
    stopped: bool = False  # SIGSTOPped (or otherwise stopped) when we had to SIGKILL it


@dataclass
class _Totals:
    restarts: int = 0
    preemptions: int = 0
    lost_steps: int = 0
    root_cause: dict[str, Any] | None = None


class Supervisor:
    """Runs one job to completion; where its workers run is the launcher's business."""

    def __init__(
        self,
        job: JobConfig,
        *,
        out: TextIO = sys.stdout,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        teardown_grace_s: float = 3.0,
        backoff_initial_s: float = 0.25,
        accept_changes: bool = False,
    ) -> None:
        self.job = job
        self.accept_changes = accept_changes
        self.out = out
        self.launcher = launcher or make_launcher(job)
        self.clock = clock
        self.sleep = sleep
        self.teardown_grace_s = teardown_grace_s
        self.run_dir = Path(job.run_dir)
        self.events_path = self.run_dir / "events.jsonl"
        self.store = CheckpointStore(job.storage, job.storage_options)
        self.tracker = RestartTracker(
            RestartPolicy(
                max_restarts=job.max_restarts,
                max_preemptions=job.max_preemptions,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=max(30.0, backoff_initial_s),
                backoff_jitter_s=min(1.0, backoff_initial_s),
            )
        )
        self.state = RunState.STARTING
        self.stop_signal: str | None = None
        self.totals = _Totals()

    # ------------------------------------------------------------ public
    def run(self) -> int:
        """Train to the end; RunDirLockedError at once when another run holds the run dir."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with RunDirLock(self.run_dir) as lock:
            return self._run_locked(lock)

    def _run_locked(self, lock: RunDirLock) -> int:
        started = self.clock()
        self.run_id = self._run_id()
        lock.record(run_id=self.run_id)
        events.configure(self.events_path, console=None, run_id=self.run_id, role="supervisor")
        tail = EventTail(self.events_path, self.out)
        self.store.check()
        changed = guard_job(self.job, _newest_extra(self.store), accept_changes=self.accept_changes)  # issue 11
        if changed is not None:
            emit("job_changed", **changed)
        claim_storage(self.store, run_id=self.run_id, run_dir=str(self.run_dir), force=self.job.force_storage)

        done = self._completed_manifest()
        if done is not None:
            emit("run_already_complete", global_step=done.global_step, weights_sha256=done.weights_sha256)
            tail.pump()
            self.out.write(
                f"Run {self.run_dir} already completed at global step {done.global_step} "
                f"(weights_sha256 {done.weights_sha256[:16]}...); nothing to do.\n"
            )
            self._write_summary("completed", done, started)
            return EXIT_OK

        emit(
            "run_started",
            recipe=self.job.recipe,
            workers=self.job.workers,
            run_dir=str(self.run_dir),
            storage=self.store.url,
            launcher=self.launcher.name,
        )
        self._install_signal_handlers()
        attempt = self._first_attempt()
        try:
            self.launcher.prepare()
            while True:
                self.state = RunState.STARTING
                try:
                    workers = self._start(attempt)
                except LaunchError as exc:
                    return self._not_started(attempt, exc, started, tail)
                self.state = RunState.RUNNING
                self._watch(workers, tail)
                outcome = self._outcome(attempt, workers)
                tail.pump()
                if outcome is None:
                    self.state = RunState.SUCCEEDED
                    return self._finish("completed", started, tail)
                if self.stop_signal is not None:
                    self.state = RunState.PREEMPTED
                    self.totals.preemptions += 1
                    return self._finish("preempted", started, tail)
                decision = self.tracker.record(outcome)
                self.totals.restarts = self.tracker.restarts
                self.totals.preemptions = self.tracker.preemptions
                if decision.action == "stop":
                    self.state = RunState.FAILED
                    if decision.event:
                        emit(decision.event, reason=decision.reason, attempt=attempt)
                    tail.pump()
                    self.out.write(f"Stopping: {decision.reason}\n")
                    return self._finish("failed", started, tail, fatal=outcome.exit_class is ExitClass.FATAL)
                self.state = RunState.RESTARTING
                emit(
                    "gang_restart",
                    attempt=attempt + 1,
                    reason=decision.reason,
                    root_cause_rank=(self.totals.root_cause or {}).get("rank"),
                    backoff_s=round(decision.backoff_s, 3),
                )
                tail.pump()
                self.sleep(decision.backoff_s)
                attempt += 1
        finally:
            self.launcher.close()
            self._restore_signal_handlers()

    # ------------------------------------------------------------ attempt
    def _start(self, attempt: int) -> list[Worker]:
        attempt_dir = self.run_dir / f"attempt-{attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        env = {"RT_ATTEMPT": str(attempt), "RT_RUN_ID": self.run_id, "PYTHONUNBUFFERED": "1"}
        env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
        env["RT_GENERATION"] = str(generation_for(self.store, attempt))  # the chief claims it
        specs = [WorkerSpec(rank, attempt, self.job, env, attempt_dir) for rank in range(self.job.workers)]
        specs[0].job_path.write_text(self.job.to_json())
        handles = self.launcher.start(specs)
        workers = []
        for spec, handle in zip(specs, handles):
            workers.append(Worker(spec.rank, attempt, handle, spec.log_path))
            emit("worker_started", rank=spec.rank, pid=handle.pid, attempt=attempt, log=str(spec.log_path),
                 **self.launcher.describe(handle))
        return workers

    def _not_started(self, attempt: int, exc: LaunchError, started: float, tail: EventTail) -> int:
        """The launcher could not start a restart (e.g. no node for a lost slot): the run fails.

        Like an exhausted budget: root cause, ``launch_failed``, ``summary.json`` naming the
        last commit, ``EXIT_FAILURE``; a re-run (once the cluster can place it) resumes there.
        """
        self.state = RunState.FAILED
        self.totals.root_cause = {
            "rank": None, "pid": None, "exit": "not started", "type": type(exc).__name__,
            "message": str(exc), "global_step": self._reached(attempt - 1), "attempt": attempt,
        }
        emit("launch_failed", attempt=attempt, launcher=self.launcher.name, reason=str(exc))
        tail.pump()
        self.out.write(f"Stopping: attempt {attempt} could not start: {exc}\n")
        return self._finish("failed", started, tail)

    def _watch(self, workers: list[Worker], tail: EventTail) -> None:
        kill_at: float | None = None
        forwarded = False
        while True:
            tail.pump()
            self.launcher.maintain(training=self._training(workers))
            for worker in workers:
                if worker.returncode is None:
                    code = worker.process.poll()
                    if code is not None:
                        self._exited(worker, code)
            alive = [w for w in workers if w.returncode is None]
            if not alive:
                return
            failed = any(w.returncode not in (None, EXIT_OK) for w in workers)
            now = self.clock()
            if self.stop_signal is None and self.launcher.stop_requested():
                self.stop_signal = f"launcher:{self.launcher.name}"
                emit("preemption_requested", source=self.stop_signal)
            if self.stop_signal is not None and not forwarded:
                forwarded = True
                for worker in alive:
                    _signal(worker, signal.SIGTERM)
                kill_at = now + self.job.grace_period
            elif failed and kill_at is None:
                self.state = RunState.STOPPING
                if self._preempting(workers):
                    # The peers agreed on the same step and are saving it; a second SIGTERM
                    # would only race their exit. They get the grace period, then SIGKILL.
                    kill_at = now + self.job.grace_period
                else:
                    for worker in alive:
                        _signal(worker, signal.SIGTERM)
                    kill_at = now if self._chief_failed(workers) else now + self.teardown_grace_s
            if kill_at is not None and now >= kill_at:
                for worker in alive:
                    worker.stopped = worker.stopped or _is_stopped(worker.process.pid)
                    worker.state = WorkerState.KILLED
                    _signal(worker, signal.SIGKILL)
            self.sleep(POLL_S)

    def _training(self, workers: list[Worker]) -> bool:
        """The chief finished a step of this attempt (its step marker is written)."""
        chief = next((w for w in workers if w.rank == 0), None)
        if chief is None:
            return False
        try:
            return (chief.log_path.parent / "step-0.txt").stat().st_size > 0
        except OSError:
            return False

    def _chief_failed(self, workers: list[Worker]) -> bool:
        """The chief exited abnormally: nobody left can commit, so nothing is worth waiting for."""
        return any(w.rank == 0 and w.returncode not in (None, EXIT_OK) for w in workers)

    def _preempting(self, workers: list[Worker]) -> bool:
        """A worker exited 'preempted': its peers are saving at the agreed step; let them."""
        return any(w.returncode == EXIT_PREEMPTED for w in workers)

    def _exited(self, worker: Worker, code: int) -> None:
        worker.returncode = code
        worker.exit_time = self.clock()
        if worker.state is WorkerState.RUNNING:
            worker.state = WorkerState.EXITED
        fields: dict[str, Any] = {"rank": worker.rank, "pid": worker.process.pid, "attempt": worker.attempt}
        if code < 0:
            fields["signal"] = signal.Signals(-code).name
        else:
            fields["exit_code"] = code
        lost = self.launcher.lost_reason(worker.process)
        if lost is not None:  # e.g. "node lost": the launcher knows better than the exit code
            fields["reason"] = lost
        emit("worker_exited", **fields, state=worker.state.value)
        if code not in (EXIT_OK,):
            emit(
                "worker_failed" if code != EXIT_PREEMPTED else "worker_preempted",
                **fields,
                classification=classify(code).value,
            )

    def _outcome(self, attempt: int, workers: list[Worker]) -> AttemptOutcome | None:
        """None when every worker exited 0 and the run's final checkpoint is committed;
        otherwise what ended the attempt."""
        attempt_dir = self.run_dir / f"attempt-{attempt}"
        if all(w.returncode == EXIT_OK for w in workers):
            if self._completed_manifest() is not None:
                return None
            return self._exited_without_completing(attempt)
        exits = {w.rank: (w.process.pid, w.returncode, w.exit_time) for w in workers}
        root = choose_root_cause(
            exits, read_errors(attempt_dir), lambda rank: log_tail(attempt_dir / f"worker-{rank}.log", 15),
            exit_notes={w.rank: _STOPPED_NOTE for w in workers if w.stopped},
        )
        reached = self._reached(attempt)
        if reached is not None:
            emit("attempt_reached", attempt=attempt, global_step=reached)
        preempted = self.stop_signal is not None or any(w.returncode == EXIT_PREEMPTED for w in workers)
        if root is None:  # everyone exited 0 or 143: a clean preemption
            return AttemptOutcome(attempt, ExitClass.PREEMPTED, "preempted", reached, preempted=True)
        self.totals.root_cause = {
            "rank": root.rank,
            "pid": root.pid,
            "exit": root.exit_description,
            "type": root.error.type if root.error else None,
            "message": root.error.message if root.error else None,
            "global_step": root.global_step,
            "attempt": attempt,
        }
        if not preempted:
            self.out.write(root.render() + "\n")
        exit_class = classify(root.returncode) if root.returncode is not None else ExitClass.FAILED
        if preempted and exit_class is not ExitClass.FATAL:
            exit_class = ExitClass.PREEMPTED
        return AttemptOutcome(attempt, exit_class, root.signature, root.global_step, preempted=preempted)

    def _exited_without_completing(self, attempt: int) -> AttemptOutcome:
        """Every worker exited 0, yet storage holds no completed checkpoint.

        A worker only exits 0 after the chief committed the final, ``completed`` manifest,
        so this is never success: the checkpoints went where the supervisor cannot see
        them (a per-process ``memory://`` filesystem) or a worker quit early. Reporting
        "completed" here would hand the user a digest of nothing.
        """
        reached = self._reached(attempt)
        signature = "workers exited 0 but no completed checkpoint is in storage"
        self.totals.root_cause = {
            "rank": None, "pid": None, "exit": "exit code 0", "type": "IncompleteRun",
            "message": f"{signature} ({self.store.url})", "global_step": reached, "attempt": attempt,
        }
        emit("attempt_incomplete", attempt=attempt, global_step=reached, storage=self.store.url)
        self.out.write(f"Attempt {attempt}: {signature} ({self.store.url}).\n")
        return AttemptOutcome(attempt, ExitClass.FAILED, signature, reached)

    def _reached(self, attempt: int) -> int | None:
        """The highest global step any worker of ``attempt`` finished (from its step marker)."""
        return highest_step(self.run_dir / f"attempt-{attempt}")

    # ------------------------------------------------------------ results
    def _finish(self, status: str, started: float, tail: EventTail, *, fatal: bool = False) -> int:
        manifest = self.store.latest_manifest()
        self._count_lost_steps()
        summary = self._write_summary(status, manifest, started)
        emit(
            "run_finished",
            status=status,
            global_step=summary["global_step"],
            weights_sha256=summary["weights_sha256"],
            restarts=self.totals.restarts,
            preemptions=self.totals.preemptions,
            lost_steps=self.totals.lost_steps,
        )
        tail.pump()
        self.out.write(
            f"Run {status}: global step {summary['global_step']}, weights_sha256 "
            f"{summary['weights_sha256']}\nSummary: {self.run_dir / 'summary.json'}  "
            f"Events: {self.events_path}  Logs: {self.run_dir}/attempt-*/worker-*.log\n"
        )
        if status == "completed":
            return EXIT_OK
        if status == "preempted":
            return EXIT_PREEMPTED
        return EXIT_FATAL if fatal else EXIT_FAILURE

    def _count_lost_steps(self) -> None:
        """Steps executed that a later restore discarded, over the run's whole history.

        For every ``restored`` event of attempt ``a``, the steps attempt ``a-1`` reached
        (its step markers survive any kill, even of the supervisor) beyond the restored step;
        a ``fresh_start`` (nothing was committed before the kill) restores step 0.
        """
        lost = 0
        for record in read_events(self.events_path):
            if record.get("event") in ("restored", "fresh_start") and isinstance(record.get("attempt"), int):
                reached = self._reached(record["attempt"] - 1)
                if reached is not None:
                    lost += max(0, reached - record["global_step"])
        self.totals.lost_steps = lost

    def _write_summary(self, status: str, manifest: Manifest | None, started: float) -> dict[str, Any]:
        attempts = len(list(self.run_dir.glob("attempt-*")))
        summary = {
            "status": status,
            "run_id": self.run_id,
            "recipe": self.job.recipe,
            "epochs": manifest.epoch if manifest else 0,
            "global_step": manifest.global_step if manifest else 0,
            "weights_sha256": manifest.weights_sha256 if manifest else None,
            "checkpoint": f"{self.store.url}/{CheckpointStore.dir_name(manifest.global_step)}" if manifest else None,
            "attempts": attempts,
            "restarts": self.totals.restarts,
            "preemptions": self.totals.preemptions,
            "lost_steps": self.totals.lost_steps,
            "root_cause": self.totals.root_cause,
            "workers": self.job.workers,
            "run_dir": str(self.run_dir),
            "storage": self.store.url,
            "events": str(self.events_path),
            **_final_validation(self.events_path),
            "wall_time_s": round(self.clock() - started, 3),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, self.run_dir / "summary.json")
        return summary

    # ------------------------------------------------------------ helpers
    def _run_id(self) -> str:
        path = self.run_dir / "run.json"
        if path.exists():
            try:
                return json.loads(path.read_text())["run_id"]
            except (ValueError, KeyError):
                pass
        run_id = uuid.uuid4().hex[:12]
        path.write_text(json.dumps({"run_id": run_id, "recipe": self.job.recipe}) + "\n")
        return run_id

    def _first_attempt(self) -> int:
        numbers = [int(p.name.split("-", 1)[1]) for p in self.run_dir.glob("attempt-*") if p.name.split("-", 1)[1].isdigit()]
        return max(numbers, default=0) + 1

    def _completed_manifest(self) -> Manifest | None:
        manifest = self.store.latest_manifest()
        if manifest is None or not manifest.extra.get("completed"):
            return None
        if self.job.epochs is not None and manifest.epoch < self.job.epochs:
            return None
        if manifest.extra.get("recipe") != recipe_name(self.job.recipe):
            return None  # another recipe's checkpoint: let the workers report the mismatch
        return manifest

    def _install_signal_handlers(self) -> None:
        self._previous = {}

        def handler(signum: int, frame: Any) -> None:
            if self.stop_signal is None:
                self.stop_signal = signal.Signals(signum).name
                emit("preemption_requested", source=f"supervisor:{self.stop_signal}")

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (tests driving the loop)
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, previous in getattr(self, "_previous", {}).items():
            signal.signal(sig, previous)


def _final_validation(events_path: Path) -> dict[str, Any]:
    """The last evaluated epoch's val_loss / val_metrics / val_examples (empty if none ran)."""
    last = None
    for record in read_events(events_path):
        if record.get("event") == "epoch_finished" and "val_loss" in record:
            last = record
    if last is None:
        return {}
    return {"val_epoch": last["epoch"] + 1, **{k: last.get(k) for k in ("val_loss", "val_metrics", "val_examples")}}
_STOPPED_NOTE = "stopped responding (process stopped, e.g. SIGSTOP; the supervisor SIGKILLed it)"


def _is_stopped(pid: int) -> bool:
    """Whether a local process is stopped (state T/t in /proc); False when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][:1] in ("T", "t")
    except (OSError, IndexError):
        return False


def _newest_extra(store: CheckpointStore) -> dict[str, Any] | None:
    manifest = store.latest_manifest()
    return manifest.extra if manifest is not None else None


def _signal(worker: Worker, sig: int) -> None:
    try:
        worker.process.send_signal(sig)
    except ProcessLookupError:
        pass
