"""The supervisor: start the worker group, watch it, gang-restart it, report.

MultiWorkerMirroredStrategy cannot re-admit a restarted worker: when one dies, the others
hang in (or fail out of) their collectives. So the unit of recovery is the whole group:
stop every worker, wait a backoff, start a new *attempt* with fresh ports, and let the
workers restore the last committed checkpoint.

# Implementation:
# run() = _prepare() (lock, run id, events, storage checks), _loop(), then supervisor/finish.py
# (lost steps, summary.json, exit code). The loop is a state machine (supervisor/state.py): one _step_*
# method per RunState, each ending in exactly one checked, announced transition, and each
# handed what that transition carried (supervisor/attempt.py: STARTING a Start, HUNG the
# Stall, RESIZING the Resize, STOPPING a Stop that says why, RESTARTING the Restart, FAILED
# a Failed). What the loop knows of the attempt under way is one Attempt (supervisor/attempt.py),
# replaced by the next STARTING. What differs between tiers is a Topology's hooks
# (supervisor/topology.py: GangTopology here, the parameter-server tier's in ps_supervisor.py);
# the elastic decisions are an ElasticPolicy's (supervisor/elastic.py), the restart decisions
# the RestartTracker's (supervisor/policy.py).
#   PREPARING  storage already holds the completed run -> SUCCEEDED at once, else STARTING.
#   STARTING   pick free loopback ports, write attempt-<n>/job.json (credentials as ***),
#              start N workers with TF_CONFIG and the WorkerEnvironment (attempt, run id,
#              generation, the credentials as RT_STORAGE_SECRETS): a warm
#              standby from the StandbyPool (supervisor/standby_pool.py: TensorFlow already
#              imported) where one is alive, else a cold spawn; each worker gets the Linux
#              parent-death signal so it can never outlive a SIGKILLed supervisor.
#              A RestartNotPlacedError (no placement) -> FAILED.
#              Elastic (--workers MIN:MAX): the attempt's size is min(MAX, the launcher's
#              capacity()); a size below MIN, or no placement at any size >= MIN -> FAILED. A
#              size other than the previous attempt's is announced as world_size_changed.
#              The workers started -> a new Attempt, RUNNING.
#   RUNNING    poll children every POLL_S, or at once when one exits (SIGCHLD ends the
#              pause, supervisor/signals.py; the OS tells us of a death at once: no waiting
#              for TensorFlow's ~10 s collective timeout), print new events.jsonl lines,
#              let the launcher reap and refill its standbys. All exited 0 with the
#              completed checkpoint committed -> SUCCEEDED; anything else -> STOPPING.
#              Every WATCH_EVERY_S it reads each rank's step and phase markers into the
#              ProgressWatchdog (supervisor/watchdog.py): no rank advanced for longer than
#              the allowance -> HUNG. Elastic and below MAX: every CAPACITY_EVERY_S, once
#              the attempt trains, ask capacity(); room for more workers -> RESIZING.
#              A preemption notice on a worker's node that is not this host's, or a replaced
#              straggler's marker (Ray, Slurm): the launcher avoids that node; elastic with MIN
#              placeable without it -> RESIZING (a planned shrink), fewer -> stop with 143
#              (ElasticPolicy.notice_elsewhere). A replaced straggler's attempt (its agreed save,
#              143) is settled as a preemption and restarted; straggler_replaced says what moved.
#              (The topology's running_ends decides the first two.)
#   RESIZING   SIGTERM the group (the same agreed save as a preemption) -> STOPPING, which
#              gives it grace_period to save and exit 143; settled as a membership change.
#   HUNG       send SIGUSR1 through the launcher's handles (workers dump their stacks,
#              rundir/stacks.py), wait up to STACKS_WAIT_S for the dumps, name the stuck
#              rank, emit hang_detected; with the memory tier, ask the lowest rank but the
#              stuck one to commit its snapshot (bounded, supervisor/rescue.py) -> STOPPING,
#              which SIGKILLs the group at once (a hung group cannot save at an agreed
#              step) and settles it like a crash: it spends the
#              failure budget, and a hang at the same step twice in a row is a crash loop.
#   STOPPING   the topology's tear_down (GangTopology's here), then _settle:
#              the group hung -> SIGKILL everyone at once (no SIGTERM: nobody can save);
#              a worker exited abnormally -> SIGTERM the rest, SIGKILL after
#              teardown_grace_s, or at once when the chief is gone (only the chief commits
#              and a broken group cannot agree on a save: the survivors have nothing left to
#              finish, and waiting for them is pure recovery time) or when the rescue was
#              answered with nothing left in flight (rescue.nothing_left_to_commit); or the supervisor
#              itself got SIGTERM/SIGINT -> forward SIGTERM (the workers agree on a step,
#              save it and exit 143) and SIGKILL whoever is left after grace_period.
#              Once nobody is left: root cause, then SUCCEEDED (they finished after all),
#              PREEMPTED (our own stop), or the RestartTracker decides RESTARTING / FAILED.
#              Elastic: a failed attempt whose launcher can now place fewer workers than the
#              group had, but >= MIN (a node lost, no spare), and a clean stop for a resize
#              are membership changes: restarted at the new size, no budget spent.
#   RESTARTING announce gang_restart, sleep the backoff -> STARTING with attempt + 1
#              (carrying the Restart's resize, if any).
#
# Everything that touches the outside world (launcher, checkpoint store, restart tracker,
# clock, sleep, signal handlers) is a constructor argument, so the loop can be driven by
# fakes in unit tests.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from typing import Any, Callable, TextIO

from resilient_train.checkpoint import CheckpointStore, Manifest, RetryPolicy
from resilient_train.errors import RestartNotPlacedError
from resilient_train.job.config import STRAGGLER_PROVIDER, JobConfig
from resilient_train.job.fingerprint import fingerprint_for_supervisor, guard_job
from resilient_train.job.recipe import recipe_name
from resilient_train.rundir import events
from resilient_train.rundir.events import emit
from resilient_train.rundir.lock import RunDirLock
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.permissions import run_dir_umask
from resilient_train.rundir.redact import RedactingWriter, register_secrets, secret_values
from resilient_train.rundir.run_record import load_or_create_run_id
from resilient_train.rundir.rescue_signal import rescue_deadline_s
from resilient_train.rundir.stepmarker import read_phase, read_step
from resilient_train.supervisor.attempt import (Attempt, Carried, Failed, Resize, Restart, Start, Stop, StopCause, Worker,
                                                expect_carried)
from resilient_train.supervisor.console import Console, EventTail, isatty
from resilient_train.supervisor.elastic import ElasticPolicy
from resilient_train.supervisor.finish import RunEnd
from resilient_train.supervisor.group import WorkerGroup
from resilient_train.supervisor.hang import collect_hang
from resilient_train.supervisor.launchers import Launcher, make_launcher
from resilient_train.supervisor.launchers.api import read_notices
from resilient_train.supervisor.outcome import OutcomeJudge
from resilient_train.supervisor.ownership import claim_storage
from resilient_train.supervisor.rescue import ask_for_rescue, choose_hang_rescuer, choose_rescuer, failed_ranks
from resilient_train.supervisor.policy import AttemptOutcome, ExitClass, RestartPolicy, RestartTracker
from resilient_train.supervisor.starting import AttemptStarter
from resilient_train.supervisor.signals import ProcessSignals, SignalInstaller, StopRequest
from resilient_train.supervisor.state import RunState, RunStateMachine, WorkerState
from resilient_train.supervisor.summary import RunTotals
from resilient_train.supervisor.topology import POLL_S, GangTopology, Topology
from resilient_train.supervisor.watchdog import HangPolicy, ProgressWatchdog, Stall

__all__ = ["Supervisor", "RunState", "WorkerState"]

WATCH_EVERY_S = 0.25  # how often the watchdog reads the step and phase markers


def default_tracker(job: JobConfig, backoff_initial_s: float = 0.25) -> RestartTracker:
    """Today's restart policy for ``job``: its budgets; the first failure of a streak restarts at
    once, later ones back off exponentially from ``backoff_initial_s``."""
    return RestartTracker(
        RestartPolicy(
            max_restarts=job.max_restarts,
            max_preemptions=job.max_preemptions,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=max(30.0, backoff_initial_s),
            backoff_jitter_s=min(1.0, backoff_initial_s),
            first_restart_immediate=True,
        )
    )


class Supervisor:
    """Runs one job to completion; where its workers run is the launcher's business, how its
    processes form a group the topology's (supervisor/topology.py; default: a gang)."""

    def __init__(
        self,
        job: JobConfig,
        *,
        out: TextIO = sys.stdout,
        launcher: Launcher | None = None,
        store: CheckpointStore | None = None,
        tracker: RestartTracker | None = None,
        signals: SignalInstaller | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        teardown_grace_s: float = 3.0,
        backoff_initial_s: float = 0.25,
        accept_changes: bool = False,
        verbose: bool = False,
        topology: Topology | None = None,
    ) -> None:
        """``backoff_initial_s`` shapes the default tracker only; a given ``tracker`` brings its own policy.

        ``verbose``: the console shows every event as its key=value line instead of sentences
        and the progress display (supervisor/console.py).
        """
        self.job = job
        self.accept_changes = accept_changes
        self.verbose = verbose
        register_secrets(secret_values(job.secrets()))  # no event, file or line of ours shows them
        self.out = Console(RedactingWriter(out), tty=isatty(out))
        self.launcher = launcher or make_launcher(job)
        self.topology = topology if topology is not None else GangTopology()
        self.tail: EventTail | None = None  # the console's view of events.jsonl, from _prepare on
        self.store = store if store is not None else CheckpointStore(
            job.storage, job.storage_options, emit=self._emit_shown,
            retry=RetryPolicy(stall_timeout_s=job.storage_timeout))
        self.tracker = tracker if tracker is not None else default_tracker(job, backoff_initial_s)
        self.signals = signals if signals is not None else ProcessSignals()
        self.run_dir = RunDir(job.run_dir)
        self.machine = RunStateMachine(emit)
        self.stop = StopRequest()  # set by a signal handler, the launcher or a notice, in any state
        self.totals = RunTotals()
        # Between polls: the installer's pause (a child's exit ends it early), unless a test gives its own.
        self.group = WorkerGroup(job, self.launcher, self.run_dir, self.stop, clock=clock,
                                 sleep=sleep if sleep is not None else self.signals.pause,
                                 teardown_grace_s=teardown_grace_s, pump=lambda: self._tail.pump(),
                                 completed=lambda: self._completed_manifest() is not None)
        self.watchdog = ProgressWatchdog(HangPolicy.from_setting(job.hang_timeout, job.startup_timeout))
        self.elastic = ElasticPolicy(job, self.launcher, clock)
        self._starter = AttemptStarter(job, self.launcher, self.store, self.run_dir, self.topology, self.elastic,
                                       self.out, pump=lambda: self._tail.pump())
        self._end = RunEnd(job, self.run_dir, self.store, self.totals, self.topology, self.out,
                           pump=lambda: self._tail.pump(), clock=clock)
        self._avoided: dict[int, list[str]] = {}  # attempt -> the nodes avoided for its notices (node_avoided)
        self._judge = OutcomeJudge(self.run_dir, self.totals, self.out, self.store.url, self.topology, self.group.completed)

    @property
    def state(self) -> RunState:
        return self.machine.state

    @property
    def attempt(self) -> int:
        """The number of the attempt being started (STARTING's Start) or run (``current``'s)."""
        carried = self.machine.carried
        return carried.number if isinstance(carried, Start) else self._current_attempt.number

    @property
    def current(self) -> Attempt | None:
        """The attempt started last (the group's); the next STARTING replaces it."""
        return self.group.current

    @property
    def workers(self) -> list[Worker]:
        """The workers of the attempt started last (none before the first)."""
        return self.group.workers

    @property
    def _current_attempt(self) -> Attempt:
        """``current`` for a step that runs after STARTING made it (before then: a bug in the loop)."""
        if self.current is None:
            raise RuntimeError("no attempt has been started yet")
        return self.current

    @property
    def _tail(self) -> EventTail:
        """``tail`` after _prepare made it (before then: a bug in the loop)."""
        if self.tail is None:
            raise RuntimeError("the console's event tail is made in _prepare")
        return self.tail

    # ------------------------------------------------------------ public
    def run(self) -> int:
        """Train to the end; RunDirLockedError at once when another run holds the run dir.

        Everything is created under the run dir's umask (rundir/permissions.py: 0700/0600 by
        default, ``--run-dir-mode``), set before the first mkdir; workers inherit it.
        """
        with run_dir_umask(self.job.run_dir_mode):
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            with RunDirLock(self.run_dir.path) as lock:
                return self._run_locked(lock)

    def _run_locked(self, lock: RunDirLock) -> int:
        self._end.begin()
        self._prepare(lock)
        done = self._completed_manifest()
        if done is not None:
            return self._already_complete(done)
        elastic: dict[str, Any] = {"min_workers": self.job.world_sizes.start} if self.job.elastic else {}
        emit(
            "run_started",
            recipe=self.job.recipe,
            workers=self.job.workers,
            **elastic,
            run_dir=str(self.run_dir.path),
            storage=self.store.url,
            launcher=self.launcher.name,
        )
        self.signals.install(self._on_stop_signal)
        try:
            self.launcher.prepare()
            self._to(RunState.STARTING, carrying=Start(self.run_dir.next_attempt_number()))
            self._loop()
            return self._end.finish(self.machine.state, self.machine.carried, run_id=self.run_id)
        finally:
            self.launcher.close()
            self.signals.restore()

    def _emit_shown(self, event: str, **fields: Any) -> None:
        """The store's events, shown on the console at once: a retry of the storage probe in
        ``_prepare`` (or of a listing between polls) blocks the loop that pumps the tail, and
        a person watching would see nothing until every retry had run."""
        emit(event, **fields)
        if self.tail is not None:
            self.tail.pump()

    # ------------------------------------------------------------ prepare
    def _prepare(self, lock: RunDirLock) -> None:
        """Run id, event log, console tail, storage checks; the machine stays PREPARING."""
        self.run_id = load_or_create_run_id(self.run_dir, recipe=self.job.recipe)
        lock.record(run_id=self.run_id)
        events.configure(self.run_dir.events, console=None, run_id=self.run_id, role="supervisor")
        planned_epochs = fingerprint_for_supervisor(self.job).epochs  # None: the recipe computes it
        self.tail = EventTail(self.run_dir.events, self.out, verbose=self.verbose, epochs=planned_epochs)
        self.store.check()
        changed = guard_job(self.job, _newest_extra(self.store), accept_changes=self.accept_changes)
        if changed is not None:
            emit("job_changed", **changed)
        claim_storage(self.store, run_id=self.run_id, run_dir=str(self.run_dir.path), force=self.job.force_storage)

    def _already_complete(self, done: Manifest) -> int:
        self.machine.transition(RunState.SUCCEEDED, attempt=None, reason="storage holds the completed checkpoint")
        return self._end.already_complete(done, run_id=self.run_id)

    # ------------------------------------------------------------ loop
    def _loop(self) -> None:
        """One step per state until a terminal one; each step makes exactly one transition and
        is handed what the transition into its state carried (supervisor/attempt.py)."""
        # Each step takes what its state was entered with (``Carried``, one type per state: supervisor/attempt.py).
        steps: dict[RunState, Callable[[Any], None]] = {
            RunState.STARTING: self._step_starting,
            RunState.RUNNING: self._step_running,
            RunState.HUNG: self._step_hung,
            RunState.RESIZING: self._step_resizing,
            RunState.STOPPING: self._step_stopping,
            RunState.RESTARTING: self._step_restarting,
        }
        while not self.machine.is_terminal:
            steps[self.machine.state](self.machine.carried)

    def _to(self, state: RunState, *, reason: str | None = None, carrying: Carried = None) -> None:
        expect_carried(state, carrying)
        attempt = carrying.number if isinstance(carrying, Start) else self.attempt
        self.machine.transition(state, attempt=attempt, reason=reason, carrying=carrying)

    def _step_starting(self, start: Start) -> None:
        """Start the attempt (at its Resize's size after a membership change) -> RUNNING."""
        try:
            previous = self.current.size if self.current is not None else None
            size, workers = self._starter.start(start.number, start.resize, previous=previous, run_id=self.run_id)
        except RestartNotPlacedError as exc:
            self._judge.not_started(start.number, exc, launcher=self.launcher.name, pump=self._tail.pump)
            self._to(RunState.FAILED, reason=f"attempt {start.number} could not start: {exc}", carrying=Failed())
            return
        now = self.group.clock()
        attempt_dir = self.run_dir.attempt(start.number)
        watched = [w.rank for w in self.topology.watched(workers)]
        markers = [(rank, str(attempt_dir.step_marker(rank)), str(attempt_dir.phase_marker(rank))) for rank in watched]
        self.group.current = Attempt(start.number, size, workers, watched_at=now, markers=markers)
        self.watchdog.start_attempt(now, watched)
        self._to(RunState.RUNNING)

    def _step_running(self, _: None) -> None:
        """Watch until the attempt ends or must be stopped (the topology's ``running_ends``:
        -> STOPPING with the Stop), can grow or must move (-> RESIZING with the Resize) or made
        no progress (-> HUNG with the Stall)."""
        while True:
            self.group.poll()
            move = self._notice_elsewhere()
            if move is not None:  # before running_ends: the noticing group may already have exited 143
                self._to(RunState.RESIZING, reason=move.reason, carrying=move)
                return
            ends = self.topology.running_ends(self.group)
            if ends is RunState.SUCCEEDED:
                self._tail.pump()
                self._to(RunState.SUCCEEDED)
                return
            if ends is not None:
                if self.job.memory_tier:
                    ends = dataclasses.replace(ends, rescue_answer=self._ask_for_rescue())
                self._to(RunState.STOPPING, reason=ends.reason, carrying=ends)
                return
            grow = self.elastic.room_to_grow(self._current_attempt.size, self.group.training)
            if grow is not None:
                self._to(RunState.RESIZING, reason=grow.reason, carrying=grow)
                return
            stall = self._watch_progress()
            if stall is not None:
                self._to(RunState.HUNG, reason=f"{self.topology.no_progress} for {stall.seconds:.0f} s "
                         f"(allowed {stall.allowed_s:.0f} s in phase {stall.phase})", carrying=stall)
                return
            self.group.sleep(POLL_S)

    def _ask_for_rescue(self) -> dict[str, Any] | None:
        """The memory tier is on and RUNNING is about to stop: when a worker failed, ask the
        lowest-ranked survivor to commit its in-memory snapshot, and wait (bounded) for its
        answer, so the restart restores it (supervisor/rescue.py). Returns the answer."""
        rescuer = choose_rescuer(self.workers) if self.stop.source is None else None
        if rescuer is not None:
            return self._rescue_from(rescuer, dead_ranks=failed_ranks(self.workers))
        return None

    def _rescue_from(self, rescuer: Worker, **why: Any) -> dict[str, Any] | None:
        """Ask ``rescuer`` to commit its snapshot; wait (bounded) for its answer, and return it."""
        return ask_for_rescue(self.group, self._current_attempt, rescuer, pump=self._tail.pump,
                              deadline_s=rescue_deadline_s(self.job.storage_timeout), **why)

    def _notice_elsewhere(self) -> Resize | None:
        """A worker's node announced its end and the launcher avoids it from now on
        (ElasticPolicy.notice_elsewhere decides; ``node_avoided`` says what): stop with 143
        (the run's stop request), or the Resize the group goes through (-> RESIZING), or None
        (nothing noticed; a fixed-size run that still fits restarts elsewhere as a preemption)."""
        attempt = self._current_attempt
        if self.stop.source is not None:
            return None
        avoided = self.elastic.notice_elsewhere(self.run_dir.attempt(attempt.number), attempt.size)
        if avoided is None:
            return None
        emit("node_avoided", attempt=attempt.number, nodes=avoided.nodes, providers=avoided.providers,
             placeable=avoided.placeable, action=avoided.action)
        self._avoided.setdefault(attempt.number, []).extend(avoided.nodes)
        if avoided.stop_source is not None:
            self.stop.request(avoided.stop_source)
            emit("preemption_requested", source=avoided.stop_source)
        return avoided.resize

    def _step_resizing(self, resize: Resize) -> None:
        """Ask the group to stop at an agreed, saved step (as on a preemption) -> STOPPING,
        which settles the attempt as the membership change ``resize``."""
        for worker in self.group.alive():
            self.group.send_signal(worker, signal.SIGTERM)
        reason = "resize: the group saves at an agreed step"
        self._to(RunState.STOPPING, reason=reason, carrying=Stop(StopCause.RESIZE, reason, resize=resize))

    def _watch_progress(self) -> Stall | None:
        """Feed the watchdog what the markers say (every WATCH_EVERY_S); a Stall when hung."""
        now = self.group.clock()
        attempt = self._current_attempt
        if now - attempt.watched_at < WATCH_EVERY_S:
            return None
        attempt.watched_at = now
        for rank, step_marker, phase_marker in attempt.markers:
            self.watchdog.observe(now, rank, read_step(step_marker), read_phase(phase_marker))
        return self.watchdog.check(now)

    def _step_hung(self, stall: Stall) -> None:
        """Ask every watched worker for its stacks, name the stuck rank, announce it -> STOPPING."""
        watched = self.topology.watched(self.workers)
        hang = collect_hang(self.run_dir.attempt(self.attempt), stall, watched, self.group)
        emit("hang_detected", attempt=self.attempt, **hang)
        self._tail.pump()
        rank, answer = hang["rank"], None
        if self.job.memory_tier and self.stop.source is None:  # a peer of the stuck rank commits its snapshot
            rescuer = choose_hang_rescuer(self.group.alive(), stuck=rank)
            if rescuer is not None:
                answer = self._rescue_from(rescuer, dead_ranks=[], stuck_rank=rank)
        reason = f"hang: rank {rank} made no progress for {stall.seconds:.0f} s"
        self._to(RunState.STOPPING, reason=reason, carrying=Stop(StopCause.HANG, reason, hang=hang, rescue_answer=answer))

    def _step_stopping(self, stop: Stop) -> None:
        """Tear the attempt down (the topology's way), then settle it: root cause and the policy's decision."""
        self.topology.tear_down(self.group, stop)
        self._settle(stop)

    def _settle(self, stop: Stop) -> None:
        """Every worker of the attempt is gone: decide where the run goes."""
        outcome = self._judge.outcome(self.attempt, self.workers, stop, stop_requested=self.stop.source is not None)
        self._tail.pump()
        if outcome is None:
            self._to(RunState.SUCCEEDED)
            return
        self._straggler_replaced(outcome)
        if self.stop.source is None and (doomed := self.launcher.host_doomed(self.run_dir.attempt(self.attempt))):
            self.stop.request(doomed)  # a preemption notice for this host (launchers/api.py host_doomed)
            emit("preemption_requested", source=doomed)
        if self.stop.source is not None:
            self.totals.preemptions += 1
            self._to(RunState.PREEMPTED, reason=f"stop requested ({self.stop.source})")
            return
        resize = self.elastic.membership_change(outcome, stop, self._current_attempt.size)
        if resize is not None:
            outcome = dataclasses.replace(outcome, membership_change=True)
        decision = self.tracker.record(outcome)
        self.totals.restarts = self.tracker.restarts
        self.totals.preemptions = self.tracker.preemptions
        self.totals.membership_changes = self.tracker.membership_changes
        if decision.action == "stop":
            if decision.event:
                emit(decision.event, reason=decision.reason, attempt=self.attempt)
            self._tail.pump()
            self.out.write(f"Stopping: {decision.reason}\n")
            fatal = Failed(fatal=outcome.exit_class is ExitClass.FATAL)
            self._to(RunState.FAILED, reason=decision.reason, carrying=fatal)
            return
        self._to(RunState.RESTARTING, reason=decision.reason, carrying=Restart(decision, resize))

    def _straggler_replaced(self, outcome: AttemptOutcome) -> None:
        """The attempt saved and stopped to replace a straggler (the chief's ``straggler`` marker,
        runner/health/straggler_replace.py): ``straggler_replaced`` says what the restart moves, the
        nodes the launcher avoids from now on (Ray, Slurm: ``_notice_elsewhere``) or, where it can
        place a worker nowhere else (local), only a fresh process. Not when the run itself stops."""
        if self.stop.source is not None or outcome.exit_class is not ExitClass.PREEMPTED:
            return
        nodes = self._avoided.get(self.attempt, [])
        for rank, fields in sorted(read_notices(self.run_dir.attempt(self.attempt)).items()):
            if fields.get("provider") == STRAGGLER_PROVIDER:
                emit("straggler_replaced", attempt=self.attempt, rank=rank, host=fields.get("host"),
                     global_step=outcome.global_step, moved="node_avoided" if nodes else "fresh_process",
                     nodes=nodes, launcher=self.launcher.name)

    def _step_restarting(self, restart: Restart) -> None:
        """Announce the gang restart, wait the backoff -> STARTING the next attempt."""
        decision = restart.decision
        root_cause = self.totals.root_cause
        emit(
            "gang_restart",
            attempt=self.attempt + 1,
            reason=decision.reason,
            root_cause_rank=root_cause.rank if root_cause is not None else None,
            backoff_s=round(decision.backoff_s, 3),
        )
        self._tail.pump()
        self.group.sleep_fully(decision.backoff_s)
        self._to(RunState.STARTING, carrying=Start(self.attempt + 1, restart.resize))

    # ------------------------------------------------------------ signals
    def _on_stop_signal(self, name: str) -> None:
        """The installed SIGTERM/SIGINT callback: record the first request; the loop acts on it."""
        if self.stop.request(name):
            emit("preemption_requested", source=f"supervisor:{name}")

    # ------------------------------------------------------------ helpers
    def _completed_manifest(self) -> Manifest | None:
        manifest = self.store.latest_manifest()
        if manifest is None or not manifest.extra.get("completed"):
            return None
        if self.job.epochs is not None and manifest.epoch < self.job.epochs and not manifest.extra.get("stopped_early"):
            return None  # stopped_early: a callback ended training (runner/keras_recipes/callbacks.py), e.g. EarlyStopping
        if manifest.extra.get("recipe") != recipe_name(self.job.recipe):
            return None  # another recipe's checkpoint: let the workers report the mismatch
        return manifest


def _newest_extra(store: CheckpointStore) -> dict[str, Any] | None:
    manifest = store.latest_manifest()
    return manifest.extra if manifest is not None else None
