"""Checkpoint storage: the commit protocol over any fsspec filesystem (no TensorFlow here).

The fault-injecting ``faulty://`` filesystem of chaos runs is not part of this package: it
lives in ``resilient_train.chaos.faultfs`` and reaches fsspec through the ``fsspec.specs``
entry point in pyproject.toml, so it is imported only when a ``faulty://`` URL is opened.
"""

from __future__ import annotations

from resilient_train.checkpoint.manifest import FileEntry, Manifest
from resilient_train.checkpoint.options import parse_storage_options
from resilient_train.checkpoint.retry import RetryPolicy, is_transient
from resilient_train.checkpoint.store import CheckpointInfo, CheckpointStore, Status

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
