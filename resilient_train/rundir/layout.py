"""The run directory: every file name in it, defined once.

``RunDir(path)`` is the one way any part of resilient-train (supervisor, workers,
launchers, the chaos checker, tests) names a file of a run. Nothing else spells
``events.jsonl`` or ``attempt-<n>/worker-<rank>.log``::

    runs/<recipe>/                 RunDir(path)
      run.json                     .run_file         run id, kept across re-runs
      fingerprint.json             .fingerprint      the job's fingerprint (job/fingerprint.py)
      supervisor.lock              .lock             flock of the live supervisor (rundir/lock.py)
      events.jsonl                 .events           the event log (rundir/events.py)
      summary.json                 .summary          the run's outcome (supervisor/summary.py)
      attempt-<n>/                 .attempt(n)       AttemptDir
        job.json                   .job              the resolved config of every worker
        worker-<rank>.log          .log(rank)        stdout/stderr
        error-<rank>.json          .error(rank)      uncaught exception (rundir/errorfile.py)
        step-<rank>.txt            .step_marker(rank) last finished global step (rundir/stepmarker.py)
        phase-<rank>.txt           .phase_marker(rank) what the worker is doing: train, eval, flush... (same)
        step-indices.txt           .step_indices     per global step, a digest of its example indices
                                                     (--record-indices; rundir/stepindices.py)
        stacks-<rank>.txt          .stacks(rank)     Python stacks dumped on SIGUSR1 (rundir/stacks.py)
        slurm-task-<rank>.json     .slurm_exit(rank) a Slurm task's exit (launchers/slurm_task.py)
        slurm-term-<rank>          .slurm_term(rank) that Slurm task got SIGTERM
        notice-<rank>.json         .notice(rank)     that worker's node announced its end (runner/process/preemption_notices.py)
      local/                       .local            per-host scratch, never shared
        host-cache/                .host_cache       verified checkpoint copies (checkpoint/cache.py)
        rank-<rank>/               .work_dir(rank)   worker staging and restore cache
          tmp/                     .temp_dir(rank)   the worker's TMPDIR, removed at exit (rundir/scratch.py)
      local-slots                  .local_slots      how many workers the local launcher may place (a test
                                                     hook for elastic runs; absent: no limit)
      tensorboard/                 .tensorboard      the chief's scalars
      model/                       .model            the exported final model
      checkpoints/                 (default --storage; the storage layout is checkpoint/store.py's)

Pure paths: constructing one touches nothing on disk.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir", "AttemptDir", "attempt_number", "EVENTS", "SUMMARY", "RUN_FILE", "FINGERPRINT", "LOCK", "TENSORBOARD",
           "MODEL", "LOCAL", "LOCAL_SLOTS", "JOB", "CHECKPOINTS", "STEP_INDICES"]

EVENTS = "events.jsonl"
SUMMARY = "summary.json"
RUN_FILE = "run.json"
FINGERPRINT = "fingerprint.json"
LOCK = "supervisor.lock"
TENSORBOARD = "tensorboard"
MODEL = "model"
LOCAL = "local"
LOCAL_SLOTS = "local-slots"
CHECKPOINTS = "checkpoints"
JOB = "job.json"
STEP_INDICES = "step-indices.txt"
_ATTEMPT = re.compile(r"attempt-(\d+)")


@dataclass(frozen=True)
class AttemptDir:
    """``attempt-<n>/``: what the workers of one attempt leave behind.

    ``number`` is None for a directory named by its path alone (a reader that was handed
    the directory, not the run); the names inside do not depend on it.
    """

    path: Path
    number: int | None = None

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> "AttemptDir":
        """The attempt directory at ``path`` (named ``attempt-<n>``); ValueError otherwise."""
        number = attempt_number(Path(path).name)
        if number is None:
            raise ValueError(f"Received attempt dir {str(path)!r}; expected a directory named attempt-<n>")
        return cls(Path(path), number)

    @property
    def job(self) -> Path:
        return self.path / JOB

    def log(self, rank: int) -> Path:
        return self.path / f"worker-{rank}.log"

    def error(self, rank: int) -> Path:
        return self.path / f"error-{rank}.json"

    def step_marker(self, rank: int) -> Path:
        return self.path / f"step-{rank}.txt"

    def phase_marker(self, rank: int) -> Path:
        return self.path / f"phase-{rank}.txt"

    @property
    def step_indices(self) -> Path:
        return self.path / STEP_INDICES

    def stacks(self, rank: int) -> Path:
        return self.path / f"stacks-{rank}.txt"

    def step_markers(self) -> list[Path]:
        return sorted(self.path.glob("step-*.txt"))

    def errors(self) -> list[Path]:
        return sorted(self.path.glob("error-*.json"))

    def slurm_exit(self, rank: int) -> Path:
        return self.path / f"slurm-task-{rank}.json"

    def slurm_term(self, rank: int) -> Path:
        return self.path / f"slurm-term-{rank}"

    def notice(self, rank: int) -> Path:
        return self.path / f"notice-{rank}.json"

    def notices(self) -> list[Path]:
        return sorted(self.path.glob("notice-*.json"))


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def events(self) -> Path:
        return self.path / EVENTS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def fingerprint(self) -> Path:
        return self.path / FINGERPRINT

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def local(self) -> Path:
        return self.path / LOCAL

    @property
    def local_slots(self) -> Path:
        return self.path / LOCAL_SLOTS

    @property
    def host_cache(self) -> Path:
        return self.local / "host-cache"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def worker_logs_glob(self) -> str:
        """Every attempt's worker logs, as a glob pattern (for people: "Logs: ...")."""
        return str(self.path / "attempt-*" / "worker-*.log")

    def work_dir(self, rank: int) -> Path:
        return self.local / f"rank-{rank}"

    def temp_dir(self, rank: int) -> Path:
        return self.work_dir(rank) / "tmp"

    def attempt(self, number: int) -> AttemptDir:
        if number < 1:
            raise ValueError(f"Received attempt={number}; expected >= 1")
        return AttemptDir(self.path / f"attempt-{number}", number)

    def attempts(self) -> list[AttemptDir]:
        """The attempt directories present, oldest first."""
        return [attempt for _, attempt in self._numbered_attempts()]

    def next_attempt_number(self) -> int:
        numbered = self._numbered_attempts()
        return numbered[-1][0] + 1 if numbered else 1

    def _numbered_attempts(self) -> list[tuple[int, AttemptDir]]:
        found: list[tuple[int, AttemptDir]] = []
        for child in self.path.glob("attempt-*"):
            number = attempt_number(child.name)
            if number is not None and child.is_dir():
                found.append((number, AttemptDir(child, number)))
        return sorted(found, key=lambda pair: pair[0])


def attempt_number(name: str) -> int | None:
    """``7`` for ``attempt-7``; None for any other name."""
    match = _ATTEMPT.fullmatch(name)
    return int(match.group(1)) if match else None
