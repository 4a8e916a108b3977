"""The parameter-server cluster: one coordinator, P parameter servers, N workers.

One owner for the layout every process of a ``--strategy parameter-server`` run agrees on:

* **ranks** number the processes of an attempt: rank 0 is the coordinator (TF_CONFIG task
  ``chief``), ranks 1..P the parameter servers (``ps``), ranks P+1..P+N the workers
  (``worker``). Logs, error files and step markers are per rank (rundir/layout.py), so the
  root cause names a rank like in a MultiWorkerMirroredStrategy run, plus its role.
* **TF_CONFIG** lists all three jobs (the seeds' migration guide) and differs per process
  only in its ``task``.

A worker restarted in place gets the *same* TF_CONFIG (same address, same port): that is
the only way TensorFlow's ClusterCoordinator takes it back (it waits for a worker to
reappear at its address and re-schedules its closures there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from resilient_train.errors import ConfigError

__all__ = ["PsTask", "ps_task", "ps_tf_config", "parse_ps_tf_config", "ROLES"]

ROLES = ("chief", "ps", "worker")


@dataclass(frozen=True)
class PsTask:
    """One process of the cluster: its role, index within the role, and rank."""

    role: str
    index: int
    rank: int

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Received role={self.role!r}; expected one of {list(ROLES)}")


def ps_task(rank: int, ps: int, workers: int) -> PsTask:
    """The task of ``rank`` in a cluster of 1 coordinator, ``ps`` servers and ``workers`` workers."""
    if not 0 <= rank <= ps + workers:
        raise ValueError(f"Received rank={rank!r}; expected 0..{ps + workers}")
    if rank == 0:
        return PsTask("chief", 0, 0)
    if rank <= ps:
        return PsTask("ps", rank - 1, rank)
    return PsTask("worker", rank - 1 - ps, rank)


def ps_tf_config(addresses: list[str], rank: int, ps: int) -> dict:
    """TF_CONFIG for ``rank``, given every rank's ``host:port`` in rank order."""
    workers = len(addresses) - 1 - ps
    if workers < 1:
        raise ConfigError(f"Received {len(addresses)} addresses with ps={ps}; expected at least {ps + 2}")
    task = ps_task(rank, ps, workers)
    cluster = {"chief": addresses[:1], "ps": addresses[1:1 + ps], "worker": addresses[1 + ps:]}
    return {"cluster": cluster, "task": {"type": task.role, "index": task.index}}


def parse_ps_tf_config(text: str | None) -> tuple[PsTask, dict]:
    """This process's task and the cluster dict, from a parameter-server TF_CONFIG."""
    try:
        config = json.loads(text or "")
        cluster, task = config["cluster"], config["task"]
        role, index = task["type"], task["index"]
        ps, workers = len(cluster["ps"]), len(cluster["worker"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"TF_CONFIG={str(text)[:120]!r} is not a parameter-server cluster; expected "
            '{"cluster": {"chief": [..], "ps": [..], "worker": [..]}, "task": {"type": ..., "index": N}}'
        ) from None
    if role not in ROLES or not isinstance(index, int) or not 0 <= index < len(cluster[role]):
        raise ConfigError(f"TF_CONFIG task {task!r} is not in the cluster; expected a type in {list(ROLES)} and an index in range")
    rank = {"chief": 0, "ps": 1 + index, "worker": 1 + ps + index}[role]
    return ps_task(rank, ps, workers), cluster
