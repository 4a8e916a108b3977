"""Sharded saves: which worker writes which tensors, the file names, and whether to shard.

Under MultiWorkerMirroredStrategy every worker holds the same state, so a checkpoint can
be written by all of them at once: the tensors are split into N shares balanced by bytes,
worker k uploads ``ckpt.data-0000k-of-0000N`` (the tensors of share k) and the chief
uploads share 0 with the index, then commits (the manifest last, as always). The result
is one standard TF checkpoint: ``tf.train.load_checkpoint`` and
``tf.train.Checkpoint.restore`` read it without this project.

This module is pure (no TensorFlow, no storage): the assignment, the names and the
choice, so each is decided once and tested alone. runner/state/sharded_save.py applies it
(TF's sharding callback and the persist), checkpoint/commit_path.py moves the files.

The assignment is deterministic: every worker computes it from the same (key, bytes)
list and gets the same shares (largest tensor first into the lightest share, ties by
key, then by share index), so no collective is needed to agree on it. ``pinned`` keys
(the object-graph proto, whose size is not known before it is serialized) go to share 0,
the chief's, which also writes the index.

A read-once restore (``plan_read_once``) reads the same record back: share k's data file is
downloaded by rank ``k % workers`` alone (so a checkpoint of N shares restores on any number
of workers), every other file (the index, the small files) by every rank, and each data file
reaches the other ranks over the group's collective (runner/state/read_once.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from resilient_train.checkpoint.manifest import FileEntry

__all__ = ["ReadOncePlan", "plan_read_once", "SHARD_AUTO_MIN_BYTES", "SHARDED_EXTRA_KEY", "SHARE_RECORD_PREFIX", "writer_of", "ShardedSaveChoice", "assign_shares",
           "choose_sharded_save", "data_file_name", "share_record_name", "share_record", "parse_share_record"]

PREFIX = "ckpt"
"""The checkpoint's prefix inside its directory: ``ckpt.index``, ``ckpt.data-...``."""

SHARD_AUTO_MIN_BYTES = 64 * 2**20
"""``--sharded-save auto`` shards a state of at least this many bytes: below it a share
uploads in well under a second on any store and the extra round (each worker's share
record, the chief's listing while it waits) costs more than it saves."""

SHARDED_EXTRA_KEY = "sharded_save"
"""The manifest's ``extra["sharded_save"]`` of a sharded save: ``{"shards": N, "writers":
{file: rank}, "shares": [{"writer": k, "file": ..., "tensors": count, "tensor_bytes": bytes}]}``
(written by runner/state/sharded_save.py; ``writer_of`` reads it)."""

SHARE_RECORD_PREFIX = "share-"
"""A worker's record of its uploaded share, beside the files in the checkpoint directory
(``share-00001.json``): its files' sizes and sha256. Written after the files, so the chief
reads it as "this share is complete"; not a checkpoint file (the manifest does not list it)."""


def writer_of(extra: Mapping[str, object], rel: str) -> int | None:
    """The rank that uploaded ``rel`` of a sharded save (its manifest's ``extra``); None when
    the checkpoint is not sharded or ``rel`` was the chief's like any other file."""
    sharded = extra.get(SHARDED_EXTRA_KEY)
    writers = sharded.get("writers") if isinstance(sharded, dict) else None
    writer = writers.get(rel) if isinstance(writers, dict) else None
    return writer if isinstance(writer, int) and not isinstance(writer, bool) else None


def data_file_name(prefix: str, shard: int, shards: int) -> str:
    """TensorFlow's name of a checkpoint's data file: ``ckpt.data-00001-of-00002``."""
    if not 0 <= shard < shards:
        raise ValueError(f"Received shard={shard} of shards={shards}; expected 0 <= shard < shards")
    return f"{prefix}.data-{shard:05d}-of-{shards:05d}"


def share_record_name(rank: int) -> str:
    return f"{SHARE_RECORD_PREFIX}{rank:05d}.json"


def share_record(rank: int, files: Mapping[str, FileEntry], *, generation: int | None) -> bytes:
    """The record a worker writes after uploading its share; ``generation``: its store's
    fence (None: unfenced), so a record left by an earlier attempt's save is never taken."""
    return json.dumps({"rank": rank, "generation": generation,
                       "files": {rel: {"size": e.size, "sha256": e.sha256} for rel, e in sorted(files.items())}},
                      sort_keys=True).encode()


def parse_share_record(data: bytes, *, where: str) -> tuple[int, int | None, dict[str, FileEntry]]:
    """``(rank, generation, {file: entry})`` of a share record; ValueError naming ``where``
    when it is not one."""
    try:
        record = json.loads(data)
        files = {rel: FileEntry(size=e["size"], sha256=e["sha256"]) for rel, e in record["files"].items()}
        rank, generation = record["rank"], record["generation"]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{where}: not a share record ({exc})") from None
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"{where}: not a share record (rank={rank!r})")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise ValueError(f"{where}: not a share record (generation={generation!r})")
    return rank, generation, files


