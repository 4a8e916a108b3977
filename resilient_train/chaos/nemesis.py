"""The nemesis: does external faults to a running job when their trigger fires.

It owns no process: it reads the job's ``events.jsonl`` (the same stream users read),
the workers' step markers and the storage listing, and acts on pids the supervisor
announced in ``worker_started``. Each fault it does is appended to ``events.jsonl`` as a
``chaos_fault_injected`` event (op, target, pid, attempt, the step the job had reached)
so the run's own record says what happened to it, next to what the job did about it.

# Implementation:
# One ``Nemesis.poll()`` per harness tick (about every 10 ms):
#   read new event lines -> feed each pending fault's trigger (counts matching events);
#   a trigger that counted enough is ARMED; an armed mid-epoch trigger waits until a
#   step marker of its attempt shows a step past the triggering event's global_step that
#   is not an epoch end; ``sigkill_during_upload`` waits until the storage shows a
#   checkpoint directory newer than the newest commit with files but no manifest.
#   Then the op runs once and the fault is DONE.
# ``throttle_worker`` runs on after that: a daemon thread (:class:`Throttle`) stops and
# continues the worker's process and its children until it exits or ``finish()`` ends it
# (it always leaves them continued).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from resilient_train.rundir.events import EventFile, EventReader
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stepmarker import highest_step

from resilient_train.chaos.scenarios import ExternalFault

__all__ = ["Nemesis", "FaultState", "EventReader", "Throttle", "corrupt_newest"]

INJECTED_EVENT = "chaos_fault_injected"


class FaultState(str, Enum):
    """PENDING -> ARMED (trigger event seen) -> DONE (op done); PENDING/ARMED -> MISSED at job end."""

    PENDING = "pending"
    ARMED = "armed"
    DONE = "done"
    MISSED = "missed"


@dataclass
class _Pending:
    fault: ExternalFault
    state: FaultState = FaultState.PENDING
    seen: int = 0
    trigger_step: int | None = None
    trigger_attempt: int | None = None
    record: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    """Runs the external faults of one scenario against one job (across re-runs)."""

    def __init__(
        self,
        run_dir: Path,
        faults: list[ExternalFault],
        *,
        storage_url: str,
        steps_per_epoch: int,
        rng: random.Random,
        supervisor_pid: Callable[[], int | None],
        kill: Callable[[int, int], None] = os.kill,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.reader = EventReader(RunDir(self.run_dir).events)
        self.events = EventFile(RunDir(self.run_dir).events)
        self.pending = [_Pending(f) for f in faults]
        self.storage_url = storage_url
        self.storage_options = storage_options or {}
        self.steps_per_epoch = steps_per_epoch
        self.rng = rng
        self.supervisor_pid = supervisor_pid
        self.kill = kill
        self.pids: dict[tuple[int, int], int] = {}  # (attempt, rank) -> pid
        self.current_attempt = 0
        self.commits: list[int] = []
        self.throttles: list[Throttle] = []

    # ------------------------------------------------------------------ public
    def poll(self) -> list[dict[str, Any]]:
        """Read new events, advance triggers, do due faults; returns the faults done now."""
        for record in self.reader.read_new():
            self._observe(record)
        done = []
        for item in self.pending:
            if item.state is FaultState.ARMED and self._due(item):
                item.record = self._do(item)
                item.state = FaultState.DONE
                done.append(item.record)
        return done

    def finish(self) -> None:
        """The job is over: every fault not done by now missed its chance; throttles end."""
        for throttle in self.throttles:
            throttle.stop()
        for record in self.reader.read_new():
            self._observe(record)
        for item in self.pending:
            if item.state in (FaultState.PENDING, FaultState.ARMED):
                item.state = FaultState.MISSED

    def armed_supervisor_faults(self) -> bool:
        return any(i.fault.reruns and i.state is FaultState.DONE for i in self.pending)

    def results(self) -> list[dict[str, Any]]:
        return [
            {"fault": i.fault.describe(), "op": i.fault.op, "state": i.state.value, **i.record}
            for i in self.pending
        ]

    # ------------------------------------------------------------------ triggers
    def _observe(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "worker_started":
            self.pids[(record["attempt"], record["rank"])] = record["pid"]
            self.current_attempt = max(self.current_attempt, record["attempt"])
        if event == "checkpoint_committed":
            self.commits.append(record["global_step"])
        attempt = record.get("attempt") if record.get("role") != "supervisor" else self.current_attempt
        for item in self.pending:
            trigger = item.fault.trigger
            if item.state is not FaultState.PENDING or event != trigger.event:
                continue
            if trigger.attempt is not None and attempt != trigger.attempt:
                continue
            item.seen += 1
            if item.seen >= trigger.nth:
                item.state = FaultState.ARMED
                item.trigger_step = record.get("global_step")
                item.trigger_attempt = attempt

    def _due(self, item: _Pending) -> bool:
        if item.fault.op == "sigkill_during_upload":
            return self._upload_in_flight() is not None
        if not item.fault.trigger.mid_epoch:
            return True
        step = self._reached(item.trigger_attempt)
        if step is None or item.trigger_step is None:
            return False
        return step > item.trigger_step and step % self.steps_per_epoch != 0

    def _reached(self, attempt: int | None) -> int | None:
        return highest_step(RunDir(self.run_dir).attempt(attempt).path)

    def _upload_in_flight(self) -> str | None:
        """A ckpt directory newer than the newest commit, with files but no manifest yet."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.storage_url, **self.storage_options)
        newest = max(self.commits, default=-1)
        try:
            fs.invalidate_cache(root)
            names = fs.ls(root, detail=False)
        except FileNotFoundError:
            return None
        for name in sorted(names, reverse=True):
            base = name.rstrip("/").rsplit("/", 1)[-1]
            if not base.startswith("ckpt-") or not base[5:].isdigit() or int(base[5:]) <= newest:
                continue
            try:
                files = {p.rsplit("/", 1)[-1] for p in fs.find(name)}
            except FileNotFoundError:
                continue
            if files and "MANIFEST.json" not in files and not any(f.startswith(".MANIFEST") for f in files):
                return name
        return None

    # ------------------------------------------------------------------ ops
    def _do(self, item: _Pending) -> dict[str, Any]:
        fault, op = item.fault, item.fault.op
        attempt = self.current_attempt
        record: dict[str, Any] = {"op": op, "attempt": attempt, "trigger": fault.trigger.describe(),
                                  "trigger_step": item.trigger_step}
        if op == "corrupt_newest":
            record.update(corrupt_newest(self.storage_url, self.rng, self.storage_options))
        elif op in ("sigkill_supervisor", "sigterm_supervisor"):
            pid = self.supervisor_pid()
            record.update(target="supervisor", pid=pid, reached_step=self._reached(attempt))
            if pid is not None:
                self._signal(pid, signal.SIGKILL if op == "sigkill_supervisor" else signal.SIGTERM)
        else:
            rank = 0 if op == "sigkill_during_upload" else int(fault.rank)
            pid = self.pids.get((attempt, rank))
            record.update(target=f"rank {rank}", rank=rank, pid=pid, reached_step=self._reached(attempt))
            if op == "sigkill_during_upload":
                record["uploading"] = self._upload_in_flight()
            if op == "throttle_worker":
                record.update(stop_ms=fault.stop_ms, run_ms=fault.run_ms)
                if pid is not None:
                    self.throttles.append(Throttle(pid, fault.stop_ms / 1000, fault.run_ms / 1000, kill=self.kill).start())
            elif pid is not None:
                self._signal(pid, signal.SIGTERM if op == "sigterm_worker" else signal.SIGKILL)
        self.events.append({
            "event": INJECTED_EVENT,
            "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
            "role": "chaos",
            **record,
        })
        return record

    def _signal(self, pid: int, sig: int) -> None:
        try:
            self.kill(pid, sig)
        except ProcessLookupError:
            pass


