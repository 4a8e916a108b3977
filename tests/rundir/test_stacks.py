"""rundir/stacks.py: a real faulthandler dump on SIGUSR1, parsed back; phase markers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from resilient_train.rundir.stacks import Frame, dump_size, parse_dump, read_dump
from resilient_train.rundir.stepmarker import Phase, PhaseMarker, read_phase, read_step


def test_sigusr1_dumps_every_thread_and_the_header_names_the_main_thread(tmp_path):
    path = tmp_path / "stacks-1.txt"
    script = textwrap.dedent(f"""
        import sys, threading, time
        from pathlib import Path
        from resilient_train.rundir.stacks import register
        handle = register(Path({str(path)!r}), rank=1)

        def _read():
            while True:
                time.sleep(0.05)

        threading.Thread(target=_read, daemon=True).start()
        print("ready", flush=True)
        threading.Event().wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert proc.stdout.readline() == "ready\n"
        offset = dump_size(path)
        assert offset > 0  # the header
        proc.send_signal(signal.SIGUSR1)
        for _ in range(100):
            if dump_size(path) > offset:
                break
            time.sleep(0.05)
        threads = read_dump(path, offset)
    finally:
        proc.kill()
        proc.wait()
    assert len(threads) == 2
    [main] = [t for t in threads if t.is_main]
    [other] = [t for t in threads if not t.is_main]
    assert main.frames[-1].function == "<module>"
    assert other.frames[0].function == "_read" and other.frames[0].file == "<string>"


def test_without_a_header_the_main_thread_is_the_one_started_by_a_module():
    text = textwrap.dedent("""\
        Thread 0x00007f0000000002 (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 320 in wait
          File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

        Current thread 0x00007f0000000001 (most recent call first):
          File "/home/me/input_hang.py", line 47 in _read
          File "/home/me/main.py", line 3 in <module>
        """)
    threads = parse_dump(text, main_ident=None)
    assert [(t.ident, t.is_main) for t in threads] == [(0x7F0000000002, False), (0x7F0000000001, True)]
    assert threads[1].frames[0] == Frame("/home/me/input_hang.py", 47, "_read")
    assert parse_dump(text, main_ident=0x7F0000000002)[0].is_main


def test_phase_markers_round_trip_and_default_to_startup(tmp_path):
    path = tmp_path / "phase-0.txt"
    assert read_phase(path) == Phase("startup")
    marker = PhaseMarker(path)
    assert read_phase(path) == Phase("startup")
    marker.enter("train", epoch=1, epoch_start_step=10)
    assert read_phase(path) == Phase("train", 1, 10) and read_phase(path).step_in_epoch(14) == 4
    previous = marker.enter("eval")
    assert read_phase(path) == Phase("eval", 1, 10)
    marker.restore(previous)
    assert read_phase(path) == Phase("train", 1, 10)
    assert read_step(tmp_path / "step-0.txt") is None
