"""Async checkpointing: snapshot into a twin object graph, persist on a background thread.

Why a twin: TensorFlow's own ``CheckpointOptions(enable_async=True)`` fails with Keras 3
optimizer variables (TF 2.21 / Keras 3.15 raise a ValueError when it copies them; see
benchmarks/results/checkpoint_overhead.json, ``errors``). So the runner keeps its own
copy of the saved state: at setup it builds a second model + optimizer from the recipe
(outside the strategy scope, plain CPU variables) plus twin epoch / step / RNG variables,
and a twin ``tf.train.Checkpoint`` with exactly the live one's structure (both graphs
built by runner/state/ckpt_layout.py ``training_graph``). The files the
twin writes therefore restore into the live graph (tests/runner/state/test_async_checkpoint.py
proves it key by key). Live and twin variables are paired by walking both object graphs
in parallel; setup refuses to continue if any name, shape or dtype differs.

# Implementation:
# save (training thread)                       persist (one background thread)
#   raise a stored background failure
#   wait for the in-flight persist (policy)
#   snapshot: one tf.function assigns every
#     twin variable from its live variable
#     (copy-on-write on CPU, D2H copy on GPU)
#   start the persist thread  ------------->   twin.write(staging): one compiled call
#   return (training continues)                weights_sha256 from the twin
#                                              faults before_commit, store.commit
#                                              (upload, hashes, MANIFEST.json last),
#                                              checkpoint_committed, after_commit, retain
#   next step: raise a stored failure  <-----  any exception is stored, never swallowed
#   flush(): join, then raise a stored failure
#
# A persist cannot block forever on a stalled store: every storage call of the commit has
# a no-progress deadline (--storage-timeout, checkpoint/deadline.py) and bounded retries,
# so a store that stays stalled ends the persist as ``checkpoint_failed`` (a
# StorageUnavailableError naming the call), re-raised here: exit 1, restart, resume.
#
# Policy when a save is due while the previous one is still persisting: WAIT. The
# training thread blocks until the in-flight commit is done (event ``checkpoint_waited``
# with the milliseconds lost), then snapshots. Waiting, not skipping, keeps the set of
# committed steps a pure function of the job (every agreed save step commits, in order),
# which the chaos tests and exact-resume guarantees rely on; the cost shows up as
# backpressure when persisting takes longer than K steps of training.
#
# At most one save is in flight, so the twin is never written while it is being read and
# commits happen in step order. The persist thread runs in a copy of the caller's
# contextvars, so its events carry the bound run_id / attempt / rank / role.
#
# Which workers take part: the twin holds plain local variables and the snapshot reads
# each live variable's local copy, which needs no collective. In async mode only the
# chief snapshots and persists; the other workers skip saving entirely (in sync mode they
# still write a private temp copy, see SyncCheckpointer). The exception is a model with
# sync-on-read variables, whose read in cross-replica context IS a collective: then every
# worker snapshots (at the same agreed step) and only the chief persists. And the memory
# tier (--snapshot-every, runner/state/memory_tier.py): every worker keeps a twin and also
# snapshots between saves without persisting; ``latest`` is its newest COMPLETE snapshot
# (set only after the assign returned), and ``rescue_hold`` lets a rescue read the twin
# from another thread while no snapshot writes it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import keras
import numpy as np
import tensorflow as tf

from resilient_train.runner.state.memory_tier import Snapshot
from resilient_train.runner.state.model_state import preserved_rng
from resilient_train.runner.health.anomaly_policy import check_finite_state
from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.checkpoint.manifest import FileEntry
from resilient_train.checkpoint.shares import SHARDED_EXTRA_KEY
from resilient_train.rundir.events import emit as _default_emit

__all__ = [
    "SaveRequest",
    "TwinState",
    "AsyncCheckpointer",
    "commit_checkpoint",
    "Checkpointer",
    "SyncCheckpointer",
    "BackgroundCheckpointer",
    "NoCheckpointer",
]



@dataclass(frozen=True)
class SaveRequest:
    """Everything a commit needs that is not in the checkpoint files, captured at save time."""

    global_step: int
    epoch: int
    step_in_epoch: int
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    blocked_ms: float | None = field(default=None, compare=False)  # async: training blocked to snapshot
    # Small files committed beside ckpt.* (name -> bytes), captured at save time with the
    # snapshot: the callbacks' state (runner/keras_recipes/callbacks.py), so it matches the step.
    files: dict[str, bytes] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("global_step", "epoch", "step_in_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Received {name}={value!r}; expected an int >= 0")


class _FileDigests:
    """The size and sha256 of each request file, computed once per bytes object.

    A mid-epoch save carries the newest tf.data iterator capture (runner/input/reentry.py)
    until the next one: the same ``bytes`` objects (~1.2 MB for digits_cnn's two workers)
    in every save in between. Hashing them again on every commit was a third of a small
    commit's CPU; identity (the memo keeps the object alive) says they are unchanged.
    Thread-safe: a rescue's commit may run beside the persist thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[bytes, FileEntry]] = {}

    def of(self, files: dict[str, bytes]) -> dict[str, FileEntry]:
        with self._lock:
            seen = {}
            for name, data in files.items():
                hit = self._seen.get(name)
                if hit is None or hit[0] is not data:
                    hit = (data, FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest()))
                seen[name] = hit
            self._seen = seen
            return {name: entry for name, (_, entry) in seen.items()}


