"""Step markers: the last global step each worker finished, for counting lost steps.

The chief and every worker rewrite ``<attempt_dir>/step-<rank>.txt`` in place after each
step (one ``pwrite``, no fsync: it must survive a process kill, not a host crash). Whoever
counts lost steps (the supervisor, the chaos checker) reads them after the attempt ended,
even if the supervisor itself was SIGKILLed in between.
"""

from __future__ import annotations

import os
from pathlib import Path

from resilient_train.rundir.layout import AttemptDir

__all__ = ["StepMarker", "highest_step"]


class StepMarker:
    """Writer side: the last finished global step, rewritten in place each step."""

    def __init__(self, path: Path | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666) if path else None  # umask decides

    def write(self, global_step: int) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, f"{global_step:<20}\n".encode(), 0)


def highest_step(attempt_dir: Path) -> int | None:
    """The highest global step any worker of the attempt finished; None without markers."""
    steps = []
    for path in AttemptDir.at(attempt_dir).step_markers():
        try:
            steps.append(int(path.read_text().strip() or "0"))
        except (OSError, ValueError):
            continue
    return max(steps) if steps else None
