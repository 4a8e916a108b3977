"""Small file helpers shared by the store, the fence and the fault-injecting filesystem.

``write_create_only`` is the one create-only write on any fsspec filesystem (the fence's
generation claims, fenced manifest commits); ``create_or_confirm`` makes it idempotent
under retries. Why create-only is atomic where it is, and where it is not: fence.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
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


def write_create_only(fs: Any, path: str, data: bytes, *, local: bool) -> None:
    """Write ``data`` to ``path`` only if nothing is there; FileExistsError otherwise.

    Local disk: a temp file hard-linked to the name (``link`` fails atomically with
    EEXIST). Elsewhere: fsspec's ``mode="create"`` (S3: a PUT with ``If-None-Match: *``;
    GCS: an upload with ``ifGenerationMatch=0``; a 412 becomes FileExistsError). A backend that does not know the mode gets exists-then-put, which
    is not atomic (see the module docstring).
    """
    if local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
        return
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        raise
    except (TypeError, NotImplementedError):  # this backend has no exclusive create
        if fs.exists(path):
            raise FileExistsError(errno.EEXIST, "already exists", path) from None
        fs.pipe_file(path, data)
    except OSError as exc:
        if _precondition_failed(exc):
            raise FileExistsError(errno.EEXIST, "already exists", path) from None
        raise


def _precondition_failed(exc: BaseException) -> bool:
    """An S3 ``PreconditionFailed`` (HTTP 412), however the client wrapped it."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def create_or_confirm(fs: Any, path: str, data: bytes, *, local: bool) -> None:
    """Create-only, idempotent under retries: a retried PUT that finds OUR bytes succeeded."""
    try:
        write_create_only(fs, path, data, local=local)
    except FileExistsError:
        try:
            existing = fs.cat_file(path)
        except FileNotFoundError:
            existing = None
        if existing != data:
            raise
