"""The worker's MultiWorkerMirroredStrategy, with the in-worker defences against a broken group.

The supervisor's progress watchdog (supervisor/watchdog.py) is the first line of defence
against a group that is alive but stuck. Inside the worker, TensorFlow offers two more:

* **The coordination service's heartbeat** (second line). Every task heartbeats to the
  service on the chief; a task that misses them for ``HEARTBEAT_TIMEOUT_S`` (a frozen
  process, a partitioned host) is declared dead and every survivor's collectives are
  aborted (``UnavailableError``), which the worker maps to ``EXIT_GROUP_BROKEN``
  (runner/failures/diagnose.py). We pin the timeout rather than inherit TensorFlow's default, and
  bound the cluster *registration* by ``--startup-timeout`` with a barrier: every task
  waits there for all the others and fails (``DeadlineExceededError``, exit 4) when one
  never registers, instead of waiting an hour in TensorFlow's device propagation. Both are
  configuration only: no cost per step.
* **A collective timeout** (third line, ``--collective-timeout``, default off): a
  collective that waits longer fails with ``DeadlineExceededError`` (exit 4 likewise). It
  catches a peer that heartbeats but never arrives even without a supervisor. TensorFlow
  implements it with one sleeping thread per executed collective that lives for the whole
  timeout, so a worker holds about ``timeout x collectives per second`` extra threads
  (benchmarks/defences.py measures it): off unless asked, and, when set, it must be longer
  than the supervisor's hang allowance or it pre-empts the watchdog, which names the
  stuck rank and where it is.

TensorFlow configures the coordination service itself when the strategy starts, unless
one is configured already: :func:`make_strategy` configures it first, with the same
service type, leader and jobs TensorFlow would choose, plus the two timeouts.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
from tensorflow.python.eager import context

from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.job.config import JobConfig

__all__ = ["make_strategy", "HEARTBEAT_TIMEOUT_S"]

# A peer silent this long is dead. TensorFlow's own default today; pinned so that a change
# of default cannot turn seconds into minutes. Heartbeats come from a C++ thread, so a busy
# Python process (or a stuck training thread) still sends them; only a frozen or
# unreachable process misses them.
HEARTBEAT_TIMEOUT_S = 10.0

_COORDINATED_JOBS = ("chief", "worker")
# Bound at import: a fit script's seam replaces tf.distribute's name (runner/keras_recipes/fitscript.py).
_MULTI_WORKER_MIRRORED = tf.distribute.MultiWorkerMirroredStrategy


def make_strategy(job: JobConfig, cluster: ClusterInfo) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The strategy for this worker; call it before any other TensorFlow op."""
    if cluster.num_workers > 1:
        _configure_coordination(job.startup_timeout)
    communication = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=job.collective_timeout,
    )
    return _MULTI_WORKER_MIRRORED(communication_options=communication)


def _configure_coordination(register_timeout_s: float) -> None:
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2

    spec = TFConfigClusterResolver().cluster_spec()
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=name, num_tasks=spec.num_tasks(name))
        for name in _COORDINATED_JOBS
        if name in spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        enable_health_check=True,
        cluster_register_timeout_in_ms=int(register_timeout_s * 1000),
        heartbeat_timeout_in_ms=int(HEARTBEAT_TIMEOUT_S * 1000),
        coordinated_jobs=jobs,
    )
    # Every task, the chief included, waits at registration for all the others and fails
    # once the registration timeout passes; without it, a chief whose peer never registers
    # waits in device propagation (an hour). configure_coordination_service has no argument
    # for it; the proto field is public.
    context.context().coordination_service.cluster_register_with_barrier = True
