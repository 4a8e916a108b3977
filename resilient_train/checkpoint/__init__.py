"""Checkpoint storage: the commit protocol over any fsspec filesystem (no TensorFlow here).

Importing this package registers the fault-injecting ``faulty://`` filesystem with
fsspec, so worker processes of a chaos run can be pointed at it by URL alone.
"""

from __future__ import annotations

import fsspec

from resilient_train.checkpoint.faultfs import FaultyFileSystem
from resilient_train.checkpoint.manifest import FileEntry, Manifest
from resilient_train.checkpoint.options import parse_storage_options
from resilient_train.checkpoint.retry import RetryPolicy, is_transient
from resilient_train.checkpoint.store import CheckpointInfo, CheckpointStore, Status

fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)

__all__ = [
    "CheckpointStore",
    "Manifest",
    "FileEntry",
    "CheckpointInfo",
    "Status",
    "RetryPolicy",
    "is_transient",
    "parse_storage_options",
]
