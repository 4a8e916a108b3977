"""The chief's ``print()`` on the supervisor's console: stdout tee'd into ``script_output`` events.

A worker's stdout is its log file (``attempt-<n>/worker-<rank>.log``), which a person running
``resilient-train run train.py`` does not watch. On the chief (rank 0) only, the worker puts
:class:`LineTee` in front of ``sys.stdout``: every write still goes to the log unchanged,
and each complete line also becomes one ``script_output`` event (field ``text``, the line
without its newline) in events.jsonl, which the supervisor's console prints as the text
itself (supervisor/console.py). One rank's lines only, so a script's ``print`` shows once,
as plain Keras on one machine would show it; the other ranks' prints stay in their logs.

Lines, not writes: ``print("a", end="")`` then ``print("b")`` is one line ``ab``, as on a
terminal. ``flush()`` passes through and emits nothing (a progress bar flushes half lines);
the last unfinished line is emitted by :meth:`LineTee.finish` when the worker ends
(:func:`tee_stdout` does it on the way out, before ``exit_process``'s ``os._exit``).

What it refuses: bytes written to ``sys.stdout.buffer`` or to file descriptor 1 bypass it
(they reach the log only), and an event that cannot be written (events.jsonl unwritable)
loses the console copy of that line, never the print itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, TextIO

__all__ = ["LineTee", "tee_stdout", "EVENT"]

EVENT = "script_output"  # docs/events.md


class LineTee:
    """A text stream that writes through to ``stream`` and calls ``emit(line)`` per complete line.

    Thread-safe: lines are cut and emitted under one lock, so two threads' lines keep their
    order and never mix. A write made while ``emit`` runs on the same thread (an event
    listener that prints) goes to ``stream`` only, instead of recursing.
    Every other attribute (``fileno``, ``isatty``, ``encoding``, ...) is the stream's.
    """

    def __init__(self, stream: TextIO, emit: Callable[[str], None]) -> None:
        self.stream = stream
        self._emit = emit
        self._partial = ""
        self._lock = threading.RLock()
        self._emitting = False  # true while emit runs (on the thread holding the lock)

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        with self._lock:
            if self._emitting:
                return written
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self._send(line)
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.stream.flush()

    def finish(self) -> None:
        """Emit the unfinished last line, if any, and flush the stream."""
        with self._lock:
            partial, self._partial = self._partial, ""
            if partial:
                self._send(partial)
        self.stream.flush()

    def _send(self, line: str) -> None:
        self._emitting = True
        try:
            self._emit(line)
        except OSError:  # events.jsonl unwritable: the line is in the log; printing must not fail
            pass
        finally:
            self._emitting = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def tee_stdout(emit: Callable[[str], None]) -> Iterator[LineTee]:
    """``sys.stdout`` is a :class:`LineTee` inside; on the way out its last line is emitted
    and the stream it wrapped is put back."""
    tee = LineTee(sys.stdout, emit)
    sys.stdout = tee  # type: ignore[assignment]  # LineTee is a TextIO by delegation
    try:
        yield tee
    finally:
        tee.finish()
        if sys.stdout is tee:
            sys.stdout = tee.stream
