"""An epoch's results (loss, metrics, evaluation) reported exactly once, whatever a kill's timing.

What ``epoch_finished`` carries is a result of the run, like the weights: a kill at an
epoch end must neither drop it nor report it twice. Two rules keep it exactly once:

* The epoch-end checkpoint carries the epoch's numbers in its manifest's ``extra``
  (``epoch_results``: loss and metric means, and the evaluation when it ran before the
  save, as it does with callbacks), and the chief reports ``epoch_finished`` only once that
  checkpoint is committed. So a reported epoch is never trained again: no restore can land
  before its end (runner/training/epoch_end.py ``EpochEnd.finish``).
* A restore that lands exactly at an epoch end (``step_in_epoch`` 0) whose
  ``epoch_finished`` is not in this run's events.jsonl reports it then, from the manifest's
  numbers, evaluating first when the evaluation had not finished before the kill
  (deterministic: the same numbers, runner/outputs/evaluation.py). Its event says
  ``after_restore: true``; the numbers are those an uninterrupted run reports. Only the
  chief reads the event log (it alone writes group events there); every worker follows its
  answer, since the evaluation is collective.

Between two attempts no worker of the old one is alive (gang restart), so what the chief
reads is final for every earlier attempt. Listeners (the chief's TensorBoard writer) get
the late event like any other, after the ``restored`` event that starts their attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_train.rundir.events import read_events

__all__ = ["EpochResults", "EXTRA_KEY", "already_reported"]

EXTRA_KEY = "epoch_results"  # the manifest extra's key (the epoch-end checkpoint's only)


@dataclass(frozen=True)
class EpochResults:
    """The numbers ``epoch_finished`` reports for epoch ``epoch`` (0-based), ending at ``global_step``."""

    epoch: int
    global_step: int
    loss: float | None
    metrics: dict[str, float] = field(default_factory=dict, hash=False)
    # The evaluation's event fields (val_loss, val_metrics, val_examples); None: not run before the save.
    validation: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        for name in ("epoch", "global_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Received {name}={value!r}; expected an int >= 0")

    def event_fields(self, validation: dict[str, Any] | None = None) -> dict[str, Any]:
        """``epoch_finished``'s fields (docs/events.md), with ``validation`` when given, else the carried one."""
        return {"epoch": self.epoch, "global_step": self.global_step, "loss": self.loss, "metrics": dict(self.metrics),
                **(validation if validation is not None else self.validation or {})}

    def to_extra(self) -> dict[str, Any]:
        """For the manifest's ``extra`` (JSON: a float's repr reads back to the same float)."""
        return {EXTRA_KEY: {"epoch": self.epoch, "global_step": self.global_step, "loss": self.loss,
                            "metrics": dict(self.metrics), "validation": self.validation}}

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "EpochResults | None":
        """The carried results, or None (not an epoch-end checkpoint, or one written before they were carried)."""
        carried = extra.get(EXTRA_KEY)
        if not isinstance(carried, dict):
            return None
        return cls(epoch=int(carried["epoch"]), global_step=int(carried["global_step"]), loss=carried.get("loss"),
                   metrics=dict(carried.get("metrics") or {}), validation=carried.get("validation"))


def already_reported(events_path: Path, *, run_id: str, epoch: int, global_step: int) -> bool:
    """Whether this run's events.jsonl holds ``epoch_finished`` of ``epoch`` at ``global_step``."""
    return any(record.get("event") == "epoch_finished" and record.get("run_id") == run_id
               and record.get("epoch") == epoch and record.get("global_step") == global_step
               for record in read_events(events_path))