_digests = _FileDigests()


def write_request_files(local_dir: Path, request: SaveRequest) -> dict[str, FileEntry]:
    """Put ``request.files`` into the directory about to be committed; returns their
    entries (``CheckpointStore.commit(known=...)``)."""
    for name, data in request.files.items():
        (Path(local_dir) / name).write_bytes(data)
    return _digests.of(request.files)


def commit_checkpoint(
    store: CheckpointStore,
    local_dir: Path,
    request: SaveRequest,
    *,
    run_id: str,
    world_size: int,
    weights_sha256: str,
    faults: Any,
    keep: int,
    emit: Callable[..., None] = _default_emit,
    known: dict[str, FileEntry] | None = None,
    shares: tuple[str, ...] = (),
    before_manifest: Callable[[], dict[str, FileEntry]] | None = None,
    share_copies: dict[str, Path] | None = None,
    persist_started: float | None = None,
) -> Manifest:
    """Upload ``local_dir`` and write the manifest (the commit), then apply retention.

    Shared by the sync and async paths so both commit exactly the same way. The fault
    points ``before_commit`` / ``after_commit`` fire in whichever thread commits.
    ``shares`` / ``before_manifest`` / ``share_copies``: a sharded save's chief (runner/state/sharded_save.py).
    ``persist_started``: ``time.perf_counter()`` when a background persist began (its local
    write), for the event's ``persist_s``.
    """
    step = request.global_step
    faults.hit("before_commit", step)
    started = time.perf_counter()
    manifest = store.commit(
        local_dir,
        run_id=run_id,
        epoch=request.epoch,
        step_in_epoch=request.step_in_epoch,
        global_step=step,
        world_size=world_size,
        weights_sha256=weights_sha256,
        tf_version=tf.__version__,
        extra=dict(request.extra),
        on_uploaded=lambda name: faults.hit("mid_upload", step),
        known=known,
        shares=shares,
        before_manifest=before_manifest,
        share_copies=share_copies,
    )
    emit(
        "checkpoint_committed",
        group=True,
        epoch=manifest.epoch,
        step_in_epoch=manifest.step_in_epoch,
        global_step=manifest.global_step,
        weights_sha256=manifest.weights_sha256,  # the trajectory outlives retention (commands/diff.py)
        path=f"{store.url}/{CheckpointStore.dir_name(step)}",
        size=manifest.total_size,
        commit_s=round(time.perf_counter() - started, 4),
        **({"persist_s": round(time.perf_counter() - persist_started, 4)} if persist_started is not None else {}),
        **({"blocked_ms": request.blocked_ms} if request.blocked_ms is not None else {}),
        **({"writers": len({*manifest.extra[SHARDED_EXTRA_KEY]["writers"].values()})}
           if SHARDED_EXTRA_KEY in manifest.extra else {}),
    )
    faults.hit("after_commit", step)
    store.retain(keep)
    return manifest


# --------------------------------------------------------------------------- twin


def _is_variable(obj: Any) -> bool:
    return isinstance(obj, (tf.Variable, keras.Variable))


def _tf_variable(obj: Any) -> Any:
    """The TensorFlow variable behind a Keras 3 variable (or the variable itself)."""
    return obj.value if isinstance(obj, keras.Variable) else obj


def _children(obj: Any) -> dict[str, Any]:
    return dict(tf.train.TrackableView(obj).children(obj))


