"""A worker's own temp dir, under the run dir's ``local/``, gone when the worker ends.

Why: TensorFlow's autograph writes every converted function as a
``__autograph_generated_file*.py`` into the system temp dir and deletes them in an
``atexit`` handler. A worker leaves by ``os._exit`` (runner/process/bootstrap.py ``exit_process``:
TensorFlow's own teardown costs seconds), so that handler never runs: one run of the test
suite left 3,364 such files in ``/tmp``, and a long-lived machine gathers more with every
attempt. So each worker points Python's ``tempfile`` (and ``TMPDIR``, for anything it
starts) at ``local/rank-<rank>/tmp`` and removes that directory right before it exits.

A worker killed with ``kill -9`` cannot clean up; its directory stays inside the run dir
(never in the system temp dir) and the next worker of that rank on this host empties it
before using it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["use_private_tempdir", "remove_private_tempdir"]

_current: Path | None = None


def use_private_tempdir(path: Path) -> Path:
    """Make ``path`` (emptied first) this process's temp dir; returns it."""
    global _current
    shutil.rmtree(path, ignore_errors=True)  # a killed predecessor's leftovers
    path.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(path)
    os.environ["TMPDIR"] = str(path)
    _current = path
    return path


def remove_private_tempdir() -> None:
    """Remove the temp dir :func:`use_private_tempdir` set (if any); never raises."""
    global _current
    if _current is not None:
        shutil.rmtree(_current, ignore_errors=True)
        _current = None
