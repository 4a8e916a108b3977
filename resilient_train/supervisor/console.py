"""The human view of a run, read from events.jsonl: sentences for people, fields for developers.

The supervisor does not print its own prose about events: it tails the same event stream
other tools read, so what a person sees and what ``events.jsonl`` records cannot drift apart.

What the default console shows is decided in one place, :data:`CONSOLE`: for every event of
docs/events.md either a function that turns the record into a sentence (it may return
None when this occurrence says nothing a person needs, e.g. a worker that exited 0) or
None, hidden. Hidden events are evidence for tools and developers (``iterator_state_sized``,
``checkpoint_waited``, ``generation_claimed``, ...): ``--verbose`` shows every event instead
as the ``HH:MM:SS event key=value ...`` line of :func:`~resilient_train.rundir.events.render_line`,
and an event missing from the table is shown that way too until someone decides for it.

``script_output`` (a line the chief printed: runner/outputs/script_output.py) is the one event shown
as itself, without a clock, so a script's ``print`` reads on the console as under plain Keras.

``train_progress`` is not a line but the progress display: the whole run's position,
percentage and ETA (``step 1,220/8,000  15%  ETA 4m10s``) when the planned epochs are known
(the event's ``epochs``; a fit script's too). The steps/s and the ETA are the steady rate of
supervisor/eta.py: none from an attempt's first call (tracing, and a restart's start-up),
and no ``ETA`` until a few seconds of the attempt were measured after it.
On a terminal it is one line redrawn in place (carriage return), wiped before any other
line prints and redrawn by the next progress event; in a log it is a line every
:data:`LOG_PROGRESS_EVERY_S` seconds of the events' clock, from an attempt's second progress
event on.

One numbering for people: the console counts epochs from 1 everywhere (progress, epoch
ends, commits, restores), and so do the ``verify``/``ls`` tables and ``diff``'s text
(:func:`checkpoint_position`); the events' ``epoch`` and ``step_in_epoch`` fields, and every
``--json`` output, stay 0-based.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, TextIO

from resilient_train.rundir.events import EventReader, render_line
from resilient_train.supervisor.eta import SteadyRate, eta_seconds

__all__ = ["Console", "EventTail", "isatty", "render_event", "event_line", "hang_line", "progress_line", "checkpoint_position",
           "inexact_text", "CONSOLE", "SAID_BY_SUPERVISOR", "LOG_PROGRESS_EVERY_S"]

LOG_PROGRESS_EVERY_S = 10.0  # a log (not a terminal) gets one progress line per this many seconds


@dataclass
class Facts:
    """What a sentence needs beyond its own record; the tail keeps it up to date."""

    rejected: int = 0  # checkpoints rejected since the last restore decision
    lost_steps: int = 0  # steps the previous attempt reached beyond the one this restore starts from


def isatty(stream: TextIO) -> bool:
    """A terminal gets the progress line redrawn in place; a file or pipe gets periodic lines."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _s(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _position(record: Mapping[str, Any]) -> str:
    """``epoch 2, step 20``: the console counts epochs from 1 (events' ``epoch`` is 0-based)."""
    return f"epoch {record['epoch'] + 1}, step {record['step_in_epoch']}"


def checkpoint_position(record: Mapping[str, Any]) -> str:
    """Where a checkpoint is: ``epoch 2, step 20``, or ``end of epoch 1`` for a checkpoint at an
    epoch boundary (its ``epoch`` counts finished epochs, so "epoch 2, step 0" would read as
    if epoch 2 had begun). ``record``: the 0-based ``epoch`` and ``step_in_epoch`` of an event
    or manifest; ``verify``/``ls`` tables say it the same way."""
    if record["step_in_epoch"] == 0 and record["epoch"] > 0:
        return f"end of epoch {record['epoch']}"
    return _position(record)


def inexact_text(entries: Iterable[Mapping[str, Any]]) -> str:
    """Why a checkpoint's weights are not an uninterrupted run's, from its manifest's
    ``extra["inexact"]`` entries (checkpoint/manifest.py): ``epoch 2's input differed from
    the one recorded with ckpt-000000000010``, joined by ``; ``. The final console line,
    ``verify`` and the report say it in these words."""
    parts = []
    for entry in entries:
        if entry.get("cause") == "input_mismatch" and isinstance(entry.get("epoch"), int):
            parts.append(f"epoch {entry['epoch'] + 1}'s input differed from the one recorded with {entry.get('checkpoint')}")
        else:  # a cause this version does not know: its fields
            parts.append(", ".join(f"{k} {v}" for k, v in entry.items()))
    return "; ".join(parts)


def _metrics(values: Mapping[str, Any], prefix: str = "") -> str:
    return "  ".join(
        f"{prefix}{k} {v:.4f}" for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    )


