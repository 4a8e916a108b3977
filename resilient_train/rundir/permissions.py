"""Who may read a run dir: private (0700 directories, 0600 files) unless the user says otherwise.

A run dir holds worker logs, tracebacks, the job and, with local storage, the checkpoints:
on a shared training host none of it is other users' business. Rather than chmod every
file after the fact (a race, and a hundred writers), the supervisor narrows the process
*umask* before it creates anything (:func:`run_dir_umask`); every file and directory the
supervisor, its workers and their libraries create inherits it (a umask survives fork and
exec). ``--run-dir-mode 0750`` opens the run to a team's group; a user's umask that is
already stricter than the mode asks for is kept (the umask is only ever widened in what it
masks, never narrowed).

What it refuses: a mode that does not give the owner ``rwx`` (the supervisor could not
use its own run dir), or anything outside ``0..0777``. Files and directories that existed
before the run keep their modes; this module never chmods.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Iterator

__all__ = ["DEFAULT_RUN_DIR_MODE", "parse_mode", "umask_for", "run_dir_umask", "current_umask", "directory_mode"]

DEFAULT_RUN_DIR_MODE = 0o700
_OCTAL = re.compile(r"^(0o|0)?([0-7]{1,3})$")
_EXPECTED = "expected an octal mode from 0700 to 0777 that gives the owner rwx, e.g. 0700 or 0750"


def parse_mode(value: int | str) -> int:
    """``"0750"``, ``"750"``, ``"0o750"`` or ``0o750`` -> ``0o750``; ValueError naming the value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"Received run_dir_mode={value!r}; {_EXPECTED}")
    if isinstance(value, int):
        mode = value
    else:
        match = _OCTAL.match(str(value).strip())
        if match is None:
            raise ValueError(f"Received run_dir_mode={value!r}; {_EXPECTED}")
        mode = int(match.group(2), 8)
    if not 0 <= mode <= 0o777 or mode & 0o700 != 0o700:
        shown = f"{value!r}" if isinstance(value, str) else f"{oct(mode).replace('0o', '0')}"
        raise ValueError(f"Received run_dir_mode={shown}; {_EXPECTED}")
    return mode


def umask_for(mode: int, current: int) -> int:
    """The umask that creates directories with at most ``mode`` (files without x), keeping ``current``'s bits."""
    return current | (~mode & 0o777)


@contextmanager
def run_dir_umask(mode: int) -> Iterator[int]:
    """Narrow this process's umask to :func:`umask_for` ``mode`` while the block runs; yield it.

    The previous umask comes back afterwards (the supervisor may run inside a longer-lived
    process: a test session, a notebook).
    """
    previous = os.umask(0o077)
    narrowed = umask_for(mode, previous)
    os.umask(narrowed)
    try:
        yield narrowed
    finally:
        os.umask(previous)


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; else set and restore)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def directory_mode() -> int:
    """The mode ``mkdir`` gives a new directory now (for a ``mkdtemp`` dir, which is always 0700)."""
    return 0o777 & ~current_umask()
