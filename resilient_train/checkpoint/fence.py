"""Generation fencing: a chief of a superseded attempt can no longer commit, overwrite or delete.

Across machines the supervisor cannot know that a worker of an older attempt is dead: a
partitioned or frozen (SIGSTOP, a VM paused by its hypervisor) chief may wake up after a
newer attempt restored and committed, and go on uploading into the same storage. Killing
it is not enough (the kill may not reach it), so the storage itself says who may write.

# Implementation:
#   <storage>/generations/gen-<g>.json    one file per claimed generation, never rewritten
#
#   claim     the chief of each attempt creates gen-<g>.json CREATE-ONLY (local disk:
#             a hard link of a temp file, which fails if the name exists; S3: a PUT with
#             ``If-None-Match: *`` through s3fs ``pipe_file(..., mode="create")``, answered
#             412 when the object exists; GCS: gcsfs ``mode="create"``, an upload with
#             ``ifGenerationMatch=0``, also 412; memory://: fsspec's exclusive create). g is
#             handed down by the supervisor (RT_GENERATION: the attempt number, or above
#             every generation already in the storage after a --force-storage take-over);
#             a worker started by another launcher without it claims the next free one.
#             A claim that finds a higher generation already there is fenced at once.
#   check     before each file upload, before the manifest PUT (the commit) and before
#             each deletion (retention, garbage collection, re-commit of a step) the store
#             lists generations/ ONCE; if any generation above the writer's own exists, it
#             emits ``stale_writer_fenced`` and raises StaleWriterError. The worker exits
#             EXIT_FATAL (3): a fenced writer must not be restarted into the same storage.
#
# What remains: check-then-write is not atomic on a plain object store. A writer that
# passes the check and is frozen before its very next request can still perform that ONE
# request after waking up: one file upload (which can only land in a directory whose
# manifest does not list it yet, or overwrite a file the newer attempt wrote for the same
# step; readers hash every file against the manifest, so such a file reads as corrupt and
# restore falls back, never silently) or one deletion. The commit itself is closed where
# the backend has conditional writes: the store creates MANIFEST.json create-only, so a
# stale manifest PUT cannot replace a manifest the newer attempt committed, and each
# manifest records the ``generation`` that wrote it. Backends without conditional writes
# (some S3 clones, gcsfs older than its ``mode="create"``) fall back to "exists? then put",
# which is the window above, not a guarantee. The contract tests check that S3 (SeaweedFS),
# GCS (fake-gcs-server) and local disk never take that fallback.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import re
import socket
from dataclasses import asdict, dataclass
from typing import Any, Callable

from resilient_train.checkpoint._files import create_or_confirm
from resilient_train.errors import StaleWriterError

__all__ = ["GENERATIONS_DIR", "GenerationRecord", "GenerationFence", "claim_generation"]

GENERATIONS_DIR = "generations"
_GEN_RE = re.compile(r"^gen-(\d+)\.json$")
_CLAIM_TRIES = 8  # only without a given generation: racing claimers each re-list and retry

Call = Callable[[str, str, Callable[[], Any]], Any]  # (op, path relative to the root, fn) -> fn()


@dataclass(frozen=True)
class GenerationRecord:
    """The content of ``gen-<g>.json``: who claimed generation g, for messages and audits."""

    generation: int
    run_id: str
    attempt: int
    pid: int
    host: str
    claimed_at: str

    def __post_init__(self) -> None:
        if isinstance(self.generation, bool) or not isinstance(self.generation, int) or self.generation < 1:
            raise ValueError(f"Received generation={self.generation!r}; expected an int >= 1")

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @staticmethod
    def file_name(generation: int) -> str:
        return f"gen-{generation}.json"


class GenerationFence:
    """The writer's own generation and the one check the commit path runs before each write."""

    def __init__(self, fs: Any, root: str, url: str, record: GenerationRecord, *,
                 call: Call, emit: Callable[..., None]) -> None:
        self._fs = fs
        self._dir = posixpath.join(root, GENERATIONS_DIR)
        self._url = url
        self.record = record
        self._call = call
        self._emit = emit

    @property
    def generation(self) -> int:
        return self.record.generation

    def newest(self) -> int | None:
        """The highest generation claimed in the storage (one listing), None when none is."""
        return newest_generation(self._fs, self._dir, self._call)

    def check(self, op: str, path: str) -> None:
        """Raise StaleWriterError (after ``stale_writer_fenced``) when a newer generation exists."""
        newest = self.newest()
        if newest is not None and newest > self.generation:
            raise fenced(self._emit, self.record, newest, op=op, path=path)


def newest_generation(fs: Any, gen_dir: str, call: Call) -> int | None:
    fs.invalidate_cache(gen_dir)  # another process claims; a cached listing would hide it
    try:
        names = call("list", GENERATIONS_DIR, lambda: fs.ls(gen_dir, detail=False))
    except FileNotFoundError:
        return None
    numbers = [int(m.group(1)) for m in (_GEN_RE.match(posixpath.basename(n.rstrip("/"))) for n in names) if m]
    return max(numbers, default=None)


def fenced(emit: Callable[..., None], record: GenerationRecord, newest: int, *, op: str, path: str) -> StaleWriterError:
    emit("stale_writer_fenced", generation=record.generation, newer_generation=newest, op=op, path=path)
    return StaleWriterError(
        f"generation {record.generation} (attempt {record.attempt}, run {record.run_id}) was superseded by "
        f"generation {newest} in the storage; refusing to {op} {path}"
    )


def claim_generation(
    fs: Any,
    root: str,
    url: str,
    *,
    generation: int | None,
    run_id: str,
    attempt: int,
    call: Call,
    emit: Callable[..., None],
    local: bool,
    clock: Callable[[], str] | None = None,
) -> GenerationFence:
    """Create ``generations/gen-<g>.json`` create-only and return the writer's fence.

    ``generation`` None: the next free generation above the newest (racing claimers
    re-list and retry). StaleWriterError when a newer generation is already claimed, or
    when ``generation`` was given and someone else holds it.
    """
    gen_dir = posixpath.join(root, GENERATIONS_DIR)
    now = clock or (lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    for _ in range(_CLAIM_TRIES):
        newest = newest_generation(fs, gen_dir, call)
        number = generation if generation is not None else (newest or 0) + 1
        record = GenerationRecord(number, run_id, attempt, os.getpid(), socket.gethostname(), now())
        if newest is not None and newest > number:
            raise fenced(emit, record, newest, op="claim generation in", path=url)
        rel = posixpath.join(GENERATIONS_DIR, GenerationRecord.file_name(number))
        path = posixpath.join(root, rel)
        data = record.to_json()
        try:
            call("write", rel, lambda: create_or_confirm(fs, path, data, local=local))
        except FileExistsError:
            if generation is None:
                continue  # another claimer took it first: go above it
            holder = _read_record(fs, path)
            raise StaleWriterError(
                f"generation {number} in {url} is already claimed by {holder}; "
                "two writers were started for one attempt"
            ) from None
        emit("generation_claimed", generation=number, attempt=attempt, path=posixpath.join(url, rel))
        return GenerationFence(fs, root, url, record, call=call, emit=emit)
    raise StaleWriterError(f"could not claim a generation in {url}: {_CLAIM_TRIES} concurrent claims won first")


def _read_record(fs: Any, path: str) -> str:
    try:
        holder = json.loads(fs.cat_file(path))
        return f"run {holder['run_id']} attempt {holder['attempt']} (pid {holder['pid']} on {holder['host']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unreadable record"