def _validation_text(record: Mapping[str, Any]) -> str:
    """``  val_loss 0.2100  val_accuracy 0.9400`` when the epoch was evaluated, else ''."""
    loss = record.get("val_loss")
    if not isinstance(loss, (int, float)):
        return ""
    return "  " + "  ".join(filter(None, [f"val_loss {loss:.4f}", _metrics(record.get("val_metrics") or {}, "val_")]))


def hang_line(record: Mapping[str, Any]) -> str:
    """``rank 1 made no progress for 31 s at global step 24 (epoch 1, step 4); main thread in ...``

    From a ``hang_detected`` event's fields (the same words are the root cause's message);
    ``never_trained`` (rank -> address) adds ``; never reached training: rank 1 (host:port)``.
    """
    step = record.get("global_step")
    if step is None:
        at = "before its first step of the attempt"
    elif record.get("epoch") is not None and record.get("step_in_epoch") is not None:
        at = f"at global step {step} ({_position(record)})"
    else:
        at = f"at global step {step}"
    line = f"rank {record['rank']} made no progress for {record['seconds']:.0f} s {at}; {record['where']}"
    never = record.get("never_trained")
    if never:
        ranks = ", ".join(f"rank {rank}" + (f" ({address})" if address else "") for rank, address in never.items())
        line += f"; never reached training: {ranks}"
    return line


# ------------------------------------------------------------ sentences, one per shown event

def _run_started(r: Mapping[str, Any], _: Facts) -> str:
    workers = f"{r['min_workers']} to {r['workers']} workers" if r.get("min_workers") else _s(r["workers"], "worker")
    launcher = f" ({r['launcher']} launcher)" if r.get("launcher") else ""
    return f"training {r['recipe']} on {workers}{launcher}; run dir {r['run_dir']}, checkpoints in {r['storage']}"


def _job_changed(r: Mapping[str, Any], _: Facts) -> str:
    changes = ", ".join(f"{name} {c.get('was')} -> {c.get('now')}" for name, c in (r.get("changes") or {}).items())
    return f"the job changed since this run dir was last used ({changes}); going on: {r.get('accepted')}"


def _storage_claimed(r: Mapping[str, Any], _: Facts) -> str | None:
    if not r.get("forced"):
        return None  # the first claim of a storage: nothing happened that a person must know
    return (f"took over storage {r['storage']} from run {r.get('previous_run_id')} "
            f"({r.get('previous_run_dir')}) as --force-storage asked")


def _lost(facts: Facts) -> str:
    return f"; lost {_s(facts.lost_steps, 'step')} (they are trained again)" if facts.lost_steps else ""


def _fresh_start(r: Mapping[str, Any], facts: Facts) -> str:
    if facts.rejected:
        noun = "checkpoint was" if facts.rejected == 1 else "checkpoints were"
        return f"no restorable checkpoint: {facts.rejected} {noun} rejected (see above); starting from step 0" + _lost(facts)
    return "no checkpoint found: starting from step 0" + _lost(facts)


def _restored(r: Mapping[str, Any], facts: Facts) -> str:
    return f"restored global step {r['global_step']} ({checkpoint_position(r)}) from {r['checkpoint']}" + _lost(facts)


def _checkpoint_committed(r: Mapping[str, Any], _: Facts) -> str:
    return f"checkpoint committed at global step {r['global_step']} ({checkpoint_position(r)}) -> {r['path']}"


def _rescue_committed(r: Mapping[str, Any], _: Facts) -> str:
    return (f"rescue: rank {r['rank']} committed its in-memory snapshot of global step {r['global_step']} "
            f"(taken {r['snapshot_age_s']:g} s before, committed in {r['seconds']:g} s)")


def _rescue_skipped(r: Mapping[str, Any], _: Facts) -> str:
    return f"rescue: rank {r.get('rank')} committed nothing: {r['reason']}; the restart restores the last commit"


def _rescue_abandoned(r: Mapping[str, Any], _: Facts) -> str:
    return f"rescue: abandoned ({r['reason']}); the restart restores the last commit"


def _checkpoint_rejected(r: Mapping[str, Any], _: Facts) -> str:
    return f"checkpoint {r['path']} rejected: {r['reason']}"


def _checkpoint_failed(r: Mapping[str, Any], _: Facts) -> str:
    return f"saving global step {r.get('global_step')} failed in the background: {r.get('error')}"


def _epoch_finished(r: Mapping[str, Any], _: Facts) -> str:
    loss = r.get("loss")
    parts = [f"epoch {r['epoch'] + 1} finished"]
    if isinstance(loss, (int, float)):
        parts.append(f"loss {loss:.4f}")
    metrics = _metrics(r.get("metrics") or {})
    if metrics:
        parts.append(metrics)
    late = "  (reported after the restart)" if r.get("after_restore") else ""
    return "  ".join(parts) + _validation_text(r) + late