def pair_variables(live_root: Any, twin_root: Any) -> list[tuple[str, Any, Any]]:
    """``(checkpoint path, live variable, twin variable)`` for every saved variable.

    Walks both object graphs the way tf.train.Checkpoint does (named trackable children)
    and raises ValueError at the first node whose children, shape or dtype differ.
    """
    pairs: list[tuple[str, Any, Any]] = []
    seen: dict[int, int] = {}

    def walk(live: Any, twin: Any, path: str) -> None:
        if id(live) in seen:
            if seen[id(live)] != id(twin):
                raise ValueError(f"twin checkpoint: {path} is shared differently in the twin graph")
            return
        seen[id(live)] = id(twin)
        if _is_variable(live) or _is_variable(twin):
            if not (_is_variable(live) and _is_variable(twin)):
                raise ValueError(f"twin checkpoint: {path} is a variable in only one of the graphs")
            live_v, twin_v = _tf_variable(live), _tf_variable(twin)
            if tuple(live_v.shape) != tuple(twin_v.shape) or live_v.dtype != twin_v.dtype:
                raise ValueError(
                    f"twin checkpoint: {path} is {live_v.dtype.name}{tuple(live_v.shape)} live but "
                    f"{twin_v.dtype.name}{tuple(twin_v.shape)} in the twin"
                )
            pairs.append((path or "/", live_v, twin_v))
            return
        live_children, twin_children = _children(live), _children(twin)
        if list(live_children) != list(twin_children):
            raise ValueError(
                f"twin checkpoint: {path or '/'} has children {sorted(live_children)} live but "
                f"{sorted(twin_children)} in the twin"
            )
        for name, child in live_children.items():
            walk(child, twin_children[name], f"{path}/{name}")

    walk(live_root, twin_root, "")
    if not pairs:
        raise ValueError("twin checkpoint: the live checkpoint holds no variables")
    return pairs


class _NamedValue:
    """A stand-in for a Keras variable in ``weights_digest``: live path, twin value."""

    def __init__(self, path: str, variable: Any) -> None:
        self.path = path
        self._variable = variable

    def numpy(self) -> np.ndarray:
        return self._variable.numpy()


class _DigestView:
    def __init__(self, weights: list[_NamedValue]) -> None:
        self.weights = weights


class TwinState:
    """The twin object graph, its checkpoint, and the snapshot that fills it.

    ``checkpoint``: the twin tf.train.Checkpoint (same keys as the live one).
    ``snapshot()``: copy every live variable into its twin (one tf.function call).
    ``digest_view``: an object with ``.weights`` (live paths, twin values) for
    ``weights_digest``, so a manifest's weights_sha256 describes the snapshot, not
    the live model that has trained on meanwhile.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, live_checkpoint: tf.train.Checkpoint,
                 weight_pairs: list[tuple[str, Any]]) -> None:
        self.checkpoint = checkpoint
        self.pairs = pair_variables(live_checkpoint, checkpoint)
        self.state_bytes = sum(int(np.prod(t.shape)) * t.dtype.size for _, _, t in self.pairs)
        self.digest_view = _DigestView([_NamedValue(path, _tf_variable(v)) for path, v in weight_pairs])
        self.sync_on_read = any(
            getattr(live, "synchronization", None) == tf.VariableSynchronization.ON_READ
            for _, live, _ in self.pairs
        )
        live_vars = [live for _, live, _ in self.pairs]
        twin_vars = [twin for _, _, twin in self.pairs]

        @tf.function(autograph=False)
        def snapshot() -> None:
            for live, twin in zip(live_vars, twin_vars):
                # Same device (CPU): the twin takes a reference to the live buffer and
                # TensorFlow's copy-on-write copies it when the next step updates the live
                # variable in place, so the memcpy lands in that step, not here. Across
                # devices (GPU live, CPU twin) this is the device-to-host copy. Either way
                # the twin never sees a later update (test_a_snapshot_does_not_change_...).
                twin.assign(live.read_value(), read_value=False)

        self._snapshot = snapshot
        # The twin's files are written by one compiled call: an eager
        # tf.train.Checkpoint.write re-walks the object graph and rebuilds its save ops on
        # every save (~10 ms of Python per save for a small model, on the persist thread,
        # holding the GIL the training thread needs). Pinned to the twin's device so the
        # object-graph record lands in the same shard as the variables: the files are
        # byte-identical to an eager write (tests/runner/state/test_async_checkpoint.py).
        device = twin_vars[0].device

        @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)  # nothing to convert
        def write(prefix: tf.Tensor) -> tf.Tensor:
            with tf.device(device):
                return checkpoint.write(prefix)

        self._write = write

    def snapshot(self) -> None:
        self._snapshot()

    def named_values(self) -> list[tuple[str, np.ndarray]]:
        """Every twin variable's value, by its checkpoint path (the commit's finiteness check)."""
        return [(path, twin.numpy()) for path, _, twin in self.pairs]

    def write(self, prefix: str) -> None:
        """Write the twin's state as a tf.train.Checkpoint at ``prefix`` (its directory exists)."""
        self._write(tf.constant(prefix))

    @classmethod
    def build(
        cls,
        live_checkpoint: tf.train.Checkpoint,
        live_model: keras.Model,
        build_twin: Callable[[], tuple[tf.train.Checkpoint, keras.Model]],
    ) -> "TwinState":
        """Build the twin (``build_twin`` returns its checkpoint and model) on the CPU,
        without moving any global RNG, and pair it with the live graph."""
        with preserved_rng(), tf.device("/cpu:0"):
            twin_checkpoint, twin_model = build_twin()
        live_weights, twin_weights = list(live_model.weights), list(twin_model.weights)
        if len(live_weights) != len(twin_weights):
            raise ValueError(
                f"twin checkpoint: the twin model has {len(twin_weights)} weights, the live one {len(live_weights)}"
            )
        return cls(twin_checkpoint, live_checkpoint, [(v.path, t) for v, t in zip(live_weights, twin_weights)])


