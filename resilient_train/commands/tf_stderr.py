"""TensorFlow's start-up chatter kept off the stderr of a command that loads it in-process.

On a machine without a GPU, importing TensorFlow and creating its first tensor print lines
such as ``Could not find cuda drivers on your machine, GPU will not be used`` and ``failed
call to cuInit``, plus the oneDNN notice and absl's ``All log messages before
absl::InitializeLog() is called are written to STDERR``. They are written by C++ code straight
to file descriptor 2, most of them before absl's logging is initialised, so
``TF_CPP_MIN_LOG_LEVEL`` (which cli.py sets to 2, as the supervisor does for its workers)
does not hold them back: measured with TensorFlow 2.21, levels 2 and 3 both leave the
``cudart_stub.cc`` and ``port.cc`` lines. A run never shows them because its workers'
stderr is their log file, and the root cause's log tail drops them by
rundir/errorfile.py :data:`~resilient_train.rundir.errorfile.TF_NOISE_PATTERNS`. A command
that loads TensorFlow in its own process (``export``, ``verify --deep``) filters its stderr
by the same patterns: :func:`tensorflow_chatter_filtered` points descriptor 2 at a pipe for
the duration of the block, and a thread forwards every line that is not noise to the real
stderr, in order. Python's own ``sys.stderr`` (errors, warnings, tracebacks) goes through
the same pipe and arrives unchanged.

What it refuses: it does not silence TensorFlow by changing numerics (``TF_ENABLE_ONEDNN_OPTS=0``
would drop the oneDNN notice by changing results), and it filters nothing outside the block.
A child process started inside the block inherits the pipe; its lines are forwarded while
the block lasts and up to :data:`DRAIN_S` after.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from resilient_train.rundir.errorfile import is_tf_noise

__all__ = ["tensorflow_chatter_filtered", "DRAIN_S"]

DRAIN_S = 5.0  # after the block: how long the forwarder may still drain what was written


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy lines from ``read_fd`` to ``write_fd`` until end of file, dropping TensorFlow noise;
    then close both (the forwarder owns them: it may outlive the block by a child's pipe)."""
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        _write_kept(write_fd, lines, newline=True)
    if pending:
        _write_kept(write_fd, [pending], newline=False)
    os.close(read_fd)
    os.close(write_fd)


def _write_kept(fd: int, lines: list[bytes], *, newline: bool) -> None:
    kept = [line for line in lines if not is_tf_noise(line.decode("utf-8", errors="replace"))]
    if not kept:
        return
    data = b"\n".join(kept) + (b"\n" if newline else b"")
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:
            return  # our real stderr is gone: nothing left to tell


@contextmanager
def tensorflow_chatter_filtered() -> Iterator[None]:
    """While the block runs, descriptor 2 drops TensorFlow's start-up chatter (module docstring)."""
    sys.stderr.flush()
    try:
        real = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    read_fd, write_fd = os.pipe()
    forwarder = threading.Thread(target=_forward, args=(read_fd, real), name="tf-stderr-filter", daemon=True)
    forwarder.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # closes the pipe's last write end we hold: the forwarder reads its end
        forwarder.join(DRAIN_S)
