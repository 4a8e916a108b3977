"""Sharded saves: every worker writes its share of a checkpoint; the chief commits last.

Under MultiWorkerMirroredStrategy every worker's async twin holds the same state, so the
upload of a checkpoint, the slow part on an object store, can be split: worker k uploads
the data file of share k and the chief (k = 0) uploads share 0, the index and the small
files, waits until every share is recorded in the store, and writes the manifest last.
The result is one standard TF checkpoint (``ckpt.index`` + ``ckpt.data-0000k-of-0000N``):
``tf.train.load_checkpoint`` and ``tf.train.Checkpoint.restore`` read it as they read
any other, as do fetch, the host cache and ``verify``; a restart reads it once (read_once.py).

How the files come for free: TensorFlow's own ``CheckpointOptions(
experimental_sharding_callback=...)`` (TF >= 2.15) writes one checkpoint in several data
files, each shard saved by its own SaveV2 and the index merged by MergeV2Checkpoints, the
TF1 sharded saver's format. ``BalancedShares`` is that callback: it splits the tensors
into N shares balanced by bytes (checkpoint/shares.py's ``assign_shares``, deterministic),
the object-graph proto in the chief's share. Every worker writes the WHOLE checkpoint to
its local staging directory that way (a local write, at disk speed) and uploads only its
own data file. So the chief holds every share's bytes too: it hashes the others' data
files beside its own upload, and ``wait_for_shares`` replaces a share recorded with another
sha256 by the chief's copy (the replicas' states differ: the checkpoint is the chief's).

How the shares agree on "done" without a collective: the save step is agreed already
(every worker saves the same step), and each worker's persist thread, after its upload,
writes a share record (``share-0000k.json``, its files' sizes and sha256, its fence's
generation) beside the files. The chief's persist lists the directory until every
record of its generation is there (``CommitPath.wait_for_shares``), then commits. No
collective runs on a persist thread (a collective there would race the training
thread's). Torn-proof as before: without the manifest the directory does not exist for
readers, whoever died; fenced as before: every writer's uploads and records are checked
against the generation (non-chief workers adopt the chief's, worker_main.py).

Refused here: a rescue's commit (the memory tier) writes the whole twin chief-style
(persist_twin): a rescue runs when a peer is gone. Read-once restore (each worker reads
its share and the group completes the state over the collective) is runner/state/read_once.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import tensorflow as tf

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.checkpoint.manifest import FileEntry, sha256_file
from resilient_train.checkpoint.shares import (
    PREFIX,
    SHARDED_EXTRA_KEY,
    ShardedSaveChoice,
    assign_shares,
    choose_sharded_save,
    data_file_name,
)
from resilient_train.rundir.events import emit as _default_emit
from resilient_train.runner.health.anomaly_policy import check_finite_state
from resilient_train.runner.state.checkpointing import (
    SaveRequest,
    TwinState,
    commit_checkpoint,
    write_request_files,
)

__all__ = ["BalancedShares", "ShardedWriter", "ShareContext", "choose", "persist_share"]


_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # TF's key of the object-graph proto (trackable.base)


def _tensor_bytes(shape: Any, dtype: tf.DType) -> int:
    """A tensor's bytes in the data file; 0 for strings and unknown shapes (pinned to share 0)."""
    if dtype == tf.string or shape is None or shape.num_elements() is None:
        return 0
    return int(shape.num_elements()) * dtype.size


class BalancedShares(tf.train.experimental.ShardingCallback):
    """TF's sharding callback: ``shares`` shards balanced by bytes, the object graph (and
    any string tensor) in shard 0. ``plan`` is what the last call decided: per share, its
    keys and tensor bytes (traced once: the twin's write is one compiled function)."""

    def __init__(self, shares: int) -> None:
        self.shares = shares
        self.plan: tuple[tuple[tuple[str, ...], int], ...] = ()

    @property
    def description(self) -> str:
        return f"resilient-train: {self.shares} shares balanced by bytes (one writer each)"

    def __call__(self, shardable_tensors: Sequence[Any]) -> Sequence[Any]:
        by_key: dict[str, dict[Any, Any]] = {}
        sizes: dict[str, int] = {}
        pinned: list[str] = []
        for tensor in shardable_tensors:
            key = tensor.checkpoint_key
            by_key.setdefault(key, {})[tensor.slice_spec] = tensor.tensor
            size = _tensor_bytes(tensor.shape, tensor.dtype)
            sizes[key] = sizes.get(key, 0) + size
            if key == _OBJECT_GRAPH_KEY or tensor.dtype == tf.string:
                pinned.append(key)
        keys = assign_shares(list(sizes.items()), self.shares, pinned=pinned)
        self.plan = tuple((share, sum(sizes[key] for key in share)) for share in keys)
        return [{key: by_key[key] for key in share} for share in keys]