def _training_stopped(r: Mapping[str, Any], _: Facts) -> str:
    return (f"training stopped early after epoch {r['epoch'] + 1} at global step {r['global_step']}: "
            f"a recipe callback set {r.get('reason')}")


def _anomaly_detected(r: Mapping[str, Any], _: Facts) -> str:
    values = ", ".join(f"{name}={value}" for name, value in (r.get("values") or {}).items())
    then = {"stop": "the run stops; its state is not saved",
            "rollback": "its state is not saved; rolling back to the newest commit to replay it"}.get(
        str(r.get("action")), "training goes on (--on-anomaly ignore)")
    where = f"at global step {r['global_step']} (epoch {r['epoch']}, batch {r['step_in_epoch']} of the epoch)"
    if r.get("kind") == "replicas":
        ranks = ", ".join(str(rank) for rank in r.get("ranks") or ())
        return (f"the replicas' trainable weights differ {where}: {r['replicas']} replica(s) on rank(s) {ranks} "
                f"differ from the others (silent data corruption?); {then}")
    return f"non-finite loss or gradients {where} on {r['replicas']} replica(s): {values}; {then}"


def _straggler_detected(r: Mapping[str, Any], _: Facts) -> str:
    if r.get("evidence") == "stalled":  # slowed from outside: runner/health/stall_probe.py
        why = (f"its process could not run {100 * r['stalled']:.0f}% of the time against {100 * r['others_stalled']:.0f}% "
               f"on the other workers (a CPU quota, a noisy neighbour?): about {r['slower']}x slower per step "
               f"({r['busy_ms_per_step']} ms against {r['others_ms_per_step']} ms at their pace)")
    else:
        why = (f"busy {r['slower']}x as long per step as the other workers ({r['busy_ms_per_step']} ms against "
               f"{r['others_ms_per_step']} ms)")
    return (f"rank {r['rank']} ({r['host']}) is a straggler: {why} for {r['window_s']:g} s, "
            f"at global step {r['global_step']}; it costs the group {r['steps_per_s_lost']} steps/s "
            f"({r['steps_per_s']} instead of about {r['steps_per_s_without']}), about {r['time_lost_s']:g} s to the "
            f"end of the run; {_straggler_action(r)}")


def _straggler_action(r: Mapping[str, Any]) -> str:
    """What --straggler-policy decided (runner/health/stragglers.py decide_replace); an event written
    before the policy existed has no reason: warn."""
    if r.get("action") == "replace":
        return (f"replacing it: {r['reason']}: the workers save at one agreed step, then the group restarts without "
                "that process (off its node where the launcher can place it elsewhere)")
    return f"training goes on (warn: {r['reason']})" if r.get("reason") else "training goes on (warn)"


def _straggler_replaced(r: Mapping[str, Any], _: Facts) -> str:
    if r.get("moved") == "node_avoided":
        how = f"off node {', '.join(r.get('nodes') or [])}, which the {r.get('launcher')} launcher avoids from now on"
    else:
        how = (f"with a fresh process on the same host {r.get('host')}: the {r.get('launcher')} launcher cannot place it "
               "elsewhere, so whatever slowed the old process itself (a stop/continue cycle, a quota on it) is gone, "
               "a slow host is not")
    return f"rank {r['rank']} replaced after the agreed save of global step {r['global_step']}: it restarts {how}"


def _rolled_back(r: Mapping[str, Any], _: Facts) -> str:
    return f"rolled back to global step {r['global_step']}: replaying up to step {r['anomaly_step']}"


def _replay_verdict(r: Mapping[str, Any], _: Facts) -> str:
    if r.get("verdict") == "transient":
        hosts = r.get("hosts") or []
        where = f" on {', '.join(hosts)}" if hosts else ""
        return (f"replayed step {r['global_step']} without the anomaly: it was transient{where} (not the data or the "
                "model); training goes on")
    if r.get("action") == "skip":
        return (f"the anomaly came back at step {r['global_step']} when replayed: deterministic (the data or the "
                "model); that batch is skipped: rolling back to replay without it")
    return (f"the anomaly came back at step {r['global_step']} when replayed: deterministic (the data or the "
            "model); the run stops")


def _host_suspected(r: Mapping[str, Any], _: Facts) -> str:
    return (f"host {r['host']} had {r['transients']} transient anomalies (--max-transients-per-host "
            f"{r['limit']}): suspected faulty hardware; it is treated as a host with a preemption notice "
            f"(ranks {', '.join(str(k) for k in r['ranks'])}): the workers save and stop, and no worker of this run "
            "is placed there again where the launcher can avoid it (Ray, Slurm)")