# ------------------------------------------------------------------ async saver


class AsyncCheckpointer:
    """At most one background persist; failures surface on the training thread.

    ``persist(request)`` runs on the background thread and must only read the twin (it
    is handed the request captured at save time). ``blocked_s`` / ``waited_s`` record,
    per save, the time the caller was blocked snapshotting / waiting for the previous
    persist (the benchmark reads them). ``on_rescue()``: called when a rescue asks for the
    twin, before it waits for the in-flight persist (runner/state/sharded_save.py).
    """

    def __init__(
        self,
        twin: TwinState,
        persist: Callable[[SaveRequest], Manifest | None],
        *,
        emit: Callable[..., None] = _default_emit,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        on_rescue: Callable[[], None] = lambda: None,
    ) -> None:
        self.twin = twin
        self._persist = persist
        self._on_rescue = on_rescue  # a sharded save's chief stops waiting for a gone peer's share
        self._emit = emit
        self._clock = clock
        # One long-lived persist thread (not one per save): its allocator arena and
        # buffers are reused from save to save, which keeps peak host memory flat.
        self._thread: threading.Thread | None = None
        self._queue: queue.SimpleQueue[tuple[contextvars.Context, SaveRequest]] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._inflight: SaveRequest | None = None
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self.last_manifest: Manifest | None = None
        self.blocked_s: list[float] = []
        self.waited_s: list[float] = []
        # The memory tier (runner/state/memory_tier.py): the newest COMPLETE snapshot in the
        # twin, and the hand-over between the training thread (writes the twin) and a
        # rescue (reads it from another thread). ``_snapshotting``: the twin is being
        # written; ``_torn``: the last write never returned; ``_rescuing``: a rescue reads
        # the twin, so no snapshot may start.
        self.latest: Snapshot | None = None
        self._wall_clock = wall_clock
        self._guard = threading.Condition()
        self._snapshotting = False
        self._torn = False
        self._rescuing = False

    @property
    def in_flight(self) -> int | None:
        """The global step being persisted, or None."""
        return None if self._idle.is_set() or self._inflight is None else self._inflight.global_step

    def raise_if_failed(self) -> None:
        """Re-raise a background failure (once) on the caller's thread."""
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, Exception):
                error.add_note(f"(raised by the background persist of checkpoint step {self._error_step})")
            raise error

    def save(self, request: SaveRequest, *, persist: bool = True) -> None:
        """Snapshot now (blocking), persist in the background.

        ``persist=False`` only snapshots: a non-chief worker taking part in a
        collective snapshot (sync-on-read variables) without committing anything.
        """
        self.raise_if_failed()
        pending = self.in_flight
        waited = self._join()
        self.waited_s.append(waited)
        if pending is not None and waited > 0.0:
            self._emit("checkpoint_waited", global_step=request.global_step, in_flight_step=pending,
                       waited_ms=round(waited * 1000, 1))
        self.raise_if_failed()  # the one we waited for may have failed
        with self._guard:
            while self._rescuing:  # a rescue reads the twin (a peer died: this call fails soon)
                self._guard.wait()
            self._snapshotting, self._torn, self.latest = True, True, None
        start = self._clock()
        try:
            self.twin.snapshot()
        finally:
            with self._guard:
                self._snapshotting = False
                self._guard.notify_all()
        self.blocked_s.append(self._clock() - start)
        with self._guard:  # complete; and a rescue that takes the twin now sees the persist below
            self._torn = False
            self.latest = Snapshot(request, completed_at=self._wall_clock())
            if not persist:
                return
            request = dataclasses.replace(request, blocked_ms=round(self.blocked_s[-1] * 1000, 3))
            self._inflight = request
            if self._thread is None:
                # Daemon: a worker that dies of another error must not hang on an upload; an
                # interrupted upload is uncommitted (no manifest) and invisible to readers.
                self._thread = threading.Thread(target=self._serve, name="rt-checkpoint-persist", daemon=True)
                self._thread.start()
            self._idle.clear()
            self._queue.put((contextvars.copy_context(), request))

    @contextlib.contextmanager
    def rescue_hold(self, timeout_s: float) -> Iterator[tuple[Snapshot | None, str | None]]:
        """Hold the twin for a rescue: ``(newest complete snapshot or None, why it cannot be
        used or None)``. No snapshot starts until the block ends; a snapshot in progress
        and this worker's in-flight persist (it reads the twin, and may commit the same
        step) get up to ``timeout_s`` to finish first."""
        deadline = self._clock() + timeout_s
        self._on_rescue()
        with self._guard:
            self._rescuing = True
            while self._snapshotting and self._clock() < deadline:
                self._guard.wait(max(0.0, deadline - self._clock()))
            snapshotting = self._snapshotting
        try:
            if snapshotting or (self.latest is None and self._torn):
                yield None, "snapshot incomplete: one was being taken when the rescue was asked (never committed)"
            elif not self._idle.wait(max(0.0, deadline - self._clock())):
                yield None, f"this worker's persist of step {self.in_flight} was still running after {timeout_s:g} s"
            else:
                yield self.latest, None
        finally:
            with self._guard:
                self._rescuing = False
                self._guard.notify_all()

    def _serve(self) -> None:
        while True:
            context, request = self._queue.get()
            try:
                context.run(self._run, request)  # events carry the caller's bound context
            finally:
                self._idle.set()

    def _run(self, request: SaveRequest) -> None:
        try:
            manifest = self._persist(request)
            if manifest is not None:
                self.last_manifest = manifest
        except BaseException as exc:  # stored, re-raised on the training thread (never swallowed)
            self._error, self._error_step = exc, request.global_step
            self._emit("checkpoint_failed", global_step=request.global_step,
                       error=f"{type(exc).__name__}: {exc}")

    def _join(self) -> float:
        if self._idle.is_set():
            return 0.0
        start = self._clock()
        self._idle.wait()
        return self._clock() - start

    def drain(self, timeout_s: float) -> bool:
        """Give an in-flight persist up to ``timeout_s`` to commit; True if none is left.

        For a worker that is about to exit on an error: the snapshot being persisted is
        consistent, so committing it saves the steps since the last commit.
        """
        return self._idle.wait(timeout_s)

    def flush(self) -> Manifest | None:
        """Wait for the in-flight persist; raise its failure; return the last manifest."""
        self._join()
        self.raise_if_failed()
        return self.last_manifest


