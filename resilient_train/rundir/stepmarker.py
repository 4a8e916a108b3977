"""Step and phase markers: what each worker last finished, and what it is doing now.

The chief and every worker rewrite ``<attempt_dir>/step-<rank>.txt`` in place after each
step (one ``pwrite``, no fsync: it must survive a process kill, not a host crash). Whoever
counts lost steps (the supervisor, the chaos checker) reads them after the attempt ended,
even if the supervisor itself was SIGKILLed in between. The supervisor's progress
watchdog (supervisor/watchdog.py) reads them while the attempt runs.

What an attempt *reached* (:func:`reached_step`, the one definition behind ``attempt_reached``,
``summary.json`` ``lost_steps``, the console's "lost N steps" and the chaos checker) is the
highest global step any of its workers finished. The step marker is written after each
compiled call, so it lags a call that fails part-way (a peer killed mid-call: the survivors'
collective breaks); the steps finished inside that call are in the worker's error file,
whose ``global_step`` is read from the step counter that advances step by step inside the
call (runner/training/loop.py ``train_call``), the same number the root cause reports. Both count.

Beside it, ``phase-<rank>.txt`` says which phase the worker is in, rewritten only when the
phase changes (a few writes per epoch): ``train <epoch> <epoch_start_step>`` while it
trains (the global step at which that epoch began, so a reader can tell the step within
the epoch from a step marker), ``eval``/``flush``/``finish`` while it is in a phase that
may legitimately take long without finishing a step (epoch-end evaluation, a blocking
checkpoint save, the final save and export). No file yet means the worker is starting up
(strategy, restore, first trace). The watchdog gives those phases the start-up allowance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from resilient_train.rundir.errorfile import read_errors
from resilient_train.rundir.layout import AttemptDir

__all__ = ["StepMarker", "PhaseMarker", "Phase", "highest_step", "reached_step", "read_step", "read_phase",
           "PHASE_STARTUP", "PHASE_TRAIN", "PHASE_INPUT", "PHASE_EVAL", "PHASE_FLUSH", "PHASE_FINISH", "PHASES"]

PHASE_STARTUP = "startup"  # never written: the absence of a phase marker
PHASE_TRAIN = "train"
PHASE_INPUT = "input"  # building an epoch's input pipeline (a re-entry may replay the epoch)
PHASE_EVAL = "eval"
PHASE_FLUSH = "flush"
PHASE_FINISH = "finish"
PHASES = (PHASE_STARTUP, PHASE_TRAIN, PHASE_INPUT, PHASE_EVAL, PHASE_FLUSH, PHASE_FINISH)
_WIDTH = 64  # every record is padded to this many bytes, so a rewrite fully covers the last


class StepMarker:
    """Writer side: the last finished global step, rewritten in place each step."""

    def __init__(self, path: Path | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666) if path else None  # umask decides

    def write(self, global_step: int) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, f"{global_step:<20}\n".encode(), 0)


@dataclass(frozen=True)
class Phase:
    """One phase marker's content; ``epoch``/``epoch_start_step`` are the last epoch entered."""

    name: str
    epoch: int | None = None
    epoch_start_step: int | None = None

    def __post_init__(self) -> None:
        if self.name not in PHASES:
            raise ValueError(f"Received phase {self.name!r}; expected one of {list(PHASES)}")

    def step_in_epoch(self, global_step: int | None) -> int | None:
        if global_step is None or self.epoch_start_step is None:
            return None
        return global_step - self.epoch_start_step


class PhaseMarker:
    """Writer side: the worker's phase, rewritten in place when it changes."""

    def __init__(self, path: Path | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if path else None
        self.current = Phase(PHASE_STARTUP)

    def enter(self, name: str, *, epoch: int | None = None, epoch_start_step: int | None = None) -> Phase:
        """Record phase ``name`` (keeping the last epoch unless given); returns the previous phase."""
        previous = self.current
        if epoch is None:
            epoch, epoch_start_step = previous.epoch, previous.epoch_start_step
        self.current = Phase(name, epoch, epoch_start_step)
        if self._fd is not None:
            fields = [name] + ([str(epoch), str(epoch_start_step)] if epoch is not None else [])
            os.pwrite(self._fd, f"{' '.join(fields):<{_WIDTH - 1}}\n".encode(), 0)
        return previous

    def restore(self, phase: Phase) -> None:
        self.enter(phase.name, epoch=phase.epoch, epoch_start_step=phase.epoch_start_step)


def read_step(path: str | os.PathLike[str]) -> int | None:
    """A step marker's step; None when it is missing or not written yet."""
    try:
        text = _read_record(path).strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def read_phase(path: str | os.PathLike[str]) -> Phase:
    """A phase marker's phase; ``startup`` when there is none (or it cannot be read)."""
    try:
        fields = _read_record(path).split()
        if not fields:
            return Phase(PHASE_STARTUP)
        if len(fields) == 3:
            return Phase(fields[0], int(fields[1]), int(fields[2]))
        return Phase(fields[0])
    except (OSError, ValueError):
        return Phase(PHASE_STARTUP)


def _read_record(path: str | os.PathLike[str]) -> str:
    """One marker's record: a single raw read. The supervisor's watchdog reads two markers
    per rank every 0.25 s (256 ranks: 2,048 reads a second), so no text-file object per read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4 * _WIDTH).decode()
    finally:
        os.close(fd)


def highest_step(attempt_dir: Path) -> int | None:
    """The highest global step any worker of the attempt finished; None without markers."""
    steps = []
    for path in AttemptDir.at(attempt_dir).step_markers():
        try:
            steps.append(int(path.read_text().strip() or "0"))
        except (OSError, ValueError):
            continue
    return max(steps) if steps else None


def reached_step(attempt_dir: Path) -> int | None:
    """The highest global step any worker of the attempt finished: its step marker, or the
    ``global_step`` of its error file when it failed inside a call (module docstring).
    None when the attempt left neither."""
    steps = [error.global_step for error in read_errors(attempt_dir) if error.global_step is not None]
    marker = highest_step(attempt_dir)
    if marker is not None:
        steps.append(marker)
    return max(steps) if steps else None
