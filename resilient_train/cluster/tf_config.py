"""TF_CONFIG: build it for local workers, parse and validate it from the environment.

The seeds' rules, kept here in one place:

* ``TF_CONFIG = {"cluster": {...}, "task": {"type", "index"}}``; the cluster is the same on
  every process, the task differs.
* With ``MultiWorkerMirroredStrategy`` the chief is the ``chief`` task when the cluster has
  one, otherwise ``worker`` index 0.
* TF_CONFIG must be in the environment before the strategy is created, so the worker parses
  it before importing TensorFlow and fails with a readable message when it is malformed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from resilient_train.errors import ConfigError

__all__ = ["ClusterInfo", "build_tf_config", "parse_tf_config"]

_TRAINING_TASK_TYPES = ("chief", "worker")


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the worker group.

    ``rank`` orders the training tasks chief-first (``chief:0``, then ``worker:0..``), which
    is also the order MultiWorkerMirroredStrategy uses for its replicas. ``addresses`` are
    the tasks' ``host:port`` in that order (empty for a single local worker).
    """

    num_workers: int
    rank: int
    task_type: str
    task_index: int
    addresses: tuple[str, ...] = ()

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "chief" if self.is_chief else "worker"


def build_tf_config(addresses: list[str], index: int) -> dict:
    """TF_CONFIG for worker ``index`` of a worker-only cluster (worker 0 is the chief)."""
    if not 0 <= index < len(addresses):
        raise ConfigError(f"Received worker index={index}; expected 0..{len(addresses) - 1}")
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}


def parse_tf_config(text: str | None) -> ClusterInfo:
    """Validate a TF_CONFIG string; ``None`` or empty means a single local worker."""
    if not text:
        return ClusterInfo(num_workers=1, rank=0, task_type="worker", task_index=0)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg} at char {exc.pos}): {text[:120]!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ConfigError(
            'TF_CONFIG has no "cluster" object; expected '
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}'
        )
    cluster = config["cluster"]
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(f'TF_CONFIG has no valid "task" (got {task!r}); expected {{"type": "worker", "index": N}}')
    task_type, task_index = task["type"], task["index"]
    for job, addrs in cluster.items():
        if not isinstance(addrs, list) or not all(isinstance(a, str) and ":" in a for a in addrs):
            raise ConfigError(f'TF_CONFIG cluster["{job}"]={addrs!r}; expected a list of "host:port" strings')
    if task_type not in _TRAINING_TASK_TYPES:
        raise ConfigError(
            f"TF_CONFIG task type {task_type!r} is not supported; expected one of {list(_TRAINING_TASK_TYPES)}"
        )
    if task_type not in cluster:
        raise ConfigError(f"TF_CONFIG task type {task_type!r} does not appear in the cluster {sorted(cluster)}")
    if not isinstance(task_index, int) or not 0 <= task_index < len(cluster[task_type]):
        raise ConfigError(
            f"TF_CONFIG task index {task_index!r} is out of range; "
            f"cluster[{task_type!r}] has {len(cluster[task_type])} entries"
        )
    if len(cluster.get("chief", [])) > 1:
        raise ConfigError(f"TF_CONFIG has {len(cluster['chief'])} chief tasks; expected at most 1")
    chiefs = len(cluster.get("chief", []))
    num = chiefs + len(cluster.get("worker", []))
    rank = task_index if task_type == "chief" else chiefs + task_index
    addresses = tuple(cluster.get("chief", [])) + tuple(cluster.get("worker", []))
    return ClusterInfo(num_workers=num, rank=rank, task_type=task_type, task_index=task_index, addresses=addresses)