def _batch_skipped(r: Mapping[str, Any], _: Facts) -> str:
    return (f"skipped the batch of global step {r['global_step']} (epoch {r['epoch']}, batch {r['step_in_epoch']} "
            "of the epoch): a deterministic anomaly (--deterministic-anomaly skip)")


def _model_exported(r: Mapping[str, Any], _: Facts) -> str:
    skipped = "".join(f"; no {name}: {why}" for name, why in (r.get("skipped") or {}).items())
    return f"model of global step {r['global_step']} exported to {r['path']}{skipped}"


def _model_export_failed(r: Mapping[str, Any], _: Facts) -> str:
    return f"could not export the model to {r['path']} (the run still completes): {r['error']}"


def _gang_restart(r: Mapping[str, Any], _: Facts) -> str:
    return f"restarting every worker as attempt {r['attempt']} in {r.get('backoff_s', 0):.1f} s: {r['reason']}"


def _preemption_requested(r: Mapping[str, Any], _: Facts) -> str:
    source = str(r.get("source", ""))
    who, _sep, what = source.partition(":")
    asked = {"supervisor": f"the run got {what}", "worker": f"worker {what} got a stop signal",
             "launcher": f"the {what} launcher asked to stop",
             "straggler": f"rank {what} is a straggler to replace (--straggler-policy replace)",
             "notice": (f"this host had a preemption notice ({what})" if what != "suspect-hardware" else
                        "this host is suspected of faulty hardware (repeated transient anomalies; resume the run "
                        "on other hardware)")}.get(who, f"stop requested ({source})")
    return f"{asked}: the workers save at one agreed step, then stop"


def _preempted(r: Mapping[str, Any], _: Facts) -> str:
    where = f" ({checkpoint_position(r)})" if r.get("epoch") is not None and r.get("step_in_epoch") is not None else ""
    return f"saved global step {r['global_step']}{where} and stopped"


def _notice_watch(r: Mapping[str, Any], _: Facts) -> str | None:
    if r.get("rank") != 0:  # every worker says it; the chief's line stands for the group
        return None
    return f"watching {r['provider']} preemption notices at {r.get('endpoint')} (--preemption-notice {r.get('setting')})"


def _notice(r: Mapping[str, Any], _: Facts) -> str:
    deadline = f", deadline {r['deadline']}" if r.get("deadline") else ""
    then = ("the workers save at one agreed step, then stop" if r.get("action") == "stop"
            else "the machine survives it: one agreed save, training goes on")
    return f"worker {r.get('rank')}: {r['provider']} preemption notice {r['kind']}{deadline}: {then}"


def _notice_saved(r: Mapping[str, Any], _: Facts) -> str:
    return f"worker {r.get('rank')}: saved global step {r['global_step']} {r['seconds']:.1f} s after its notice"


def _notice_error(r: Mapping[str, Any], _: Facts) -> str:
    return f"worker {r.get('rank')}: preemption notices ({r.get('provider')}, {r.get('feed')}) ignored: {r['error']}"


def _hang_detected(r: Mapping[str, Any], _: Facts) -> str:
    return f"hang: {hang_line(r)} (stacks: {r['stacks']})"


def _storage_retry(r: Mapping[str, Any], _: Facts) -> str:
    return (f"storage {r.get('op')} of {r.get('path')} failed ({r.get('error')}); "
            f"try {r.get('try_number')} again in {r.get('wait_s', 0):.1f} s")


def _ray_connected(r: Mapping[str, Any], _: Facts) -> str:
    return f"joined the Ray cluster at {r.get('address')} ({_s(r.get('nodes', 0), 'node')} alive)"


def _node_lost(r: Mapping[str, Any], _: Facts) -> str:
    return f"node {r.get('node_ip')} was lost with worker slot {r.get('slot')} (pid {r.get('pid')})"


def _world_size_changed(r: Mapping[str, Any], _: Facts) -> str | None:
    if "from" in r:
        return None  # the supervisor's resize: its own "Attempt n: a -> b workers (reason)" line says it
    return (f"the checkpoint was written by {_s(r['checkpoint_world_size'], 'worker')}, this attempt has "
            f"{r['world_size']}: {r.get('note')}")


def _stale_writer_fenced(r: Mapping[str, Any], _: Facts) -> str:
    return (f"refused to let a worker of a superseded attempt (generation {r.get('generation')}, now "
            f"{r.get('newer_generation')}) {r.get('op')} {r.get('path')}")


def _input_mismatch(r: Mapping[str, Any], _: Facts) -> str:
    then = "stopping (--strict-resume)" if r.get("strict") else "training on"
    return (f"epoch {r['epoch'] + 1}'s input differs from the one recorded with {r.get('checkpoint')}, so the "
            f"resumed run will not match an uninterrupted one; {then}")


