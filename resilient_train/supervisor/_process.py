"""Child processes die with the supervisor: the Linux parent-death signal.

Workers and standbys get ``PR_SET_PDEATHSIG = SIGKILL`` between fork and exec, so a
SIGKILLed supervisor (which cannot clean up) still takes its whole worker group with it.
"""

from __future__ import annotations

import ctypes
import signal
import sys
from typing import Callable

__all__ = ["die_with_parent_hook"]

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` for subprocess.Popen (None off Linux, where the hook does not exist)."""
    return _set_parent_death_signal if sys.platform.startswith("linux") else None
