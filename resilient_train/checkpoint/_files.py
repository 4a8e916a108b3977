"""Small file-object helpers shared by the store and the fault-injecting filesystem."""

from __future__ import annotations

import contextlib
from typing import Any

from fsspec.spec import AbstractBufferedFile


def abandon_write(dst: Any) -> None:
    """Give up on a file opened for writing after an error, without publishing it.

    Buffered object-store files (S3, GCS) would upload their buffer on close() or on
    garbage collection; discarding and marking them closed aborts the multipart upload
    instead. A partial object would be harmless anyway (no manifest names it), but an
    upload that failed should not go on to spend bandwidth.
    """
    with contextlib.suppress(Exception):
        dst.discard()
    if isinstance(dst, AbstractBufferedFile):
        dst.closed = True
    else:
        with contextlib.suppress(Exception):
            dst.close()