def _worker_restarted(r: Mapping[str, Any], _: Facts) -> str:
    return (f"worker {r['rank']} ({r.get('previous_exit')}) was started again in place at {r.get('address')} "
            f"(pid {r.get('pid')})")


def _run_finished(r: Mapping[str, Any], _: Facts) -> str | None:
    restarts, preemptions, lost = (int(r.get(k) or 0) for k in ("restarts", "preemptions", "lost_steps"))
    if not (restarts or preemptions or lost):
        return None  # the supervisor's "Run completed: ..." line says the rest
    return f"{_s(restarts, 'restart')}, {_s(preemptions, 'preemption')}; lost {_s(lost, 'step')} in all"


def _chaos_fault_injected(r: Mapping[str, Any], _: Facts) -> str:
    target = f" on {r['target']}" if r.get("target") else ""
    return f"chaos harness: {r.get('op')}{target} (trigger: {r.get('trigger')})"


def _script_output(r: Mapping[str, Any], _: Facts) -> str:
    return str(r["text"])


Sentence = Callable[[Mapping[str, Any], Facts], "str | None"]

_PROGRESS = "train_progress"  # the progress display, not a line
# Printed as the script printed them: the text alone, no clock, an empty line too.
_AS_PRINTED = frozenset({"script_output"})

# The decision table: every event of docs/events.md (tests/supervisor/test_console.py keeps it
# complete). A function: its sentence on the default console. None: hidden there (why, after
# the name); ``--verbose`` shows every event as its key=value line.
CONSOLE: Mapping[str, Sentence | None] = {
    # run
    "run_started": _run_started,
    "run_state": None,  # each state transition; the sentences below say what happened
    "run_finished": _run_finished,  # restarts / preemptions / lost steps, when any
    "run_already_complete": None,  # the supervisor's "already completed ... nothing to do" line
    "attempt_reached": None,  # feeds the lost steps of the next restore's sentence
    "attempt_incomplete": None,  # the supervisor's "Attempt n: workers exited 0 but ..." line
    "job_changed": _job_changed,
    # workers
    "worker_started": None,  # repeated per rank and attempt; the run_started line says how many
    "worker_exited": None,  # exit 0 is normal; a failure is the root cause block the supervisor prints
    "worker_failed": None,  # ditto (and its peers' teardown is not news)
    "worker_preempted": None,  # preemption_requested / preempted say it once for the group
    "worker_restarted": _worker_restarted,
    "first_step": None,  # the progress display shows training has begun
    "startup_phases": None,  # a timing breakdown for the recovery benchmark
    "node_avoided": None,  # the RESIZING / restart line that follows names the notice and the node
    "workers_differ": None,  # only matters if a non-chief is asked to rescue: its rescue_skipped says why
    "server_started": None,  # parameter-server tier processes serving
    "server_stopped": None,
    "slurm_step_started": None,  # the launcher's srun step name and ports
    # training
    "fresh_start": _fresh_start,
    "restored": _restored,
    _PROGRESS: None,  # not a line: the progress display (EventTail)
    "epoch_finished": _epoch_finished,
    "training_stopped": _training_stopped,
    "anomaly_detected": _anomaly_detected,  # runner/health/
    "straggler_detected": _straggler_detected,  # runner/health/stragglers.py
    "straggler_replaced": _straggler_replaced,  # --straggler-policy replace: what the restart moves
    "rolled_back": _rolled_back,
    "replay_verdict": _replay_verdict,
    "host_suspected": _host_suspected,
    "batch_skipped": _batch_skipped,
    "training_completed": None,  # the supervisor's "Run completed: ..." line
    "input_torn_down": None,  # a finished epoch's input took long to tear down, off the training thread
    "input_teardown_waited": None,  # an epoch end waited for a retired input's teardown: a timing
    "iterator_state_sized": None,  # how the next restore re-enters the epoch (restored says)
    "input_digest": None,  # evidence for `resilient-train diff`, one hash per epoch
    "input_mismatch": _input_mismatch,
    "world_size_changed": _world_size_changed,
    "preemption_requested": _preemption_requested,  # once per attempt (EventTail)
    "preempted": _preempted,
    "preemption_notice_watch": _notice_watch,  # which cloud's notices are watched (absent: none found)
    "preemption_notice": _notice,
    "preemption_notice_saved": _notice_saved,
    "preemption_notice_error": _notice_error,  # a misbehaving metadata server, once per distinct error
    # checkpoints and storage
    "checkpoint_committed": _checkpoint_committed,
    "checkpoint_rejected": _checkpoint_rejected,
    "checkpoint_waited": None,  # an async save waited for the previous upload: a timing
    "checkpoint_failed": _checkpoint_failed,
    "checkpoint_fetched": None,  # where a restore read from: a timing
    "restore_read": None,  # how many bytes each worker read from the store, read once or not: evidence
    "sharded_save": None,  # what --sharded-save resolved to at setup: evidence, not news
    "checkpoint_share_uploaded": None,  # a worker's share of a sharded save; the commit line follows
    "checkpoint_share_replaced": None,  # the chief uploaded its copy of a share: a timing (the state is the chief's)
    "cache_rejected": None,  # a local copy failed verification; the restore reads the shared one
    "cache_write_failed": None,  # the host cache is an optimisation
    "garbage_collected": None,  # old checkpoints deleted as --keep says
    "storage_retry": _storage_retry,
    "storage_claimed": _storage_claimed,  # only a take-over (--force-storage)
    "generation_claimed": None,  # each attempt's fencing token
    "stale_writer_fenced": _stale_writer_fenced,
    # the memory tier (--snapshot-every)
    "memory_tier": None,  # each worker's interval and twin size at setup: evidence, not news
    "snapshot_interval_revised": None,  # auto followed the step time: evidence, not news
    "rescue_requested": None,  # the rescue's answer below says what happened
    "rescue_committed": _rescue_committed,
    "rescue_skipped": _rescue_skipped,
    "rescue_abandoned": _rescue_abandoned,
    # supervisor policy
    "gang_restart": _gang_restart,
    "restart_budget_exhausted": None,  # the supervisor's "Stopping: <reason>" line
    "crash_loop_detected": None,  # ditto
    "fatal_error": None,  # ditto
    "launch_failed": None,  # the supervisor's "Stopping: attempt n could not start" line
    "hang_detected": _hang_detected,
    # warm standby
    "standby_started": None,  # pre-imported spare processes: an optimisation
    "standby_ready": None,
    "standby_lost": None,
    "standby_disabled": None,
    "standby_template_started": None,  # the one process the standbys are forked from
    "standby_template_ready": None,
    "standby_template_lost": None,  # standbys are spawned from then on: still an optimisation
    # outputs
    "model_exported": _model_exported,
    "model_export_failed": _model_export_failed,
    # Ray launcher
    "ray_connected": _ray_connected,
    "placement_ready": None,  # bundle placement details
    "placement_lost": None,  # a slot died while starting; the launcher retries
    "node_lost": _node_lost,
    # chaos harness
    "chaos_fault_injected": _chaos_fault_injected,
    # the script
    "script_output": _script_output,  # a line the chief printed, as it printed it (_AS_PRINTED)
}