def assign_shares(sizes: Sequence[tuple[str, int]], shares: int, *,
                  pinned: Sequence[str] = ()) -> tuple[tuple[str, ...], ...]:
    """Split the keys of ``sizes`` (key, bytes) into ``shares`` lists balanced by bytes.

    Greedy, largest first, into the lightest share (ties: the lower share index), keys
    ordered by (-bytes, key): deterministic. ``pinned`` keys go to share 0 (their bytes,
    if listed, count there). Each share's keys keep the order of ``sizes``. Raises
    ValueError when a share would be empty (fewer tensors than shares).
    """
    if isinstance(shares, bool) or not isinstance(shares, int) or shares < 1:
        raise ValueError(f"Received shares={shares!r}; expected an int >= 1")
    keys = [key for key, _ in sizes]
    if len(set(keys)) != len(keys):
        raise ValueError("Received duplicate keys in sizes; expected each checkpoint key once")
    owner: dict[str, int] = {}
    load = [0] * shares
    by_key = dict(sizes)
    for key in pinned:
        if key in by_key:
            owner[key] = 0
            load[0] += by_key[key]
    for key, size in sorted(((k, s) for k, s in sizes if k not in owner), key=lambda item: (-item[1], item[0])):
        if size < 0:
            raise ValueError(f"Received size {size} for {key!r}; expected bytes >= 0")
        lightest = min(range(shares), key=lambda index: (load[index], index))
        owner[key] = lightest
        load[lightest] += size
    result = tuple(tuple(key for key in keys if owner[key] == index) for index in range(shares))
    empty = [index for index, share in enumerate(result) if not share]
    if empty:
        raise ValueError(f"Received {len(keys)} tensors for {shares} shares; share {empty[0]} would be empty")
    return result


@dataclass(frozen=True)
class ShardedSaveChoice:
    """What ``--sharded-save`` resolved to for one attempt (the ``sharded_save`` event)."""

    setting: str
    sharded: bool
    shards: int
    state_bytes: int
    reason: str

    def __post_init__(self) -> None:
        if self.sharded != (self.shards > 1):
            raise ValueError(f"Received sharded={self.sharded} with shards={self.shards}; expected shards > 1 "
                             "exactly when sharded")


def choose_sharded_save(setting: str, *, state_bytes: int, num_workers: int, tensors: int,
                        async_twin: bool, min_bytes: int = SHARD_AUTO_MIN_BYTES) -> ShardedSaveChoice:
    """Resolve ``setting`` (auto/on/off) for a state of ``state_bytes`` in ``tensors``
    tensors on ``num_workers`` workers; ``async_twin``: the async checkpointer's twin holds
    the replicated state (async mode under MultiWorkerMirroredStrategy)."""
    def off(reason: str) -> ShardedSaveChoice:
        return ShardedSaveChoice(setting, False, 1, state_bytes, reason)

    if setting not in ("auto", "on", "off"):
        raise ValueError(f"Received setting={setting!r}; expected 'auto', 'on' or 'off'")
    if setting == "off":
        return off("--sharded-save off")
    if not async_twin:
        return off("the shares are written from the async checkpointer's twin (sync checkpoints have none)")
    if num_workers < 2:
        return off("one worker: nothing to split")
    if tensors < num_workers:
        return off(f"{tensors} tensors cannot fill {num_workers} shares")
    if setting == "auto" and state_bytes < min_bytes:
        return off(f"state of {state_bytes} bytes < {min_bytes} (auto's threshold): the chief alone is faster")
    return ShardedSaveChoice(setting, True, num_workers, state_bytes,
                             "--sharded-save on" if setting == "on" else f"state of {state_bytes} bytes >= {min_bytes}")


@dataclass(frozen=True)
class ReadOncePlan:
    """Who reads which data file of a sharded checkpoint from the store.

    ``owners``: every data file (share order) and the rank that downloads it; ``common``:
    the files every rank downloads (the index, the small files)."""

    owners: tuple[tuple[str, int], ...]
    common: tuple[str, ...]

    def others(self, rank: int) -> frozenset[str]:
        """The data files ``rank`` does not download (its peers send them)."""
        return frozenset(name for name, owner in self.owners if owner != rank)

    def store_bytes(self, sizes: Mapping[str, int], rank: int) -> int:
        """The bytes ``rank`` downloads: the common files and its own data files."""
        return sum(size for name, size in sizes.items() if name not in self.others(rank))


def plan_read_once(extra: Mapping[str, object], files: Mapping[str, int], *,
                   workers: int) -> tuple[ReadOncePlan | None, str]:
    """``(plan, reason)`` for a checkpoint's manifest ``extra`` and ``files`` ({name: size})
    restored by ``workers`` ranks; ``plan`` None: every rank reads the whole checkpoint, as
    before read-once, for ``reason``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Received workers={workers!r}; expected an int >= 1")
    sharded = extra.get(SHARDED_EXTRA_KEY)
    if not isinstance(sharded, dict):
        return None, "not a sharded checkpoint"
    if workers < 2:
        return None, "one worker: nothing to share"
    shards = sharded.get("shards")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 2:
        return None, f"the manifest's {SHARDED_EXTRA_KEY} record names shards={shards!r}"
    data = [data_file_name(PREFIX, k, shards) for k in range(shards)]
    missing = [name for name in data if name not in files]
    if missing:
        return None, f"the manifest lists no {missing[0]}"
    owners = tuple((name, k % workers) for k, name in enumerate(data))
    return ReadOncePlan(owners=owners, common=tuple(sorted(set(files) - set(data)))), \
        f"{shards} shares read once by {min(shards, workers)} of {workers} workers"
