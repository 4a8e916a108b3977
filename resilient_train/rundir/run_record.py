"""``run.json``: the run id, created by the first supervisor of a run dir and kept after.

Every attempt, every re-run of the same run dir and every event carry this id, and the
storage owner record (supervisor/ownership.py) names it. The file is written atomically
(rundir/atomic.py), so a supervisor killed mid-write leaves the old record or none; an
unreadable record is replaced by a new id (the run dir then starts a new run identity,
which is what the old file's loss means anyway).
"""

from __future__ import annotations

import json
import uuid
from typing import Callable

from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.layout import RunDir

__all__ = ["load_or_create_run_id", "new_run_id"]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def load_or_create_run_id(run_dir: RunDir, *, recipe: str, new_id: Callable[[], str] = new_run_id) -> str:
    """The run id in ``run_dir.run_file``; a new one (written there) if it has none."""
    path = run_dir.run_file
    if path.exists():
        try:
            return json.loads(path.read_text())["run_id"]
        except (ValueError, KeyError):
            pass
    run_id = new_id()
    write_atomic(path, json.dumps({"run_id": run_id, "recipe": recipe}) + "\n")
    return run_id