def render_event(record: Mapping[str, Any], *, rejected: int = 0, lost_steps: int = 0) -> str | None:
    """The default console's line for ``record`` (``HH:MM:SS  sentence``; a ``script_output``
    line as the script printed it), or None.

    ``rejected``: checkpoints rejected since the last restore decision, so a fresh start
    after rejecting every checkpoint does not read as "no checkpoint found"; ``lost_steps``:
    what the previous attempt trained beyond the step a restore starts from.
    An event the table does not know yet is shown as its key=value line.
    """
    event = str(record.get("event"))
    if event not in CONSOLE:
        return render_line(dict(record))
    sentence = CONSOLE[event]
    if sentence is None:
        return None
    try:
        text = sentence(record, Facts(rejected, lost_steps))
    except (KeyError, TypeError, ValueError, AttributeError):
        # A record without the fields its sentence needs (an older writer, a hand-made
        # event) must not stop the supervisor: show its fields as they are.
        return render_line(dict(record))
    if event in _AS_PRINTED:
        return text
    return f"{_clock(record)}  {text}" if text else None


# ------------------------------------------------------------ one event, read on its own

def _stopping(r: Mapping[str, Any], _: Facts) -> str:
    return f"Stopping: {r['reason']}"


def _launch_failed(r: Mapping[str, Any], _: Facts) -> str:
    return f"Stopping: attempt {r['attempt']} could not start: {r['reason']}"


def _attempt_incomplete(r: Mapping[str, Any], _: Facts) -> str:
    return f"Attempt {r['attempt']}: workers exited 0 but no completed checkpoint is in storage ({r['storage']})"


def _rescue_requested(r: Mapping[str, Any], _: Facts) -> str:
    dead = r.get("dead_ranks") or []
    why = (f"rank {r['stuck_rank']} is stuck" if r.get("stuck_rank") is not None
           else ", ".join(f"rank {rank}" for rank in dead) + (" died" if dead else ""))
    return (f"rescue: asked rank {r['rank']} to commit its in-memory snapshot ({why}); "
            f"waiting at most {r['deadline_s']:g} s")


