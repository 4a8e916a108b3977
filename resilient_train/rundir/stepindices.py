"""Per-step digests of the example indices a run trained on (``--record-indices``).

With an indexed recipe (runner/input/indexed.py) and ``--record-indices``, every training step
all-gathers the example indices its replicas were fed (in replica order, which is rank
order), and the chief appends one line per global step to
``attempt-<n>/step-indices.txt``::

    <global step> <sha256>

``<global step>`` is the step's number once finished (1 for the first step, as in the step
markers); ``<sha256>`` is :func:`index_digest` of the global batch's indices: the SHA-256 of
the decimal indices joined by ``,`` (``sha256("17,3,1204")``), so anyone can recompute it.

A resumed attempt re-trains the steps after the last commit and records them again;
:func:`read_step_indices` merges a run's attempts, a later attempt's line winning, and
:func:`replayed_conflicts` lists the steps recorded twice with different digests (none when
resume is exact). Two runs trained on the same examples at every step have equal
:func:`read_step_indices` maps, whatever their worker counts; ``diff`` of the files of
uninterrupted runs says the same.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable, TextIO

from resilient_train.rundir.layout import AttemptDir, RunDir

__all__ = ["index_digest", "StepIndexLog", "read_attempt_indices", "read_step_indices", "replayed_conflicts"]


def index_digest(indices: Iterable[int]) -> str:
    """SHA-256 (hex) of the indices in order, written in decimal and joined by commas."""
    return hashlib.sha256(",".join(str(int(i)) for i in indices).encode()).hexdigest()


class StepIndexLog:
    """The chief's appender; a closed log (``path`` None) writes nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle: TextIO | None = None

    def write(self, global_step: int, indices: Iterable[int]) -> None:
        if self.path is None:
            return
        if self._handle is None:
            self._handle = open(self.path, "a")
        self._handle.write(f"{global_step} {index_digest(indices)}\n")

    def flush(self) -> None:
        """Once per call: the lines of finished steps reach the file (a kill loses none)."""
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_attempt_indices(attempt: AttemptDir) -> list[tuple[int, str]]:
    """One attempt's ``(global step, sha256)`` lines in file order ([] when none)."""
    path = attempt.step_indices
    if not path.is_file():
        return []
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if len(fields) != 2 or not fields[0].isdigit():
            raise ValueError(f"{path}:{number}: {line!r} is not '<global step> <sha256>'")
        lines.append((int(fields[0]), fields[1]))
    return lines


def read_step_indices(run_dir: str | os.PathLike[str]) -> dict[int, str]:
    """Global step -> digest over every attempt of a run (a later attempt wins)."""
    merged: dict[int, str] = {}
    for attempt in RunDir(run_dir).attempts():
        merged.update(read_attempt_indices(attempt))
    return dict(sorted(merged.items()))


def replayed_conflicts(run_dir: str | os.PathLike[str]) -> list[int]:
    """The steps recorded more than once with different digests."""
    seen: dict[int, str] = {}
    conflicts = set()
    for attempt in RunDir(run_dir).attempts():
        for step, digest in read_attempt_indices(attempt):
            if seen.setdefault(step, digest) != digest:
                conflicts.add(step)
    return sorted(conflicts)