class ShardedWriter:
    """Writes a twin's state as one checkpoint in ``shares`` data files (one compiled call)."""

    def __init__(self, twin: TwinState, shares: int) -> None:
        self.shares = shares
        self.callback = BalancedShares(shares)
        options = tf.train.CheckpointOptions(experimental_sharding_callback=self.callback)
        checkpoint = twin.checkpoint
        device = twin.pairs[0][2].device  # the object graph beside the variables, as TwinState.write

        @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
        def write(prefix: tf.Tensor) -> tf.Tensor:
            with tf.device(device):
                return checkpoint.write(prefix, options=options)

        self._write = write

    def write(self, prefix: str) -> None:
        self._write(tf.constant(prefix))

    def extra(self) -> dict[str, Any]:
        """The manifest's ``extra["sharded_save"]`` for a checkpoint this writer wrote."""
        files = [data_file_name(PREFIX, k, self.shares) for k in range(self.shares)]
        return {
            "shards": self.shares,
            "writers": {name: k for k, name in enumerate(files)},
            "shares": [{"writer": k, "file": files[k], "tensors": len(keys), "tensor_bytes": size}
                       for k, (keys, size) in enumerate(self.callback.plan)],
        }


def choose(setting: str, twin: TwinState | None, *, num_workers: int) -> ShardedSaveChoice:
    """``--sharded-save`` for this attempt (``twin`` None: no async twin, e.g. sync mode)."""
    state_bytes = 0 if twin is None else twin.state_bytes
    return choose_sharded_save(setting, state_bytes=state_bytes, num_workers=num_workers,
                               tensors=0 if twin is None else len(twin.pairs), async_twin=twin is not None)


@dataclass(frozen=True)
class ShareContext:
    """What a sharded persist needs besides the twin and the request."""

    store: CheckpointStore
    staging_root: Path
    rank: int
    digest: Callable[[Any], str]
    run_id: str
    world_size: int
    faults: Any
    keep: int
    wait_timeout_s: float
    finite_only: bool = False
    # Set when a rescue asks for the twin (a peer is gone): the chief stops waiting for shares
    # that may never come, so its rescue can commit the snapshot instead (AsyncCheckpointer.on_rescue).
    rescue_asked: threading.Event = field(default_factory=threading.Event)


def persist_share(writer: ShardedWriter, twin: TwinState, request: SaveRequest, context: ShareContext, *,
                  emit: Callable[..., None] = _default_emit) -> Manifest | None:
    """The background half of a sharded async save on one worker (its persist thread).

    Every worker writes the whole sharded checkpoint locally; worker k > 0 uploads its
    data file and its share record (returns None), the chief uploads the rest, waits for
    every share with the bytes it holds itself, and commits (returns the manifest).
    """
    step, persist_started = request.global_step, time.perf_counter()
    if context.finite_only and context.rank == 0:
        check_finite_state(twin.named_values(), global_step=step)
    local_dir = Path(context.staging_root) / CheckpointStore.dir_name(step)
    aside = local_dir.with_name(local_dir.name + ".shares")
    for leftover in (local_dir, aside):
        shutil.rmtree(leftover, ignore_errors=True)
    local_dir.mkdir(parents=True)
    try:
        writer.write(str(local_dir / PREFIX))
        data = {k: local_dir / data_file_name(PREFIX, k, writer.shares) for k in range(writer.shares)}
        if context.rank != 0:
            mine = data[context.rank]
            started = time.perf_counter()
            entries = context.store.upload_share({mine.name: mine}, global_step=step, rank=context.rank,
                                                 on_uploaded=lambda name: context.faults.hit("mid_upload", step))
            emit("checkpoint_share_uploaded", global_step=step, shard=context.rank, file=mine.name,
                 size=entries[mine.name].size, upload_s=round(time.perf_counter() - started, 4),
                 persist_s=round(time.perf_counter() - persist_started, 4))
            return None
        # The other shares' copies move out of the directory the chief uploads (their owners
        # upload them) and are hashed beside the chief's own upload: the manifest takes these
        # hashes, which every owner's record must match; the host cache takes the copies.
        aside.mkdir(parents=True)
        copies = {data[k].name: data[k].rename(aside / data[k].name) for k in range(1, writer.shares)}
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rt-share-hash") as hashing:
            hashed = hashing.submit(lambda: {k: {copies[data[k].name].name: sha256_file(copies[data[k].name])}
                                             for k in range(1, writer.shares)})

            def await_shares() -> dict[str, FileEntry]:
                return context.store.wait_for_shares(
                    step, hashed.result(), copies=copies, timeout_s=context.wait_timeout_s,
                    give_up=lambda: "a rescue was asked (a peer is gone)" if context.rescue_asked.is_set() else None)

            known = write_request_files(local_dir, request)
            sharded_request = dataclasses.replace(request, extra={**request.extra, SHARDED_EXTRA_KEY: writer.extra()})
            return commit_checkpoint(
                context.store, local_dir, sharded_request, run_id=context.run_id, world_size=context.world_size,
                weights_sha256=context.digest(twin.digest_view), faults=context.faults, keep=context.keep,
                emit=emit, known=known, shares=tuple(sorted(copies)), before_manifest=await_shares,
                share_copies=copies, persist_started=persist_started,
            )
    finally:
        for done in (local_dir, aside):
            shutil.rmtree(done, ignore_errors=True)
