"""The chief's TensorBoard log: scalars from the event stream, written with ``tf.summary``.

The chief installs :class:`TensorBoardLog` as an event listener (``events.add_listener``),
so the training loop has no TensorBoard code: every scalar comes from an event the run
emits anyway, at that event's ``global_step``.

=====================  ============================  ===================================
event                  scalars                       step
=====================  ============================  ===================================
train_progress         train/loss, train/<metric>    global_step (running epoch means)
                       perf/steps_per_s
epoch_finished         epoch/loss, epoch/<metric>,   global_step at the epoch end
                       eval/loss, eval/<metric>
checkpoint_committed   checkpoint/commit_s,          the committed global_step
                       checkpoint/blocked_ms (async)
checkpoint_waited      checkpoint/waited_ms          the step whose save waited
restored, fresh_start  run/restarts                  the step training resumes from
=====================  ============================  ===================================

Kill and resume: a killed chief's file may hold steps past the checkpoint the next
attempt restores (global step R). Before the new attempt writes anything (on
``restored`` / ``fresh_start``), every event file already in the directory is rewritten
without the scalars of steps > R (a torn last record from the kill is dropped too), so
the concatenated files, read in name order, give each tag strictly increasing steps with
no duplicates: what TensorBoard would otherwise only approximate with its
out-of-order purge. The steps <= R are exactly what the resumed run would have
written (exact resume), so they are kept.

Files sort by the creation second in their names; a new attempt's file is created in a
later second than every file it follows, so name order is write order.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.lib.io import _pywrap_record_io  # private: the reader without tf.data's per-record cost

__all__ = ["TensorBoardLog", "truncate_event_files", "read_scalars"]

_FILE_PATTERN = "events.out.tfevents.*"
_RESTARTS = "run/restarts"
_FILE_TIME = re.compile(r"events\.out\.tfevents\.(\d+)\.")


def _event_files(log_dir: Path) -> list[Path]:
    return sorted(p for p in Path(log_dir).glob(_FILE_PATTERN) if p.is_file())


def _records(path: Path) -> list[bytes]:
    """Every complete record of a TFRecord file; a torn tail (killed writer) ends the list.

    TensorFlow's C++ record reader (what ``tf.compat.v1.io.tf_record_iterator`` returns,
    without its deprecation warning): CRCs checked, no eager op per record. A
    ``tf.data.TFRecordDataset`` read took 0.09-0.2 s of every restart's restore phase on the
    chief for a few thousand records; this reads them in about a millisecond."""
    records = []
    try:
        for record in _pywrap_record_io.RecordIterator(str(path), ""):
            records.append(record)
    except tf.errors.DataLossError:
        pass
    return records


def truncate_event_files(log_dir: Path, last_step: int) -> int:
    """Drop every summary with step > ``last_step`` from the files in ``log_dir``; count dropped."""
    dropped = 0
    for path in _event_files(log_dir):
        records = _records(path)
        kept = [r for r in records if not _summary_after(r, last_step)]
        torn = path.stat().st_size != _framed_size(records)
        if len(kept) == len(records) and not torn:
            continue
        dropped += len(records) - len(kept)
        tmp = path.with_name(path.name + ".rewrite")
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for record in kept:
                writer.write(record)
        os.replace(tmp, path)
    return dropped


def _framed_size(records: list[bytes]) -> int:
    return sum(len(r) + 16 for r in records)  # TFRecord: length (8) + 2 CRCs (4 + 4) per record


def _summary_after(record: bytes, last_step: int) -> bool:
    """A summary past ``last_step``; for run/restarts also AT it (the new attempt writes its own)."""
    event = tf.compat.v1.Event.FromString(record)
    if not event.HasField("summary"):
        return False
    if any(value.tag == _RESTARTS for value in event.summary.value):
        return event.step >= last_step
    return event.step > last_step


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] over every event file in name order (tests and tools)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in _event_files(log_dir):
        for record in _records(path):
            event = tf.compat.v1.Event.FromString(record)
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                scalars.setdefault(value.tag, []).append((event.step, float(number)))
    return scalars


class TensorBoardLog:
    """An events listener that turns the chief's events into TensorBoard scalars."""

    def __init__(self, log_dir: Path, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.log_dir = Path(log_dir)
        self._clock = clock
        self._sleep = sleep
        self._writer: Any = None
        self._lock = threading.Lock()  # events also arrive from the checkpoint persist thread

    def __call__(self, record: dict[str, Any]) -> None:
        handler = getattr(self, f"_on_{record.get('event')}", None)
        if handler is None:
            return
        with self._lock:
            handler(record)

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # ------------------------------------------------------------ handlers
    def _on_fresh_start(self, record: dict[str, Any]) -> None:
        self._start_attempt(0, record)

    def _on_restored(self, record: dict[str, Any]) -> None:
        self._start_attempt(int(record["global_step"]), record)

    def _on_train_progress(self, r: dict[str, Any]) -> None:
        skip = {"event", "ts", "epoch", "step_in_epoch", "steps_per_epoch", "epochs", "global_step", "steps_per_s",
                "steps_per_call", "attempt", "rank", "role", "run_id", "level"}
        values = {f"train/{k}": v for k, v in r.items() if k not in skip and _is_number(v)}
        values["perf/steps_per_s"] = r.get("steps_per_s")
        values["perf/steps_per_call"] = r.get("steps_per_call")
        self._write(r["global_step"], values)

    def _on_epoch_finished(self, r: dict[str, Any]) -> None:
        values = {"epoch/loss": r.get("loss"), "eval/loss": r.get("val_loss")}
        values.update({f"epoch/{k}": v for k, v in (r.get("metrics") or {}).items()})
        values.update({f"eval/{k}": v for k, v in (r.get("val_metrics") or {}).items()})
        self._write(r["global_step"], values)

    def _on_checkpoint_committed(self, r: dict[str, Any]) -> None:
        self._write(r["global_step"], {"checkpoint/commit_s": r.get("commit_s"),
                                       "checkpoint/blocked_ms": r.get("blocked_ms")})

    def _on_checkpoint_waited(self, r: dict[str, Any]) -> None:
        self._write(r["global_step"], {"checkpoint/waited_ms": r.get("waited_ms")})

    # ------------------------------------------------------------ writing
    def _start_attempt(self, step: int, record: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        truncate_event_files(self.log_dir, step)
        attempt = record.get("attempt")
        if isinstance(attempt, int):
            self._write(step, {_RESTARTS: attempt - 1})

    def _open(self) -> Any:
        if self._writer is None:
            self._wait_for_a_new_second()
            self._writer = tf.summary.create_file_writer(str(self.log_dir))
        return self._writer

    def _wait_for_a_new_second(self) -> None:
        """Name order must be write order: start after the newest existing file's second."""
        seconds = [int(m.group(1)) for p in _event_files(self.log_dir) if (m := _FILE_TIME.match(p.name))]
        newest = max(seconds, default=-1)
        while int(self._clock()) <= newest:
            self._sleep(0.05)

    def _write(self, step: int, values: dict[str, Any]) -> None:
        """Write and flush at once: a SIGKILL may come any time, and every step <= the
        next committed checkpoint must already be on disk (scalars come once a second
        at most, so the flushes are cheap)."""
        values = {tag: value for tag, value in values.items() if _is_number(value)}
        if not values:
            return
        writer = self._open()
        with writer.as_default():
            for tag, value in values.items():
                tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step), metadata=_scalar_metadata())
        writer.flush()


def _scalar_metadata() -> Any:
    """What ``tf.summary.scalar`` attaches, built without the tensorboard package.

    ``tf.summary.scalar`` lives in the tensorboard package (not a TensorFlow dependency);
    ``tf.summary.write`` with the scalars plugin's metadata writes the same record, so
    training needs no extra install and ``tensorboard --logdir`` shows the curves.
    """
    return tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars", content=b""),
        data_class=1,  # DATA_CLASS_SCALAR
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
