"""A real multi-node Ray cluster on this machine, on loopback only, for the Ray launcher tests.

``ray.cluster_utils.Cluster`` starts one head (GCS, no CPUs, so no worker ever lands on
it and removing a worker node never takes the cluster down) and ``NODES`` worker nodes
(each its own raylet, object store and worker processes), every one with
``node_ip_address=127.0.0.1``. The supervisor under test joins as a driver through
``RAY_ADDRESS``; ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray's node-IP lookup on
loopback in every process of the test (see supervisor/launchers/ray.py).

Node-loss detection is Ray's GCS health check, tuned down from its defaults (period 3 s,
timeout 10 s, threshold 5: ~15-25 s) to a check every 500 ms, failing after 3 misses of
500 ms each, so a removed node is declared dead in about 1.5-2 s.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

NODES = 3
CPUS_PER_NODE = 2
HEALTH_CHECK = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
SLOW_HEALTH_CHECK = {**HEALTH_CHECK, "health_check_failure_threshold": 10}
_OBJECT_STORE_BYTES = 80 * 1024 * 1024


@dataclass
class RayTestCluster:
    cluster: Any
    address: str
    cpus_per_node: int = CPUS_PER_NODE
    workers: list[Any] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """What a supervisor process needs to join this cluster on loopback."""
        return {"RAY_ADDRESS": self.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

    def node(self, node_id: str) -> Any:
        return next(n for n in self.workers if n.node_id == node_id)

    def add_worker(self, env: dict[str, str] | None = None) -> None:
        """One more worker node; ``env``: variables its raylet, and so every process it
        starts (slot actors, the workers they run), has and the other nodes do not (a
        per-node metadata endpoint: GCE_METADATA_HOST)."""
        self.workers.append(
            self.cluster.add_node(node_ip_address="127.0.0.1", num_cpus=self.cpus_per_node,
                                  object_store_memory=_OBJECT_STORE_BYTES, env_vars=dict(env or {}))
        )
        self.cluster.wait_for_nodes()

    def remove(self, node_id: str) -> None:
        """Kill a whole worker node: its raylet, object store and every worker process."""
        node = self.node(node_id)
        self.workers.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)


def start_cluster(nodes: int = NODES, cpus_per_node: int = CPUS_PER_NODE, health_check: dict[str, int] = HEALTH_CHECK,
                  node_env: list[dict[str, str]] | None = None) -> RayTestCluster:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": "127.0.0.1",
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": _OBJECT_STORE_BYTES,
            "_system_config": dict(health_check),
        },
    )
    test_cluster = RayTestCluster(cluster, cluster.address, cpus_per_node)
    for index in range(nodes):
        test_cluster.add_worker(node_env[index] if node_env else None)
    return test_cluster


@contextlib.contextmanager
def joined_cluster(
    nodes: int = NODES, cpus_per_node: int = CPUS_PER_NODE, health_check: dict[str, int] = HEALTH_CHECK,
    node_env: list[dict[str, str]] | None = None,
) -> Iterator[RayTestCluster]:
    """A fresh loopback cluster whose address is in this process's environment (RAY_ADDRESS),
    which the jobs the tests start inherit (tests/integration/harness.py copies os.environ)."""
    pytest.importorskip("ray", reason="Ray not installed: pip install 'resilient-train[ray]'")
    saved = {key: os.environ.get(key) for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    test_cluster = start_cluster(nodes, cpus_per_node, health_check, node_env)
    os.environ.update(test_cluster.env())
    try:
        yield test_cluster
    finally:
        test_cluster.cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayTestCluster]:
    """A fresh 3-node cluster (2 CPUs each) per test module, shut down after it."""
    with joined_cluster() as test_cluster:
        yield test_cluster


@pytest.fixture(scope="module")
def one_cpu_ray_cluster() -> Iterator[RayTestCluster]:
    """A fresh 2-node cluster of 1 CPU each per test module: one default worker per node,
    no spare. Ray declares a removed node dead after ``SLOW_HEALTH_CHECK`` (~5 s), so the
    supervisor sees the attempt end while Ray still lists the node alive."""
    with joined_cluster(nodes=2, cpus_per_node=1, health_check=SLOW_HEALTH_CHECK) as test_cluster:
        yield test_cluster
