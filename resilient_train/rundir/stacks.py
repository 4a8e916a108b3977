"""A worker's Python stacks on request: ``faulthandler`` on SIGUSR1, into the attempt dir.

Both sides of one contract live here. The worker calls :func:`register` early: it opens
``attempt-<n>/stacks-<rank>.txt``, writes one header line naming its pid and its main
thread's id, and registers ``faulthandler`` for :data:`STACKS_SIGNAL` with every thread.
``faulthandler`` writes from inside the C signal handler, so the dump comes even while the
main thread is blocked in a TensorFlow op (an all-reduce waiting for a stuck peer).
The supervisor (supervisor/watchdog.py) notes the file's size, sends the signal, and parses
only the bytes that appeared after it (:func:`read_dump`): each request appends one dump.

faulthandler's format is ``Thread 0x<id> (most recent call first):`` (``Current thread``
for the thread that ran the handler) followed by ``  File "<path>", line <n> in <func>``
lines; the header's id tells which block is the main thread.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["STACKS_SIGNAL", "Frame", "ThreadStack", "register", "parse_dump", "read_dump", "dump_size",
           "is_recipe_code", "in_tensorflow"]

STACKS_SIGNAL = signal.SIGUSR1

_HEADER = re.compile(r"# resilient-train stacks: rank (\d+) pid (\d+) main thread 0x([0-9a-f]+)")
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
# Paths that are not the user's code: installed packages, the standard library, ourselves.
_FRAMEWORK = ("/site-packages/", "/dist-packages/", "/resilient_train/", "/lib/python3", "/__autograph_generated_")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def short(self) -> str:
        """``input_hang.py:47 _read``"""
        return f"{os.path.basename(self.file)}:{self.line} {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    ident: int
    frames: tuple[Frame, ...]  # most recent call first, as faulthandler prints them
    is_main: bool


def register(path: Path, *, rank: int) -> IO[str]:
    """Dump every thread's stack into ``path`` on :data:`STACKS_SIGNAL`; keep the returned file open."""
    handle = open(path, "a", buffering=1)
    handle.write(f"# resilient-train stacks: rank {rank} pid {os.getpid()} "
                 f"main thread 0x{threading.main_thread().ident:016x}\n")
    handle.flush()
    faulthandler.register(STACKS_SIGNAL, file=handle, all_threads=True, chain=False)
    return handle


def dump_size(path: Path) -> int:
    """Bytes in the stacks file now (0 when absent): where the next dump will start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_dump(path: Path, offset: int) -> list[ThreadStack]:
    """The threads of the dump written after ``offset`` (empty when none came)."""
    try:
        with open(path, errors="replace") as handle:
            head = handle.readline()
            handle.seek(offset)
            text = handle.read()
    except OSError:
        return []
    match = _HEADER.match(head)
    return parse_dump(text, main_ident=int(match.group(3), 16) if match else None)


def parse_dump(text: str, *, main_ident: int | None) -> list[ThreadStack]:
    """faulthandler's ``all_threads`` text -> one ThreadStack per thread block.

    Without ``main_ident`` the main thread is the one whose outermost frame is a module
    (``<module>``): every other Python thread starts in ``threading``'s bootstrap.
    """
    blocks: list[tuple[int, list[Frame]]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            blocks.append((int(thread.group(1), 16), []))
            continue
        frame = _FRAME.match(line)
        if frame and blocks:
            blocks[-1][1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    stacks = []
    for ident, frames in blocks:
        if main_ident is not None:
            is_main = ident == main_ident
        else:
            is_main = bool(frames) and frames[-1].function == "<module>"
        stacks.append(ThreadStack(ident, tuple(frames), is_main))
    return stacks


def is_recipe_code(frame: Frame) -> bool:
    """Not an installed package, the standard library or resilient-train: the user's code."""
    return not frame.file.startswith("<") and not any(part in frame.file for part in _FRAMEWORK)


def in_tensorflow(stack: ThreadStack) -> bool:
    """The thread's innermost Python frame is TensorFlow's (executing an op, e.g. a collective)."""
    return bool(stack.frames) and "/tensorflow/" in stack.frames[0].file