def persist_twin(
    twin: TwinState,
    request: SaveRequest,
    *,
    store: CheckpointStore,
    staging_root: Path,
    digest: Callable[[Any], str],
    run_id: str,
    world_size: int,
    faults: Any,
    keep: int,
    emit: Callable[..., None] = _default_emit,
    finite_only: bool = False,
) -> Manifest:
    """The background half of an async save: write the twin, hash it, commit it.
    ``finite_only`` (--on-anomaly stop): a twin holding a non-finite value is never committed
    (runner/health/anomaly_policy.py; the step's own check stops the run before such a save, this is
    the second guard)."""
    persist_started = time.perf_counter()
    if finite_only:
        check_finite_state(twin.named_values(), global_step=request.global_step)
    local_dir = Path(staging_root) / CheckpointStore.dir_name(request.global_step)
    shutil.rmtree(local_dir, ignore_errors=True)
    local_dir.mkdir(parents=True)
    try:
        twin.write(str(local_dir / "ckpt"))
        known = write_request_files(local_dir, request)
        return commit_checkpoint(
            store, local_dir, request, run_id=run_id, world_size=world_size,
            weights_sha256=digest(twin.digest_view), faults=faults, keep=keep, emit=emit, known=known,
            persist_started=persist_started,
        )
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)