class Throttle:
    """Stops ``pid`` (SIGSTOP: every thread) and its children for ``stop_s``, lets them run (SIGCONT)
    for ``run_s``, again and again, in a daemon thread, until the process is gone or ``stop()``; it
    always leaves them continued. The children are listed again every second (psutil)."""

    CHILDREN_EVERY_S = 1.0

    def __init__(self, pid: int, stop_s: float, run_s: float, *, kill: Callable[[int, int], None] = os.kill,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid, self.stop_s, self.run_s = pid, stop_s, run_s
        self.kill, self.sleep, self.clock = kill, sleep, clock
        self.cycles = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Throttle":
        self._thread = threading.Thread(target=self.run, name=f"throttle-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * (self.stop_s + self.run_s) + 1)

    def run(self) -> None:
        pids, listed = [self.pid], float("-inf")
        try:
            while not self._stopped.is_set():
                if self.clock() - listed >= self.CHILDREN_EVERY_S:
                    pids, listed = [self.pid, *_children(self.pid)], self.clock()
                if not self._send(pids, signal.SIGSTOP):
                    return  # the worker exited
                self.sleep(self.stop_s)
                self._send(pids, signal.SIGCONT)
                self.cycles += 1
                self.sleep(self.run_s)
        finally:
            self._send(pids, signal.SIGCONT)

    def _send(self, pids: list[int], sig: int) -> bool:
        """``sig`` to each of ``pids``; False when the worker itself is gone."""
        alive = True
        for pid in pids:
            try:
                self.kill(pid, sig)
            except ProcessLookupError:
                if pid == self.pid:
                    alive = False
                    if sig == signal.SIGSTOP:
                        break  # its children are left running (continued at the end)
        return alive


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def corrupt_newest(url: str, rng: random.Random, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Flip one byte (XOR 0xFF, at a seeded offset) in a data file of the newest committed checkpoint.

    Returns what was done (``global_step``, ``file``, ``offset``) and what ``verify`` said
    right after: ``verify_exit`` and ``verify_bad`` (every torn/corrupt checkpoint, as
    ``"<step>: <status>: <detail>"``), so the report can show it named exactly this file.
    """
    import fsspec

    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.checkpoint.store import Status

    store = CheckpointStore(url, storage_options)
    committed = [info for info in store.list() if info.status is Status.OK and info.manifest is not None]
    if not committed:
        return {"global_step": None, "error": "no committed checkpoint to corrupt"}
    newest = committed[-1]
    data_files = sorted(rel for rel in newest.manifest.files if ".data-" in rel) or sorted(newest.manifest.files)
    rel = data_files[0]
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    path = f"{root.rstrip('/')}/{CheckpointStore.dir_name(newest.global_step)}/{rel}"
    data = bytearray(fs.cat_file(path))
    offset = rng.randrange(len(data))
    data[offset] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    from resilient_train.chaos.invariants import verify_storage

    code, checkpoints, _ = verify_storage(url, storage_options)
    bad = [f"{c['global_step']}: {c['status']}: {c['detail']}" for c in checkpoints if c["status"] in ("torn", "corrupt")]
    expected = f"{newest.global_step}: corrupt: sha256 mismatch in {rel}"
    return {
        "global_step": newest.global_step,
        "file": rel,
        "offset": offset,
        "verify_exit": code,
        "verify_bad": bad,
        "verify_exact": code == 1 and bad == [expected],
    }
