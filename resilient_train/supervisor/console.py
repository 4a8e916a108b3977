"""The human view of a run: one line per interesting event, read from events.jsonl.

The supervisor does not print its own prose: it tails the same event stream other tools
read, so what a person sees and what ``events.jsonl`` records cannot drift apart.

One numbering for people: the console counts epochs from 1 everywhere (progress, epoch
ends, commits, restores); the events' ``epoch`` and ``step_in_epoch`` fields stay 0-based.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from resilient_train.rundir.events import EventReader, render_line

__all__ = ["EventTail", "render_event"]


def _metrics(record: dict[str, Any], skip: set[str]) -> str:
    parts = []
    for key, value in record.items():
        if key in skip or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(parts)


def _validation_text(record: dict[str, Any]) -> str:
    """``  val_loss 0.2100  val_accuracy 0.9400`` when the epoch was evaluated, else ''."""
    loss = record.get("val_loss")
    if not isinstance(loss, (int, float)):
        return ""
    parts = [f"val_loss {loss:.4f}"]
    parts += [f"val_{k} {v:.4f}" for k, v in (record.get("val_metrics") or {}).items()]
    return "  " + "  ".join(parts)


def _position(record: dict[str, Any]) -> str:
    """``epoch 2, step 20``: the console counts epochs from 1 (events' ``epoch`` is 0-based)."""
    return f"epoch {record['epoch'] + 1}, step {record['step_in_epoch']}"


# Recorded for tools, not worth a line for people: ``worker_started`` repeats what the
# attempt's other lines say, ``run_state`` (supervisor/state.py) narrates every transition,
# ``input_digest`` is evidence for ``resilient-train diff``, one hash per epoch.
_HIDDEN = frozenset({"worker_started", "run_state", "input_digest"})

_PROGRESS_KEYS = {
    "epoch", "step_in_epoch", "steps_per_epoch", "global_step", "steps_per_s", "steps_per_call", "attempt", "rank",
}


def hang_line(record: dict[str, Any]) -> str:
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


def render_event(record: dict[str, Any], *, rejected: int = 0) -> str | None:
    """A readable line for ``record``, or None for events not worth a line.

    ``rejected``: checkpoints rejected since the last restore decision, so a fresh start
    after rejecting every checkpoint does not read as "no checkpoint found".
    """
    event = record.get("event")
    ts = str(record.get("ts", ""))[11:19]
    r = record
    if event == "train_progress":
        return (
            f"{ts}  epoch {r['epoch'] + 1}  step {r['step_in_epoch']:>4}/{r['steps_per_epoch']}"
            f"  (global {r['global_step']})  {_metrics(r, _PROGRESS_KEYS | {'ts'})}"
            f"  {r.get('steps_per_s', 0):.1f} steps/s"
        )
    if event == "epoch_finished":
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in (r.get("metrics") or {}).items())
        loss = r.get("loss")
        loss_text = f"loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
        line = f"{ts}  epoch {r['epoch'] + 1} finished  {loss_text}  {metrics}".rstrip()
        return line + _validation_text(r)
    if event == "checkpoint_committed":
        return (
            f"{ts}  checkpoint committed at global step {r['global_step']} "
            f"({_position(r)}) -> {r['path']}"
        )
    if event == "restored":
        return (
            f"{ts}  restored global step {r['global_step']} ({_position(r)}) from {r['checkpoint']}"
        )
    if event == "hang_detected":
        return f"{ts}  hang: {hang_line(r)} (stacks: {r['stacks']})"
    if event == "fresh_start" and rejected:
        noun = "checkpoint was" if rejected == 1 else "checkpoints were"
        return f"{ts}  no restorable checkpoint: {rejected} {noun} rejected (see above); starting from step 0"
    if event == "fresh_start":
        return f"{ts}  no checkpoint found: starting from step 0"
    if event in _HIDDEN:
        return None
    return render_line(record)


class EventTail:
    """Follows events.jsonl from its current end and prints each new event's line."""

    def __init__(self, path: Path, out: TextIO, *, start_at_end: bool = True) -> None:
        self.reader = EventReader(path, start_at_end=start_at_end)
        self.out = out
        self._rejected = 0

    def _count_rejections(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "checkpoint_rejected":
            self._rejected += 1
        elif event in ("fresh_start", "restored"):
            self._rejected = 0

    def pump(self) -> list[dict[str, Any]]:
        """Print and return the records appended since the last call."""
        new = self.reader.read_new()
        for record in new:
            text = render_event(record, rejected=self._rejected)
            self._count_rejections(record)
            if text:
                self.out.write(text + "\n")
        if new:
            self.out.flush()
        return new
