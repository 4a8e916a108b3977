"""One run per checkpoint storage: ``<storage>/OWNER.json``, and each attempt's generation.

The run-dir lock (rundir_lock.py) stops two supervisors on one run dir. Two run dirs
pointed at one ``--storage`` (a copied command line, a new run dir for a requeued job)
would still interleave checkpoints of two runs, and "already completed" or a restore
could pick up the other run's weights. So the storage root records the run id that owns
it, written by the supervisor before any worker starts, create-only (the same
conditional writes as the generation files, checkpoint/fence.py), and a run with another
run id refuses to touch it unless told to (``--force-storage``: a ``storage_claimed``
event with the previous owner, then the generation fence keeps the old run's writers
out from the next attempt on).

Storage written before this file existed (no OWNER.json) is claimed silently.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from typing import Any, Callable

from resilient_train.rundir import events
from resilient_train.checkpoint import CheckpointStore
from resilient_train.errors import StorageOwnedError

__all__ = ["OWNER_NAME", "claim_storage", "generation_for"]

OWNER_NAME = "OWNER.json"


def claim_storage(
    store: CheckpointStore,
    *,
    run_id: str,
    run_dir: str,
    force: bool,
    emit: Callable[..., None] = events.emit,
    clock: Callable[[], str] | None = None,
) -> None:
    """Make ``run_id`` the owner of ``store``'s root, or raise StorageOwnedError.

    Idempotent for the owner itself (every re-run of the same run dir). A take-over
    (``force``) or a first claim emits ``storage_claimed``.
    """
    now = clock or (lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    record = {"run_id": run_id, "run_dir": run_dir, "host": socket.gethostname(), "claimed_at": now()}
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        store.write_record(OWNER_NAME, data, create_only=True)
    except FileExistsError:
        owner = _owner(store.read_record(OWNER_NAME))
        if owner.get("run_id") == run_id:
            return
        if not force:
            raise StorageOwnedError(_owned_message(store.url, owner, run_id)) from None
        store.write_record(OWNER_NAME, data, create_only=False)
        emit("storage_claimed", storage=store.url, previous_run_id=owner.get("run_id"),
             previous_run_dir=owner.get("run_dir"), forced=True)
        return
    emit("storage_claimed", storage=store.url, previous_run_id=None, previous_run_dir=None, forced=False)


def generation_for(store: CheckpointStore, attempt: int) -> int:
    """The generation the chief of ``attempt`` claims: the attempt number, or above every
    generation already in the storage (after a take-over, the previous run's numbers)."""
    newest = store.newest_generation()
    return max(attempt, (newest or 0) + 1)


def _owner(data: bytes | None) -> dict[str, Any]:
    try:
        owner = json.loads(data) if data is not None else {}
    except ValueError:
        owner = {}
    return owner if isinstance(owner, dict) else {}


def _owned_message(url: str, owner: dict[str, Any], run_id: str) -> str:
    where = f" (run dir {owner['run_dir']} on {owner.get('host', '?')})" if owner.get("run_dir") else ""
    return (
        f"checkpoint storage {url} belongs to run {owner.get('run_id', '<unreadable OWNER.json>')}{where}, "
        f"not to this run ({run_id}).\n"
        "Pass --force-storage to take it over (its checkpoints become this run's), or use another --storage."
    )
