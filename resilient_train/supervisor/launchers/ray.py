"""The Ray launcher: one worker per bundle of a placement group, on an existing Ray cluster.

The supervisor stays where it was started (its run dir lives only there) and joins the
cluster as a Ray driver. Each attempt's ranks run in **slot actors**, one per bundle of a
placement group (``--ray-strategy spread``: a bundle per node where possible; ``pack``:
fill nodes first); each bundle reserves ``--cpus-per-worker`` CPUs and
``--gpus-per-worker`` GPUs, so Ray itself sets the actor's CUDA_VISIBLE_DEVICES. A slot
actor (``_slot.Slot``) starts the real worker (``python -m resilient_train.runner``) as a
child process on its node, with TF_CONFIG built from the slots' node IPs and ports free on
those nodes (rank 0, the chief, in bundle 0), and sends back what the worker writes.

What the supervisor learns, and how:

* a worker process exits: the reply to the slot's outstanding ``poll`` carries its exit
  code (and, in the same reply, the last bytes of its log, events, step marker and error
  file). Each slot always has one poll outstanding, a long poll (``Slot.poll(wait_s)``):
  the actor answers at the worker's exit (a pidfd on the node), or after
  ``POLL_INTERVAL_S`` with what the worker wrote meanwhile, and ``pump`` sends the next
  poll as soon as a reply is in. So an exit is heard one Ray round trip after it happened,
  and the files are as fresh as with a poll every ``POLL_INTERVAL_S``. The actor is
  threaded (``SLOT_CONCURRENCY``), so a waiting poll does not hold up ``signal``,
  ``prestart_standby`` or ``close`` (see _slot.py's module docstring, "Threads"). Every poll reply
  is taken in: a slot's outstanding poll is answered before the slot is closed or started
  again (``_drain``), so no file bytes the slot sent are ever dropped;
* a slot actor or its whole node dies: the pending ``poll`` raises ``RayActorError``
  (``ActorDiedError``, ``ActorUnavailableError``) once Ray knows. The handle then reports
  ``-SIGKILL`` with ``lost_reason`` "node lost" and a ``node_lost`` event names the node
  (or "slot actor lost" when only the actor died and Ray still lists its node alive).
  ``ActorUnavailableError`` while Ray still lists the node alive is not yet a death: the
  node's raylet stopped answering and the GCS has not declared it dead. The slot is polled
  again until Ray answers (a report, or ``ActorDiedError`` once the node is declared dead)
  or ``UNAVAILABLE_GRACE_S`` passed; deciding at once named a lost node "slot actor lost".
  How fast Ray knows a node is gone is Ray's health check (``health_check_period_ms``,
  ``health_check_failure_threshold``; docs/clusters.md "Ray").

Every Ray call on a slot actor (where, free_port, start, poll, close) is answered through
one helper, ``_answers``: an actor or node death (``SLOT_LOST_ERRORS``), whichever call
notices it first, is a lost slot (``_SlotsLost``), never an error of the run. A killed
node's death reaches different calls depending on when Ray declares it dead: the attempt's
``poll`` (then the attempt ends; the node may still be listed alive, so the next attempt is
asked at the old size), or, seconds later, the next attempt's replacement slot, which Ray
had put on that node's bundle.

Either way the supervisor does its usual gang restart. The next attempt reuses every slot
actor that is alive (each may hold a warm standby: a process that imported TensorFlow and
the recipe, started once the attempt trained) and replaces only the lost ones: Ray
reschedules a dead node's bundles of the placement group onto other nodes (a spare), and
a new actor (``max_restarts=0``: Ray never restarts one by itself) waits for its bundle
there. No bundle within the placement timeout means no node can take the lost worker: the
run fails (``RestartNotPlacedError``), unless it is elastic (``--workers MIN:MAX``): then
``capacity()`` (bundles the alive nodes hold) sizes the next attempt, and a size change
places a new group of that many bundles. A slot that dies while an attempt starts (placed,
replaced or started) makes the launcher remove every slot and the group and place the
attempt anew, once; an elastic run's placement that the alive nodes cannot hold
(``capacity()``) fails at once, so the supervisor starts the attempt at the size they hold
instead of waiting out the placement timeout for a group that cannot come.

Loopback: when the Ray address is on 127.0.0.1/localhost (a test cluster on one machine),
the driver must say so too: Ray resolves "127.0.0.1" to the machine's interface address
and would wait for a GCS there. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (an environment
variable Ray reads at import) makes Ray's own node-IP lookup answer 127.0.0.1; it is set
only for loopback addresses, before ray is imported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from resilient_train.rundir import events
from resilient_train.cluster.tf_config import build_tf_config
from resilient_train.job.config import JobConfig
from resilient_train.errors import ConfigError, RestartNotPlacedError
from resilient_train.supervisor.launchers._slot import Slot, SlotReport, apply_chunks, seed_chunks
from resilient_train.rundir.layout import AttemptDir
from resilient_train.supervisor.launchers.api import Launcher, WorkerHandle, WorkerSpec, read_notices

__all__ = ["RayLauncher", "RayHandle", "RayPlacementError", "check_storage", "ray_address", "placement_strategy", "bundles_on",
           "SLOT_LOST_ERRORS", "slot_lost_errors"]

PLACEMENT_TIMEOUT_S = float(os.environ.get("RT_RAY_PLACEMENT_TIMEOUT_S", "60"))
# The wait of a slot's long poll when the worker does not exit: the longest a reply waits.
# Not longer, because the replies also carry the worker's files: the step markers the
# watchdog reads, the events the supervisor prints, the error files. A longer wait would
# need the slot to watch those files for new bytes too (a stat of each, every few ms);
# answering every 0.2 s keeps them exactly as fresh as the periodic poll did, and an exit
# does not wait for it.
POLL_INTERVAL_S = 0.2
# How long a slot may answer ActorUnavailableError on a node Ray lists alive before it is
# lost anyway: above the GCS's default time to declare a silent node dead (health checks
# every 3 s, 5 failures, 10 s timeout each).
UNAVAILABLE_GRACE_S = 60.0
# Threads of a slot actor: one long poll, and room beside it for signal, prestart_standby
# and close (the slot's lock serializes them; a thread only saves waiting for a poll).
SLOT_CONCURRENCY = 4
_CLOSE_TIMEOUT_S = 30.0
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_STRATEGIES = {"spread": "SPREAD", "pack": "PACK"}
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id (ray.util.placement_group.NODE_ID_LABEL_KEY)
# What a Ray call on a slot actor raises when the actor or its node died (ray.exceptions):
# the actor (ActorDiedError, ActorUnavailableError: RayActorError), its node, its worker
# process, the reply's object with the node, or the actor's bundle (group removed, or no
# node can ever hold it). GetTimeoutError is not here: a slot that does not answer in time
# may be alive; each caller says what silence means.
SLOT_LOST_ERRORS = (
    "RayActorError",
    "NodeDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "ActorPlacementGroupRemoved",
    "ActorUnschedulableError",
)


class RayPlacementError(ConfigError):
    """Ray cannot place the workers the job asks for (no placement, no actors, no ports in time).

    A ConfigError, so the CLI ends with its one-line message and exit 2 instead of a
    traceback: more CPUs/GPUs per worker than the cluster has is the usual cause. Only
    before the first attempt: later, ``start`` turns it into a ``RestartNotPlacedError``
    (errors.py; the run failed, exit 1).
    """


# ------------------------------------------------------------------ pure helpers
def ray_address(job: JobConfig, environ: dict[str, str] | os._Environ = os.environ) -> str:
    """``--ray-address``, else RAY_ADDRESS, else "auto" (the cluster this node belongs to)."""
    return job.ray_address or environ.get("RAY_ADDRESS") or "auto"


def is_loopback(address: str) -> bool:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in _LOOPBACK_HOSTS


def placement_strategy(name: str) -> str:
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"Received ray_strategy={name!r}; expected one of {sorted(_STRATEGIES)}") from None


def check_storage(job: JobConfig) -> None:
    """Refuse storage that other nodes cannot reach (ConfigError, before any worker)."""
    scheme = urlparse(job.storage).scheme if "://" in job.storage else ""
    if scheme == "memory":
        raise ConfigError(
            f"Received storage={job.storage!r} with --launcher ray; memory:// lives in one process. "
            "Pass --storage s3://bucket/prefix (or gs://...), or a shared mount with --storage-shared."
        )
    if scheme in ("", "file") and not job.storage_shared:
        raise ConfigError(
            f"Received storage={job.storage!r} with --launcher ray; a local path is not reachable from other nodes. "
            "Pass --storage s3://bucket/prefix (or gs://...), or a mount every node shares with --storage-shared."
        )


def job_for_nodes(job: JobConfig) -> JobConfig:
    """The job as nodes see it: a local recipe file and shared storage path made absolute."""
    updates: dict[str, Any] = {}
    if os.path.exists(job.recipe):
        updates["recipe"] = os.path.abspath(job.recipe)
    if "://" not in job.storage:
        updates["storage"] = os.path.abspath(job.storage)
    elif job.storage.startswith("file://"):
        updates["storage"] = "file://" + os.path.abspath(job.storage[len("file://"):])
    return dataclasses.replace(job, **updates)


def bundles_on(resources: dict[str, float], bundle: dict[str, float]) -> int:
    """How many ``bundle``s fit in a node's ``resources`` (0 when one is missing)."""
    return int(min((resources.get(name, 0.0) // amount for name, amount in bundle.items() if amount > 0), default=0))


def slot_lost_errors(exceptions: Any) -> tuple[type[BaseException], ...]:
    """The exception types of ``SLOT_LOST_ERRORS`` that this Ray's ``ray.exceptions`` has."""
    return tuple(getattr(exceptions, name) for name in SLOT_LOST_ERRORS if hasattr(exceptions, name))


class _SlotsLost(Exception):
    """Ray calls on slots failed because the slot actor or its node died (never escapes
    this module: ``start`` places anew, ``pump`` reports the worker lost)."""

    def __init__(self, slots: list[int], cause: BaseException) -> None:
        super().__init__(f"slot actors {slots} lost: {_first_line(cause)}")
        self.slots = slots
        self.cause = cause


def unique_addresses(ips: list[str], ports: list[int]) -> bool:
    """Two slots on one machine (a test cluster) can be told the same free port."""
    addresses = [f"{ip}:{port}" for ip, port in zip(ips, ports)]
    return len(set(addresses)) == len(addresses)


# ------------------------------------------------------------------ handles
@dataclass
class _SlotState:
    actor: Any
    node_id: str
    node_ip: str
    pending: Any = None  # the ObjectRef of the outstanding poll
    standby_ready: bool = False
    started: bool = False  # a worker was started here (else a new slot: seed the chief's)
    unavailable_since: float | None = None  # the first of the polls answering ActorUnavailableError in a row


class RayHandle:
    """A worker in a slot actor: ``poll`` answers from the last report the launcher pumped."""

    def __init__(self, launcher: "RayLauncher", slot: int, pid: int, standby: bool) -> None:
        self.launcher = launcher
        self.slot = slot
        self.pid = pid
        self.standby = standby
        self.standby_warm: bool | None = None  # a standby: had it finished importing when handed over?
        self.returncode: int | None = None
        self.lost: str | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.launcher.pump()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.launcher.signal(self.slot, sig, self.pid)


# ------------------------------------------------------------------ the launcher
class RayLauncher(Launcher):
    name = "ray"

    def __init__(self, job: JobConfig, *, ray_module: Any = None, clock=time.monotonic) -> None:
        self.job = job
        self.node_job = job_for_nodes(job)
        self.clock = clock
        self._ray = ray_module
        self._slot_actor: Any = None
        self._group: Any = None
        self._slots: list[_SlotState] = []
        self._handles: dict[int, RayHandle] = {}
        self._prestarted = False
        self._started = False  # an attempt of this run started: placement failures are run failures
        self._avoided: list[str] = []  # node ids with a preemption notice: no bundle of this run goes there

    # ------------------------------------------------------------ lifecycle
    def prepare(self) -> None:
        check_storage(self.job)
        placement_strategy(self.job.ray_strategy)
        ray = self._import_ray()
        address = ray_address(self.job)
        kwargs: dict[str, Any] = {"address": address, "logging_level": "ERROR", "log_to_driver": False}
        if is_loopback(address):
            kwargs["_node_ip_address"] = "127.0.0.1"
        # ray.init installs a SIGTERM handler that exits the driver; the supervisor's own
        # (forward SIGTERM, let the workers save, exit 143) must stay in place.
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"Cannot join the Ray cluster at {address!r}: {_first_line(exc)}") from None
        finally:
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self._slot_actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=SLOT_CONCURRENCY)(_RaySlot)
        events.emit("ray_connected", address=address, nodes=sum(1 for n in ray.nodes() if n.get("Alive")))

    def start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        """Start the attempt on the slots, placing new ones when a slot is gone.

        A slot can also die between attempts (its node lost during the backoff): then
        starting on it fails, and the attempt is placed anew once. No placement for the
        first attempt is the request's fault (RayPlacementError, exit 2); for a later one (a
        lost node and no spare) it is a run failure (RestartNotPlacedError; the supervisor writes
        summary.json and exits 1).
        """
        try:
            handles = self._place_and_start(specs)
        except RayPlacementError as exc:
            if not self._started:
                raise
            raise RestartNotPlacedError(f"could not place {len(specs)} workers: {exc}") from None
        self._started = True
        return handles

    def _place_and_start(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        run_id = specs[0].env.get("RT_RUN_ID", "run")
        for tries_left in (1, 0):
            try:
                lost = [i for i in range(len(self._slots)) if self._dead(i)]
                if len(self._slots) != len(specs) or any(s.node_id in self._avoided for s in self._slots):
                    self._release()
                    self._place(len(specs), run_id=run_id)
                elif lost:
                    self._replace(lost, run_id=run_id)
                return self._start_on_slots(specs)
            except _SlotsLost as lost_slots:
                events.emit("placement_lost", error=type(lost_slots.cause).__name__, slots=lost_slots.slots,
                            retry=bool(tries_left))
                self._release()
                if not tries_left:
                    raise RayPlacementError(
                        f"Ray slot actors died twice while starting workers: {_first_line(lost_slots.cause)}"
                    ) from None
            except self._ray.exceptions.GetTimeoutError:
                raise RayPlacementError(
                    f"Ray slot actors did not answer within {PLACEMENT_TIMEOUT_S:.0f} s while starting workers"
                ) from None
        raise AssertionError("unreachable")

    def _start_on_slots(self, specs: list[WorkerSpec]) -> list[WorkerHandle]:
        ports = self._ports()
        addresses = [f"{s.node_ip}:{p}" for s, p in zip(self._slots, ports)]
        job_json = self.node_job.to_json()
        for index in range(len(self._slots)):
            self._drain(index)
        refs = {}
        for index, (spec, slot) in enumerate(zip(specs, self._slots)):
            env = {**spec.env, "TF_CONFIG": json.dumps(build_tf_config(addresses, spec.rank))}
            seed = seed_chunks(Path(self.job.run_dir)) if spec.rank == 0 and not slot.started else ()
            refs[index] = self._send(index, slot.actor, "start", job_json, spec.rank, spec.attempt, env, seed)
        answers = self._answers(refs, timeout=PLACEMENT_TIMEOUT_S)
        started = [answers[index] for index in range(len(specs))]
        for slot in self._slots:
            slot.started = True
        self._handles = {}
        self._prestarted = False
        for index, info in enumerate(started):
            self._handles[index] = RayHandle(self, index, int(info["pid"]), bool(info["standby"]))
            if info["standby"]:
                self._handles[index].standby_warm = bool(info.get("standby_warm"))
        return [self._handles[i] for i in range(len(specs))]

    def maintain(self, *, training: bool) -> None:
        self.pump()
        if training and self.job.warm_standby and not self._prestarted:
            self._prestarted = True
            for index in range(len(self._slots)):
                self._tell(index, "prestart_standby", self.node_job.recipe)

    def close(self) -> None:
        self._release(final=True)
        if self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()

    def capacity(self) -> int | None:
        """How many bundles the alive nodes' total resources hold (our own slots included).

        Totals, not what is available: the current attempt's bundles occupy what it runs on.
        Another job's use of the cluster is not seen, so a grow it blocks fails placement and
        the attempt is retried smaller (supervisor). None when Ray does not answer.
        """
        if self._ray is None or not self._ray.is_initialized():
            return None
        try:
            nodes = [n for n in self._ray.nodes() if n.get("Alive")]
        except Exception:  # noqa: BLE001 - no answer from the GCS: no opinion
            return None
        return sum(bundles_on(node.get("Resources") or {}, self._bundle()) for node in nodes
                   if node.get("NodeID") not in self._avoided)

    def avoid_noticed(self, attempt_dir: AttemptDir) -> list[str]:
        """The nodes of the noticing ranks' slots: ``capacity()`` no longer counts them, and
        the next placement is a new group whose every bundle carries the label selector
        ``ray.io/node-id: !in(<avoided>)`` (Ray labels each node with its id), so no
        worker of this run lands there again. The current slots stay until the attempt
        ended (they are saving)."""
        new = []
        for rank in sorted(read_notices(attempt_dir)):
            node = self._slots[rank].node_id if rank < len(self._slots) else ""
            if node and node not in self._avoided:
                self._avoided.append(node)
                new.append(node)
        return new

    def describe(self, handle: WorkerHandle) -> dict[str, object]:
        if not isinstance(handle, RayHandle):
            return {}
        slot = self._slots[handle.slot]
        fields: dict[str, object] = {"node": slot.node_id, "node_ip": slot.node_ip, "standby": handle.standby}
        if handle.standby_warm is not None:
            fields["standby_warm"] = handle.standby_warm
        return fields

    def lost_reason(self, handle: WorkerHandle) -> str | None:
        return handle.lost if isinstance(handle, RayHandle) else None

    # ------------------------------------------------------------ pumping
    def pump(self) -> None:
        """Take in every finished poll reply; send the next long poll to each slot whose
        worker runs and that has none outstanding (at once: the actor does the waiting)."""
        ray = self._ray
        for index, slot in enumerate(self._slots):
            handle = self._handles.get(index)
            if handle is None or handle.returncode is not None:
                continue
            if slot.pending is not None:
                ready, _ = ray.wait([slot.pending], timeout=0)
                if not ready:
                    continue
                ref, slot.pending = slot.pending, None
                try:
                    report = self._answers({index: ref}, timeout=0)[index]
                except _SlotsLost as lost:
                    self._poll_failed(handle, slot, lost.cause)
                    continue
                slot.unavailable_since = None
                self._take(handle, slot, report)
            if handle.returncode is None:
                try:
                    slot.pending = self._send(index, slot.actor, "poll", POLL_INTERVAL_S)
                except _SlotsLost as lost:
                    self._poll_failed(handle, slot, lost.cause)

    def _poll_failed(self, handle: RayHandle, slot: _SlotState, exc: BaseException) -> None:
        """A poll on ``slot`` raised a slot death: lost, unless Ray only cannot reach the
        actor on a node it still lists alive (then the next ``pump`` polls again, for up to
        ``UNAVAILABLE_GRACE_S``: Ray declares the node dead or the actor answers)."""
        unavailable = getattr(self._ray.exceptions, "ActorUnavailableError", ())
        if isinstance(exc, unavailable) and self._node_alive(slot.node_id):
            now = self.clock()
            if slot.unavailable_since is None:
                slot.unavailable_since = now
            if now - slot.unavailable_since < UNAVAILABLE_GRACE_S:
                return
        self._lost(handle, slot, exc)

    def _take(self, handle: RayHandle, slot: _SlotState, report: SlotReport) -> None:
        apply_chunks(Path(self.job.run_dir), report.chunks)
        if report.standby_ready and not slot.standby_ready:
            events.emit("standby_ready", node=slot.node_id, slot=handle.slot)
        slot.standby_ready = report.standby_ready
        if report.returncode is not None:
            handle.returncode = report.returncode

    def _lost(self, handle: RayHandle, slot: _SlotState, exc: BaseException) -> None:
        """The slot actor is gone: with its node (``node_lost``), or alone (killed)."""
        node_alive = self._node_alive(slot.node_id)
        handle.lost = "slot actor lost" if node_alive else "node lost"
        handle.returncode = -signal.SIGKILL
        if not node_alive:
            events.emit("node_lost", node=slot.node_id, node_ip=slot.node_ip, slot=handle.slot, pid=handle.pid,
                        error=type(exc).__name__)

    def _node_alive(self, node_id: str) -> bool:
        """Ray's view (the GCS marks a node dead before it reports its actors dead)."""
        try:
            return any(n.get("NodeID") == node_id and n.get("Alive") for n in self._ray.nodes())
        except Exception:  # noqa: BLE001 - no answer from the GCS: assume the worst
            return False

    def signal(self, slot: int, sig: int, pid: int | None = None) -> None:
        """``sig`` to the worker in ``slot`` (``pid``: only if it is still that process)."""
        self._tell(slot, "signal", int(sig), pid)

    def _drain(self, index: int) -> None:
        """Wait for slot ``index``'s outstanding poll and take its reply in.

        Called before the slot is started again or closed: the slot marked the reply's file
        bytes sent when it answered, so a reply dropped unread would lose them. The poll
        ends at once when the worker has exited, else within POLL_INTERVAL_S. Before a
        start none is outstanding in fact (the supervisor starts an attempt only after
        every worker's exit was reported, and ``pump`` polls no slot whose worker exited),
        so there this only keeps the rule true by construction; before a close, a poll
        is outstanding when the launcher closes while workers run. A lost slot's reply
        raises ``_SlotsLost`` (it carries no bytes: the caller goes on as for any loss).
        """
        slot = self._slots[index]
        if slot.pending is None:
            return
        ref, slot.pending = slot.pending, None
        report = self._answers({index: ref}, timeout=_CLOSE_TIMEOUT_S)[index]
        handle = self._handles.get(index)
        if handle is not None and handle.returncode is None:
            self._take(handle, slot, report)
        else:
            apply_chunks(Path(self.job.run_dir), report.chunks)

    # ------------------------------------------------------------ calls on slots
    def _answers(self, refs: dict[int, Any], *, timeout: float) -> dict[int, Any]:
        """Slot index -> the answer to its call ``refs[index]``: every Ray reply from a slot comes here.

        The first answer that is an actor or node death (``SLOT_LOST_ERRORS``) raises
        ``_SlotsLost`` at once, naming that slot, without waiting for the others; no
        answer from some slot within ``timeout`` raises Ray's ``GetTimeoutError``.
        """
        ray = self._ray
        lost_errors = slot_lost_errors(ray.exceptions)
        pending = dict(refs)
        answers: dict[int, Any] = {}
        deadline = self.clock() + timeout
        while pending:
            ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=max(0.0, deadline - self.clock()))
            if not ready:
                raise ray.exceptions.GetTimeoutError(
                    f"slots {sorted(pending)} did not answer within {timeout:.0f} s")
            for index in [i for i, ref in pending.items() if ref in ready]:
                try:
                    answers[index] = ray.get(pending.pop(index))
                except lost_errors as exc:
                    raise _SlotsLost([index], exc) from None
        return answers

    def _send(self, index: int, actor: Any, method: str, *args: Any) -> Any:
        """Call ``method`` on slot ``index``'s ``actor``: its ObjectRef (answered by ``_answers``);
        ``_SlotsLost`` when Ray refuses the call because it already knows the actor dead."""
        try:
            return getattr(actor, method).remote(*args)
        except slot_lost_errors(self._ray.exceptions) as exc:
            raise _SlotsLost([index], exc) from None

    def _tell(self, index: int, method: str, *args: Any) -> None:
        """Fire and forget ``method`` on slot ``index``: a lost slot's next ``poll`` says so."""
        try:
            self._send(index, self._slots[index].actor, method, *args)
        except _SlotsLost:
            pass

    # ------------------------------------------------------------ placement
    def _place(self, count: int, *, run_id: str) -> None:
        ray = self._ray
        from ray.util.placement_group import placement_group

        bundle = self._bundle()
        self._check_room(count)
        avoid = {"bundle_label_selector": [{NODE_ID_LABEL: f"!in({','.join(self._avoided)})"}] * count} if self._avoided else {}
        group = placement_group([dict(bundle) for _ in range(count)], strategy=placement_strategy(self.job.ray_strategy),
                                **avoid)
        self._group = group
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RayPlacementError(
                f"Ray could not place {count} workers with {bundle} each ({self.job.ray_strategy}) within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s; cluster resources: {ray.available_resources()}"
            )
        actors = [self._new_actor(index, run_id) for index in range(count)]
        # the slots first, so that a _release after a lost one kills them all
        self._slots = [_SlotState(actor, "", "") for actor in actors]
        try:
            where = self._answers({i: self._send(i, a, "where") for i, a in enumerate(actors)}, timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RayPlacementError(f"Ray placed the workers but their actors did not start within {PLACEMENT_TIMEOUT_S:.0f} s") from None
        self._slots = [_SlotState(actor, *where[index]) for index, actor in enumerate(actors)]
        events.emit("placement_ready", strategy=self.job.ray_strategy, nodes=[s.node_id for s in self._slots])

    def _replace(self, indices: list[int], *, run_id: str) -> None:
        """New slot actors for the lost slots ``indices`` only, in the same placement group.

        The surviving slots stay, with their warm standbys and their node's host cache. Ray
        reschedules a dead node's bundles onto other nodes by itself (the group stays);
        each new actor waits for its bundle, so no bundle within the timeout means no node
        can take the lost worker.
        """
        ray = self._ray
        self._check_room(len(self._slots))
        for index in indices:
            _kill_quietly(ray, self._slots[index].actor)
        actors = {index: self._new_actor(index, run_id) for index in indices}
        for index, actor in actors.items():  # so that a _release after a lost one kills them too
            self._slots[index] = _SlotState(actor, "", "")
        try:
            where = self._answers({i: self._send(i, actors[i], "where") for i in indices}, timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for actor in actors.values():
                _kill_quietly(ray, actor)
            raise RayPlacementError(
                f"Ray could not place {len(self._slots)} workers with {self._bundle()} each ({self.job.ray_strategy}) "
                f"within {PLACEMENT_TIMEOUT_S:.0f} s: no node took the bundles {indices} of the lost slots; "
                f"cluster resources: {ray.available_resources()}"
            ) from None
        for index in indices:
            self._slots[index] = _SlotState(actors[index], *where[index])
        self._handles = {}
        events.emit("placement_ready", strategy=self.job.ray_strategy, nodes=[s.node_id for s in self._slots],
                    replaced=indices)

    def _check_room(self, count: int) -> None:
        """Elastic: fail a placement the alive nodes cannot hold at once (RayPlacementError),
        so that the supervisor starts the attempt at the size they hold. A fixed-size run
        waits for its placement instead (a spare node may join in time)."""
        if not self.job.elastic:
            return
        capacity = self.capacity()
        if capacity is not None and capacity < count:
            raise RayPlacementError(
                f"Ray could not place {count} workers with {self._bundle()} each: the alive nodes hold {capacity}")

    def _bundle(self) -> dict[str, float]:
        bundle: dict[str, float] = {"CPU": float(self.job.cpus_per_worker)}
        if self.job.gpus_per_worker:
            bundle["GPU"] = float(self.job.gpus_per_worker)
        return bundle

    def _new_actor(self, index: int, run_id: str) -> Any:
        """A slot actor in bundle ``index`` of the current group (it waits for the bundle)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index),
            "num_cpus": float(self.job.cpus_per_worker),
            "num_gpus": float(self.job.gpus_per_worker),
        }
        return self._slot_actor.options(**options).remote(run_id, index)

    def _ports(self) -> list[int]:
        ips = [s.node_ip for s in self._slots]
        for _ in range(20):
            refs = {i: self._send(i, s.actor, "free_port", s.node_ip) for i, s in enumerate(self._slots)}
            answers = self._answers(refs, timeout=PLACEMENT_TIMEOUT_S)
            ports = [answers[i] for i in range(len(self._slots))]
            if unique_addresses(ips, ports):
                return ports
        raise RayPlacementError(f"could not find {len(ips)} distinct free ports on nodes {ips}")

    def _dead(self, index: int) -> bool:
        handle = self._handles.get(index)
        return handle is not None and handle.lost is not None

    def _release(self, *, final: bool = False) -> None:
        """Kill the slot actors (their workers and standbys die with them) and the group.

        Each live slot first hands back what its pump had not sent (then removes its
        node-local files; ``final``: the node's run directory too, see _slot.Slot.close).
        """
        ray = self._ray
        for index, slot in enumerate(self._slots):
            try:
                self._drain(index)  # its chunks first: the slot collected them before close's
                closing = self._send(index, slot.actor, "close", final)
                rest = self._answers({index: closing}, timeout=_CLOSE_TIMEOUT_S)[index]
                apply_chunks(Path(self.job.run_dir), rest)
            except Exception:  # noqa: BLE001 - lost, stuck, or close failed: the actor is killed below either way
                pass
            _kill_quietly(ray, slot.actor)
        self._slots = []
        self._handles = {}
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None

    def _import_ray(self) -> Any:
        if self._ray is not None:
            return self._ray
        address = ray_address(self.job)
        if is_loopback(address):
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # see the module docstring
        try:
            import ray
        except ImportError:
            raise ConfigError("--launcher ray needs Ray: pip install 'resilient-train[ray]'") from None
        if is_loopback(address):
            # Ray was imported before we could set the variable (a driver that imported it
            # itself): flip the same switch where Ray reads it (a private module).
            import ray._private.ray_constants as ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
        self._ray = ray
        return ray


class _RaySlot(Slot):
    """The slot as a Ray actor: its run dir is under the node's temp dir; it can say where it is."""

    def __init__(self, run_id: str, index: int) -> None:
        super().__init__(_node_base(run_id), index)

    def where(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _kill_quietly(ray: Any, actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead (its node is gone): nothing to kill
        pass


def _node_base(run_id: str) -> str:
    """The run's directory on a node (each node's own temp dir; see _slot.Slot)."""
    return str(Path(tempfile.gettempdir()) / "resilient-train-ray" / run_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
