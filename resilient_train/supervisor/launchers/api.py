"""The launcher seam: *where* and *how* worker processes run, and nothing else.

The supervisor (supervisor/supervisor.py) owns everything that makes a run trustworthy on
any launcher: the one gang-restart loop, restart and preemption budgets, backoff,
crash-loop detection, root cause, exit codes, ``events.jsonl``, ``summary.json`` and
lost-step counting. A launcher owns only:

* **placement**: which node each rank of an attempt runs on, and the TF_CONFIG that follows
  from it (addresses reachable between those nodes, free ports *on those nodes*, chief =
  rank 0);
* **starting** a worker (``python -m resilient_train.runner --job FILE``) on its node with
  the environment the supervisor asks for;
* **telling** the supervisor when a worker is gone: a handle's ``poll()`` returns an exit
  code once the worker exited, was killed, or its whole node was lost (then
  ``lost_reason`` says so, and the launcher emits ``node_lost``);
* **signalling and killing** workers (``send_signal``), wherever they run;
* **bringing back** what a worker writes under its run dir (its log, events, step marker,
  error file) into the supervisor's run dir. Nodes may share nothing with the supervisor
  but the checkpoint storage; the supervisor reads those files only from its own run dir.

``runner/`` never learns how it was launched: a worker sees an argv, an environment with
TF_CONFIG, and a run dir it can write to.

Lifecycle, driven by the supervisor's single loop::

    prepare()                         once; ConfigError for what can be known up front
    capacity() -> int | None          before each attempt, and every few polls of an elastic run
    start(specs) -> handles           once per attempt, specs in rank order
    maintain(training=...)            every poll: pump files, reap/refill standbys
    stop_requested()                  every poll: True = the engine is stopping the job
    host_doomed(), avoid_noticed()    once a worker wrote a preemption notice marker
    close()                           once, always (finally)
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from resilient_train.job.config import JobConfig
from resilient_train.rundir.layout import AttemptDir

__all__ = ["Launcher", "WorkerHandle", "WorkerSpec", "read_notices"]


@dataclass(frozen=True)
class WorkerSpec:
    """One rank of one attempt, as the supervisor wants it started.

    ``env`` is the per-attempt environment (RT_ATTEMPT, RT_RUN_ID, ...) *without*
    TF_CONFIG: the launcher adds TF_CONFIG once it knows where the ranks run.
    ``attempt_dir`` is on the supervisor's side: the worker's log, step marker and error
    file must end up there (``log_path`` is the log).
    """

    rank: int
    attempt: int
    job: JobConfig
    env: Mapping[str, str] = field(default_factory=dict)
    attempt_dir: Path = Path(".")

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Received rank={self.rank!r}; expected an int >= 0")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            raise ValueError(f"Received attempt={self.attempt!r}; expected an int >= 1")

    @property
    def log_path(self) -> Path:
        return AttemptDir(self.attempt_dir, self.attempt).log(self.rank)

    @property
    def job_path(self) -> Path:
        return AttemptDir(self.attempt_dir, self.attempt).job


class WorkerHandle(Protocol):
    """A started worker, wherever it runs (subprocess.Popen satisfies the first three)."""

    pid: int

    def poll(self) -> int | None:
        """None while running; else the exit code (negative: killed by that signal)."""

    def send_signal(self, sig: int) -> None:
        """Deliver ``sig`` to the worker process; a no-op once it is gone."""


class Launcher(abc.ABC):
    """Places and starts the workers of each attempt; see the module docstring."""

    name: str = "?"

    def prepare(self) -> None:
        """Check what can be known before any worker starts (raise ConfigError)."""

    @abc.abstractmethod
    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        """Start one worker per spec (rank order); return their handles in the same order."""

    def capacity(self) -> int | None:
        """How many workers could you place now (counting the current attempt's own)?

        None: no limit known, place what is asked (the default). The supervisor of an
        elastic run (``--workers MIN:MAX``) starts each attempt at ``min(MAX, capacity)``,
        restarts smaller when capacity fell below the group's size, and grows back at the
        next save when it rose. Must be cheap: an elastic run asks every
        ``CAPACITY_EVERY_S`` while training.
        """
        return None

    def maintain(self, *, training: bool) -> None:
        """Called every poll. ``training``: the chief finished a step of this attempt."""

    def close(self) -> None:
        """Release everything the launcher holds (standbys, actors, connections)."""

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        """Extra ``worker_started`` fields for ``handle`` (node, standby, ...)."""
        return {}

    def stop_requested(self) -> bool:
        """The engine asked the whole job to stop (Slurm preemption reaching the tasks, not
        the supervisor): the supervisor then saves and exits 143 like on its own SIGTERM."""
        return False

    def host_doomed(self, attempt_dir: AttemptDir) -> str | None:
        """A worker of the attempt in ``attempt_dir`` was told its node is going (a cloud
        preemption notice, ``notice-<rank>.json``), and that node is the supervisor's own:
        the reason to stop the run with 143 (``notice:<provider>``) instead of restarting on
        a doomed host. None (the default): restart as after any preemption, elsewhere when
        the engine can place it elsewhere."""
        return None

    def avoid_noticed(self, attempt_dir: AttemptDir) -> list[str]:
        """Workers of the attempt in ``attempt_dir`` were told their node is going
        (``notice-<rank>.json``) and that node is not the supervisor's: place no worker of
        this run there again. Returns the nodes avoided by this call (each once; a node
        already avoided is not repeated). [] (the default): the launcher cannot tell where a
        rank runs or cannot avoid a node, so the next attempt may land there again."""
        return []

    def lost_reason(self, handle: WorkerHandle) -> str | None:
        """Why ``handle`` exited when the launcher knows better than its exit code (node lost)."""
        return None


def read_notices(attempt_dir: AttemptDir) -> dict[int, dict[str, Any]]:
    """The attempt's preemption notice markers (runner/process/preemption_notices.py writes them):
    rank -> the marker's fields (``provider``, ``kind``, ``deadline``, ``host``); a marker
    that does not parse still says that its rank's node is going (then ``{}``)."""
    found: dict[int, dict[str, Any]] = {}
    for path in attempt_dir.notices():
        rank = path.stem.removeprefix("notice-")
        if not rank.isdigit():
            continue
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError):
            fields = {}
        found[int(rank)] = fields if isinstance(fields, dict) else {}
    return found