def _placement_lost(r: Mapping[str, Any], _: Facts) -> str:
    then = "placing them again" if r.get("retry") else "giving up"
    return f"worker slots {r.get('slots')} died while the attempt started ({r.get('error')}); {then}"


# Events the default console hides because the supervisor prints its own line for them
# (supervisor.py: "Stopping: ...", "Attempt n: ...") or because the event after says what
# happened. Where an event is read on its own, without those lines (the report's timeline
# markers: commands/report_page.py), these are its words.
SAID_BY_SUPERVISOR: Mapping[str, Sentence] = {
    "restart_budget_exhausted": _stopping,
    "crash_loop_detected": _stopping,
    "fatal_error": _stopping,
    "launch_failed": _launch_failed,
    "attempt_incomplete": _attempt_incomplete,
    "rescue_requested": _rescue_requested,
    "placement_lost": _placement_lost,
}


def event_line(record: Mapping[str, Any]) -> str | None:
    """``HH:MM:SS  sentence`` for one event read on its own: the console's line
    (:func:`render_event`, 1-based epochs), or for an event the console leaves to the
    supervisor's own lines, :data:`SAID_BY_SUPERVISOR`'s; None when the console says nothing
    of it (a hidden timing, a worker's exit 0: the reader decides)."""
    sentence = SAID_BY_SUPERVISOR.get(str(record.get("event")))
    if sentence is None:
        return render_event(record)
    try:
        return f"{_clock(record)}  {sentence(record, Facts())}"
    except (KeyError, TypeError, ValueError, AttributeError):
        return render_line(dict(record))  # as render_event does for a record without its fields


# ------------------------------------------------------------ progress

def _clock(record: Mapping[str, Any]) -> str:
    return str(record.get("ts", ""))[11:19]


def _duration(seconds: float) -> str:
    """``45s``, ``4m10s``, ``2h05m``."""
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


_PROGRESS_FIELDS = frozenset({
    "event", "ts", "run_id", "level", "group", "role", "epoch", "step_in_epoch", "steps_per_epoch", "global_step",
    "steps_per_s", "steps_per_call", "epochs", "attempt", "rank",
})


def progress_line(record: Mapping[str, Any], *, epochs: int | None, steps_per_s: float | None,
                  eta: bool = True) -> str:
    """``06:55:29  step 1,220/8,000  15%  ETA 4m10s  epoch 2/5  loss 0.4100  27.1 steps/s``.

    The percentage counts the whole run by global step (a resumed run starts where it
    is); the ETA divides the steps left by ``steps_per_s``, and is left out while ``eta`` is
    false or the rate unknown (None: no steps/s either). Without the planned ``epochs``
    (a recipe whose DEFAULTS are computed, and an event without ``epochs``) it shows the
    global step and the epoch only.
    """
    step, per_epoch = record["global_step"], record["steps_per_epoch"]
    epoch = f"epoch {record['epoch'] + 1}"
    if epochs:
        total = epochs * per_epoch
        left = eta_seconds(global_step=step, total_steps=total, steps_per_s=steps_per_s) if eta else None
        head = "  ".join(filter(None, [f"step {step:,}/{total:,}", f"{min(100, 100 * step // total)}%",
                                       f"ETA {_duration(left)}" if left is not None else "", f"{epoch}/{epochs}"]))
    else:
        head = f"step {step:,}  {epoch}"
    metrics = _metrics({k: v for k, v in record.items() if k not in _PROGRESS_FIELDS})
    parts = [head, metrics, f"{steps_per_s:.1f} steps/s" if steps_per_s is not None else ""]
    return f"{_clock(record)}  " + "  ".join(p for p in parts if p)


def _event_time(record: Mapping[str, Any]) -> float | None:
    try:
        return _dt.datetime.fromisoformat(str(record.get("ts"))).timestamp()
    except ValueError:
        return None


