"""Structured events: the structlog setup and the event vocabulary.

Every process of a run (the supervisor and each worker) logs through structlog. Events
carry the context bound once per process (``run_id``, ``attempt``, ``rank``, ``role``)
and are rendered twice:

* as one JSON object per line appended to ``<run_dir>/events.jsonl`` (the contract other
  tools read), when the process is allowed to write group events there, and
* as a short human line on the process's console (the supervisor's terminal, or a
  worker's log file).

Both renderings, and every listener, get the record after :func:`~resilient_train.rundir.redact.redact`
(credentials by key, URL user info and registered secrets as ``***``): the sink is the one
choke point every event passes, so no event can carry a credential to a file or a screen.

Several processes append to the same ``events.jsonl``. Each line is written with a single
``write(2)`` on a file opened with ``O_APPEND`` while holding an exclusive ``flock``, so
lines never interleave.

Vocabulary (``event`` field, stable snake_case names; docs/events.md):

* run: run_started, run_finished, run_already_complete, attempt_reached, job_changed,
  run_state (supervisor state transitions; kept out of the console's human view)
* workers: worker_started, worker_exited, worker_failed, worker_preempted, first_step,
  startup_phases (where the start-up went; runner/process/startup_phases.py)
* training: fresh_start, restored, train_progress, epoch_finished, training_completed,
  world_size_changed, input_mismatch, preemption_requested, preempted
* preemption notices: preemption_notice_watch, preemption_notice, preemption_notice_saved,
  preemption_notice_error (runner/process/preemption_notices.py)
* checkpoints: checkpoint_committed, checkpoint_rejected, checkpoint_waited,
  checkpoint_failed, checkpoint_fetched, cache_rejected, cache_write_failed,
  garbage_collected, storage_retry, storage_claimed, generation_claimed, stale_writer_fenced
* supervisor policy: gang_restart, restart_budget_exhausted, crash_loop_detected, fatal_error,
  launch_failed, hang_detected (the progress watchdog, supervisor/watchdog.py)
* warm standby: standby_started, standby_ready, standby_lost, standby_disabled
  standby_template_started, standby_template_ready, standby_template_lost
* outputs: model_exported, model_export_failed
* Ray launcher: ray_connected, placement_ready, placement_lost, node_lost
* script: script_output (a line the chief printed; runner/outputs/script_output.py)
* also: attempt_incomplete (every worker exited 0 without a completed checkpoint)
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, MutableMapping, TextIO

import structlog

from resilient_train.rundir.redact import redact

__all__ = [
    "configure", "emit", "bind", "add_listener", "EventFile", "EventReader", "read_events", "render_line",
]

EmitFn = Callable[..., None]
Listener = Callable[[dict[str, Any]], None]


class EventFile:
    """Appends JSON lines to one file; safe across processes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=False, default=_json_default) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask decides (rundir/permissions.py)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
        finally:
            os.close(fd)  # closing releases the lock


def _parse(line: bytes | str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "event" in record else None


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event of ``path`` in file order; a torn (unfinished) last line is skipped."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [record for record in map(_parse, lines) if record is not None]


class EventReader:
    """Follows an events.jsonl that other processes append to, from a byte offset.

    ``read_new()`` returns only complete lines appended since the last call; an
    unfinished last line waits for its newline.
    """

    def __init__(self, path: Path, *, start_at_end: bool = False) -> None:
        self.path = Path(path)
        self._offset = self.path.stat().st_size if start_at_end and self.path.exists() else 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [record for record in map(_parse, lines) if record is not None]


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def render_line(record: dict[str, Any]) -> str:
    """One readable line for an event record (used for consoles and worker logs)."""
    skip = {"event", "ts", "run_id", "level", "group", "role"}
    fields = " ".join(
        f"{k}={_short(v)}" for k, v in record.items() if k not in skip and v is not None
    )
    ts = str(record.get("ts", ""))[11:19]
    return f"{ts} {record.get('event', '?'):<22} {fields}".rstrip()


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Sink:
    """The final structlog processor: writes the event where it belongs."""

    def __init__(
        self, event_file: EventFile | None, console: TextIO | None, writes_group_events: bool
    ) -> None:
        self.event_file = event_file
        self.console = console
        self.writes_group_events = writes_group_events
        self.listeners: list[Listener] = []

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        group = event_dict.pop("group", False)
        echo = event_dict.pop("echo", True)
        record = redact({"event": event_dict.pop("event"), "ts": _now(), **event_dict})
        if self.event_file is not None and (self.writes_group_events or not group):
            self.event_file.append(record)
        if self.console is not None and echo:
            self.console.write(render_line(record) + "\n")
            self.console.flush()
        for listener in list(self.listeners):
            try:
                listener(record)
            except Exception as exc:  # an observer (TensorBoard) must never stop training
                if self.console is not None:
                    self.console.write(f"event listener {listener!r} failed: {type(exc).__name__}: {exc}\n")
        raise structlog.DropEvent


_sink = _Sink(None, sys.stderr, writes_group_events=True)


def configure(
    events_path: Path | None,
    *,
    console: TextIO | None = sys.stderr,
    writes_group_events: bool = True,
    **context: Any,
) -> None:
    """Route this process's events; bind ``context`` (run_id, attempt, rank, role).

    ``writes_group_events`` is true for the supervisor and the chief: events emitted with
    ``group=True`` reach events.jsonl only from such a process, so each group event appears
    once. Every other event reaches the file from any process, carrying its rank.
    """
    global _sink
    _sink = _Sink(EventFile(events_path) if events_path else None, console, writes_group_events)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _sink],
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**{k: v for k, v in context.items() if v is not None})


def add_listener(listener: Listener) -> None:
    """Call ``listener(record)`` with every event this process emits from now on.

    The hook lets an observer (the chief's TensorBoard writer) follow the run without
    code in the training loop. Listeners run on the emitting thread (the checkpoint
    persist thread too), must be thread-safe, and their exceptions are reported on the
    console, never raised. ``configure`` removes them.
    """
    _sink.listeners.append(listener)


def bind(**context: Any) -> None:
    structlog.contextvars.bind_contextvars(**context)


def emit(event: str, *, group: bool = False, echo: bool = True, **fields: Any) -> None:
    """Log one event.

    ``group=True`` marks an event that describes the whole worker group
    (restored, checkpoint_committed, ...): every worker may call it, only the chief's
    reaches events.jsonl. All events also go to the process's console/log, except with
    ``echo=False``: an event whose content that console has already (``script_output``, a
    line the process printed there itself).
    """
    structlog.get_logger().info(event, group=group, echo=echo, **fields)
