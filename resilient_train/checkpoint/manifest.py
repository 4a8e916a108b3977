"""MANIFEST.json: the commit record of one checkpoint, and the checksums it holds.

A checkpoint directory exists for readers only when its ``MANIFEST.json`` parses and
every file it lists is present with the recorded size (and, when verified, sha256).
This module owns that schema and refuses anything else: :meth:`Manifest.from_json`
raises :class:`~resilient_train.errors.CheckpointCorruptError` naming the manifest's
path and the first thing wrong, so a reader can report it and fall back to an older
checkpoint instead of crashing or, worse, restoring half a checkpoint.

The schema is versioned (``schema_version``); a reader refuses versions it does not
know rather than guessing. Paths in ``files`` are relative POSIX paths inside the
checkpoint directory; absolute paths, ``..`` and the manifest's own name are refused so
a manifest can never point outside its directory.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from resilient_train.checkpoint.deadline import progress
from resilient_train.errors import CheckpointCorruptError

__all__ = ["SCHEMA_VERSION", "MANIFEST_NAME", "INEXACT_EXTRA_KEY", "FileEntry", "Manifest", "inexact_resumes",
           "sha256_file", "sha256_stream", "now_utc"]

SCHEMA_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
# ``extra["inexact"]``: why this checkpoint's weights are not the ones an uninterrupted run
# would have at its step; one entry per inexact resume in its history (a restore's next
# checkpoints inherit the list): ``{"cause": "input_mismatch", "epoch": E (0-based),
# "checkpoint": "ckpt-..."}`` (runner/input/determinism.py). Absent: exact as far as the
# runner can tell. summary.json's ``exact``, the final console line and ``verify`` read it.
INEXACT_EXTRA_KEY = "inexact"
CHUNK_SIZE = 8 * 2**20  # one read/write unit when streaming files (bytes)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileEntry:
    """Size and sha256 (lowercase hex) of one checkpoint file."""

    size: int
    sha256: str

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"Received size={self.size!r}; expected an int >= 0")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ValueError(f"Received sha256={self.sha256!r}; expected 64 lowercase hex digits")


def _check_relpath(rel: Any) -> None:
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"Received file name {rel!r}; expected a non-empty relative path")
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"Received file name {rel!r}; expected a relative POSIX path inside the checkpoint")
    if rel == MANIFEST_NAME:
        raise ValueError(f"Received file name {rel!r}; that name is reserved for the manifest")


def _check_nonneg_int(name: str, value: Any, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"Received {name}={value!r}; expected an int >= {minimum}")


@dataclass(frozen=True)
class Manifest:
    """The commit record of one checkpoint (schema of ``MANIFEST.json``)."""

    schema_version: int
    run_id: str
    epoch: int
    step_in_epoch: int
    global_step: int
    world_size: int
    tf_version: str
    created_at: str
    files: dict[str, FileEntry] = field(hash=False)
    weights_sha256: str
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"Received schema_version={self.schema_version!r}; expected {SCHEMA_VERSION}"
            )
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"Received run_id={self.run_id!r}; expected a non-empty string")
        _check_nonneg_int("epoch", self.epoch)
        _check_nonneg_int("step_in_epoch", self.step_in_epoch)
        _check_nonneg_int("global_step", self.global_step)
        _check_nonneg_int("world_size", self.world_size, minimum=1)
        if not isinstance(self.tf_version, str):
            raise ValueError(f"Received tf_version={self.tf_version!r}; expected a string")
        _check_created_at(self.created_at)
        if not isinstance(self.files, dict) or not self.files:
            raise ValueError(f"Received files={self.files!r}; expected a non-empty dict")
        for rel, entry in self.files.items():
            _check_relpath(rel)
            if not isinstance(entry, FileEntry):
                raise ValueError(f"Received files[{rel!r}]={entry!r}; expected a FileEntry")
        if not isinstance(self.weights_sha256, str) or not _SHA256.match(self.weights_sha256):
            raise ValueError(
                f"Received weights_sha256={self.weights_sha256!r}; expected 64 lowercase hex digits"
            )
        if not isinstance(self.extra, dict):
            raise ValueError(f"Received extra={self.extra!r}; expected a dict")
        try:
            json.dumps(self.extra)
        except (TypeError, ValueError):
            raise ValueError(f"Received extra={self.extra!r}; expected JSON-serialisable values") from None

    @property
    def inexact(self) -> list[dict[str, Any]]:
        """The inexact resumes in this checkpoint's history (``extra["inexact"]``; [] when exact)."""
        return inexact_resumes(self.extra)

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        record = dataclasses.asdict(self)
        record["files"] = {rel: dataclasses.asdict(e) for rel, e in sorted(self.files.items())}
        return json.dumps(record, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, path: str) -> Manifest:
        """Parse and validate; any problem -> CheckpointCorruptError naming ``path``."""
        try:
            record = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointCorruptError(f"{path}: manifest is not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise CheckpointCorruptError(f"{path}: manifest is not a JSON object")
        version = record.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CheckpointCorruptError(
                f"{path}: unsupported schema_version {version!r} (this reader knows {SCHEMA_VERSION})"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(names - {"extra"} - record.keys())
        if missing:
            raise CheckpointCorruptError(f"{path}: manifest lacks field(s) {', '.join(missing)}")
        unknown = sorted(record.keys() - names)
        if unknown:
            raise CheckpointCorruptError(f"{path}: manifest has unknown field(s) {', '.join(unknown)}")
        try:
            files = record["files"]
            if not isinstance(files, dict):
                raise ValueError(f"Received files={files!r}; expected an object")
            record["files"] = {rel: _entry(rel, value) for rel, value in files.items()}
            return cls(**record)
        except (TypeError, ValueError) as exc:
            raise CheckpointCorruptError(f"{path}: invalid manifest: {exc}") from None


def inexact_resumes(extra: Any) -> list[dict[str, Any]]:
    """``extra["inexact"]``'s entries (objects only: anything else in it is not a record of ours)."""
    entries = extra.get(INEXACT_EXTRA_KEY) if isinstance(extra, dict) else None
    return [dict(entry) for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def _entry(rel: str, value: Any) -> FileEntry:
    if not isinstance(value, dict) or set(value) != {"size", "sha256"}:
        raise ValueError(f"Received files[{rel!r}]={value!r}; expected {{size, sha256}}")
    return FileEntry(size=value["size"], sha256=value["sha256"])


def _check_created_at(value: Any) -> None:
    try:
        parsed = _dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"Received created_at={value!r}; expected an ISO-8601 timestamp") from None
    if parsed.utcoffset() != _dt.timedelta(0):
        raise ValueError(f"Received created_at={value!r}; expected a UTC timestamp")


def now_utc() -> str:
    """The current time as the ISO-8601 UTC string stored in ``created_at``."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def sha256_stream(stream: BinaryIO) -> FileEntry:
    """Size and sha256 of everything left in ``stream``."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK_SIZE):
        digest.update(chunk)
        size += len(chunk)
        progress()  # a remote stream read under a storage deadline (checkpoint/deadline.py)
    return FileEntry(size=size, sha256=digest.hexdigest())


def sha256_file(path: Path) -> FileEntry:
    with open(path, "rb") as stream:
        return sha256_stream(stream)