class Writer(Protocol):
    """Where the console writes: a text stream, or one wrapped by rundir/redact.py's RedactingWriter."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class Console:
    """The supervisor's output stream: lines, and on a terminal one progress line redrawn in place.

    Every write (the tail's and the supervisor's own) goes through it, so the progress
    line is always wiped (carriage return, spaces, carriage return) before another line is
    printed; ``width`` (the terminal's columns) bounds it, as a wrapped line cannot be
    redrawn with a carriage return.
    """

    def __init__(self, out: Writer, *, tty: bool = False, width: int | None = None) -> None:
        self.out = out
        self.tty = tty
        self.width = width if width is not None else shutil.get_terminal_size().columns
        self._shown = 0  # characters of the progress line now on the terminal

    def write(self, text: str) -> int:
        self._wipe()
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    def progress(self, text: str) -> None:
        if not self.tty:
            self.out.write(text + "\n")
            return
        text = text[: max(self.width - 1, 1)]
        self.out.write("\r" + text.ljust(self._shown))
        self._shown = len(text)

    def _wipe(self) -> None:
        if self._shown:
            self.out.write("\r" + " " * self._shown + "\r")
            self._shown = 0


@dataclass
class _Run:
    """What the tail remembers between events."""

    rejected: int = 0
    reached: dict[int, int] = field(default_factory=dict)  # attempt -> highest global step (attempt_reached)
    stop_announced: bool = False  # preemption_requested shown for the current attempt
    rate: SteadyRate = field(default_factory=SteadyRate)  # the attempt's steady steps/s (the ETA's)
    progress_events: int = 0  # train_progress events of this attempt
    logged_progress_at: float | None = None  # a log's last progress line (the event's clock)


class EventTail:
    """Follows events.jsonl from its current end and shows each new event.

    Default: :data:`CONSOLE`'s sentences and the progress display; ``verbose``: every event
    as its key=value line. ``epochs`` (the planned number, when known) gives the progress
    its total and ETA where the event does not say it.
    """

    def __init__(self, path: Path, out: TextIO | Console, *, start_at_end: bool = True, verbose: bool = False,
                 epochs: int | None = None) -> None:
        self.reader = EventReader(path, start_at_end=start_at_end)
        self.console = out if isinstance(out, Console) else Console(out)
        self.verbose = verbose
        self.epochs = epochs
        self._run = _Run()

    @property
    def out(self) -> Writer:
        return self.console.out

    def pump(self) -> list[dict[str, Any]]:
        """Show and return the records appended since the last call."""
        new = self.reader.read_new()
        for record in new:
            self._show(record)
        if new:
            self.console.flush()
        return new

    def _show(self, record: dict[str, Any]) -> None:
        if self.verbose:
            self.console.write(render_line(record) + "\n")
            return
        event, run = record.get("event"), self._run
        if event == _PROGRESS:
            self._progress(record)
            return
        lost = 0
        if event in ("restored", "fresh_start") and isinstance(record.get("attempt"), int):
            reached = run.reached.get(record["attempt"] - 1)
            lost = max(0, reached - record["global_step"]) if reached is not None else 0
        text = None
        if not (event == "preemption_requested" and run.stop_announced):
            text = render_event(record, rejected=run.rejected, lost_steps=lost)
        self._remember(record)
        if text is not None:  # "" is a script's empty line (render_event returns None for nothing)
            self.console.write(text + "\n")

    def _remember(self, record: dict[str, Any]) -> None:
        event, run = record.get("event"), self._run
        if event == "checkpoint_rejected":
            run.rejected += 1
        elif event in ("fresh_start", "restored"):
            run.rejected = 0
            run.stop_announced = False
            run.rate.restart()  # a new attempt: the rate starts over
            run.progress_events = 0
            run.logged_progress_at = None
        elif event == "attempt_reached" and isinstance(record.get("attempt"), int):
            run.reached[record["attempt"]] = record["global_step"]
        elif event == "preemption_requested":
            run.stop_announced = True
        elif event == "first_step" and isinstance(record.get("global_step"), int):
            at = _event_time(record)
            if at is not None:  # the attempt's first call finished: the steady rate is measured from here
                run.rate.started(record.get("attempt"), record["global_step"], at)

    def _progress(self, record: dict[str, Any]) -> None:
        """The progress display. Its steps/s and ETA are the attempt's steady rate (SteadyRate);
        before it is known, the event's own rate, except the attempt's first event's (its window
        held the first call's tracing), and no ETA; a log's first progress line waits for the
        attempt's second event."""
        run = self._run
        run.progress_events += 1
        now = _event_time(record)
        if now is not None and isinstance(record.get("global_step"), int):
            run.rate.progress(record.get("attempt"), record["global_step"], now)
        steady = run.rate.steps_per_s
        shown = steady
        if steady is None and run.progress_events >= 2 and isinstance(record.get("steps_per_s"), (int, float)):
            shown = float(record["steps_per_s"])
        epochs = record.get("epochs") if isinstance(record.get("epochs"), int) else self.epochs
        try:
            text = progress_line(record, epochs=epochs, steps_per_s=shown, eta=steady is not None)
        except (KeyError, TypeError, ValueError):  # a malformed record: its fields, as render_event does
            self.console.write(render_line(record) + "\n")
            return
        if not self.console.tty:
            if run.progress_events < 2 or (run.logged_progress_at is not None and now is not None
                                           and now - run.logged_progress_at < LOG_PROGRESS_EVERY_S):
                return
            run.logged_progress_at = now
        self.console.progress(text)