# ------------------------------------------------------- the loop's one interface


class Checkpointer(Protocol):
    """HOW a worker saves; chosen once at setup (``Saving._make_checkpointer``, saving.py), so the
    training loop never asks which mode it is in. WHEN is runner/state/save_policy.py's."""

    def save(self, request: SaveRequest, *, flush: bool) -> Manifest | None:
        """Checkpoint the live state as ``request`` describes. ``flush``: return only once
        it is committed (the final and the preemption saves)."""

    def flush(self) -> Manifest | None:
        """Wait until everything saved so far is committed; raise a background failure."""

    def raise_if_failed(self) -> None:
        """Raise a failure of earlier work (called once per training call)."""

    def drain(self, timeout_s: float) -> None:
        """Before exiting on an error: give in-flight work up to ``timeout_s`` to commit."""


class SyncCheckpointer:
    """Every worker writes the tf.train.Checkpoint (variables may need collectives); the
    chief uploads and commits before returning, the others write to a private temp dir
    and delete it."""

    def __init__(self, checkpoint: tf.train.Checkpoint, *, weights_sha256: Callable[[], str],
                 store: CheckpointStore, staging_root: Path, is_chief: bool, rank: int,
                 run_id: str, world_size: int, faults: Any, keep: int) -> None:
        self._checkpoint = checkpoint
        self._weights_sha256 = weights_sha256
        self._store = store
        self._staging_root = Path(staging_root)
        self._is_chief = is_chief
        self._rank = rank
        self._commit = dict(run_id=run_id, world_size=world_size, faults=faults, keep=keep)

    def save(self, request: SaveRequest, *, flush: bool) -> Manifest | None:
        if self._is_chief:
            local_dir = self._staging_root / CheckpointStore.dir_name(request.global_step)
            shutil.rmtree(local_dir, ignore_errors=True)
            local_dir.mkdir(parents=True)
        else:
            local_dir = Path(tempfile.mkdtemp(prefix=f"rt-rank{self._rank}-"))
        try:
            self._checkpoint.write(str(local_dir / "ckpt"))
            if not self._is_chief:
                return None
            known = write_request_files(local_dir, request)
            return commit_checkpoint(self._store, local_dir, request, known=known,
                                     weights_sha256=self._weights_sha256(), **self._commit)
        finally:
            shutil.rmtree(local_dir, ignore_errors=True)

    def flush(self) -> Manifest | None:
        return None  # every save committed before it returned

    def raise_if_failed(self) -> None:
        return None

    def drain(self, timeout_s: float) -> None:
        return None


class BackgroundCheckpointer:
    """Async mode: snapshot into the twin now, persist on the background thread.

    ``persist=False`` on a non-chief worker that must take part in the snapshot
    (sync-on-read variables) but commits nothing.
    """

    def __init__(self, saver: AsyncCheckpointer, *, persist: bool) -> None:
        self.saver = saver
        self._persist = persist

    def save(self, request: SaveRequest, *, flush: bool) -> Manifest | None:
        self.saver.save(request, persist=self._persist)
        return self.saver.flush() if flush else None

    def flush(self) -> Manifest | None:
        return self.saver.flush()

    def raise_if_failed(self) -> None:
        self.saver.raise_if_failed()

    def drain(self, timeout_s: float) -> None:
        self.saver.drain(timeout_s)


class NoCheckpointer:
    """Async mode on a non-chief worker: the chief's twin holds everything, so this
    worker writes nothing (and takes no part in a save)."""

    def save(self, request: SaveRequest, *, flush: bool) -> Manifest | None:
        return None

    def flush(self) -> Manifest | None:
        return None

    def raise_if_failed(self) -> None:
        return None

    def drain(self, timeout_s: float) -> None:
        return None
