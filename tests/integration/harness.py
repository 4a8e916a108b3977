"""Run real `resilient-train run` jobs (real worker processes, real MWMS on loopback).

Nothing here fakes TensorFlow: a job is the CLI in a subprocess; results are read from
the contracts users read (exit code, events.jsonl, summary.json, the checkpoint store).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from resilient_train.rundir.events import read_events as _read_event_file

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    returncode: int
    output: str
    run_dir: Path

    @property
    def events(self) -> list[dict[str, Any]]:
        return read_events(self.run_dir)

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]


def recipe_variant(tmp_path: Path, name: str, old: str, new: str, base: str = "recipes/linear_regression.py") -> str:
    """A copy of a shipped recipe with one exact edit (``old`` must be in it), as a user would make."""
    source = (REPO / base).read_text()
    assert old in source, f"{old!r} is not in {base}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return str(path)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return _read_event_file(Path(run_dir) / "events.jsonl")


def _names(flags: tuple[str, ...], *options: str) -> bool:
    return any(f in options or f.split("=")[0] in options for f in flags)


def command(recipe: str, run_dir: Path, *flags: str, tier_default: bool = False,
            standby: bool = True) -> list[str]:
    """``resilient-train run``, with ``--snapshot-every off`` unless ``flags`` name it or
    ``tier_default``: with the memory tier (on by default) a survivor commits a snapshot
    newer than the last save when a peer dies, so the step a restart restores depends on how
    far the survivors got, and most tests pin it. The tier's own tests set it
    (test_rescue*.py), and the shared reference runs keep the default (tests/conftest.py), so
    every exact-digest comparison also checks that the tier changes no weight.

    ``standby=False`` adds ``--no-warm-standby`` unless ``flags`` name it. Standbys are on by
    default, as for a user: every worker, the first attempt's too, is forked from the standby
    template, which imports TensorFlow once (supervisor/launchers/local.py)."""
    if not tier_default and not _names(flags, "--snapshot-every"):
        flags = (*flags, "--snapshot-every", "off")
    if not standby and not _names(flags, "--warm-standby", "--no-warm-standby"):
        flags = (*flags, "--no-warm-standby")
    return [sys.executable, "-m", "resilient_train", "run", recipe, "--run-dir", str(run_dir), *flags]


def environment(faults: list[dict] | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RT_FAULTS", None)
    # This tree first, also for a job run from another directory (``cwd``): a fit script's
    # relative paths are its working directory's, so its tests run it from a tmp dir.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if faults:
        env["RT_FAULTS"] = json.dumps(faults)
    env.update(extra)
    return env


def run_job(
    recipe: str,
    run_dir: Path,
    *flags: str,
    faults: list[dict] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    cwd: Path = REPO,
    tier_default: bool = False,
    standby: bool = True,
) -> Job:
    """``cwd``: the directory the user runs the command from (give ``recipe`` absolute then).
    ``tier_default``: the memory tier as a user gets it (see :func:`command`). ``standby``: warm
    standbys on or off (see :func:`command`)."""
    proc = subprocess.run(
        command(recipe, run_dir, *flags, tier_default=tier_default,
                standby=standby),
        cwd=cwd,
        env=environment(faults, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return Job(proc.returncode, proc.stdout, Path(run_dir))


def run_job_until(
    recipe: str,
    run_dir: Path,
    *flags: str,
    when: Callable[[list[dict[str, Any]]], bool],
    action: Callable[[subprocess.Popen, list[dict[str, Any]]], None],
    timeout: float = 240,
    new_session: bool = False,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    tier_default: bool = False,
) -> Job:
    """Start a job, watch its events, and call ``action`` once ``when(events)`` holds.

    ``new_session`` puts the job in its own process group, as a terminal would, so a test
    can signal the whole group (Ctrl-C) without signalling pytest. ``cwd``, ``env``: as for :func:`run_job`.
    """
    proc = subprocess.Popen(
        command(recipe, run_dir, *flags, tier_default=tier_default),
        cwd=cwd,
        env=environment(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=new_session,
    )
    deadline = time.monotonic() + timeout
    fired = False
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job in {run_dir} did not finish in {timeout} s")
            if not fired:
                events = read_events(run_dir)
                if when(events):
                    action(proc, events)
                    fired = True
            time.sleep(0.05)
        output = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    if not fired:
        raise AssertionError(f"the trigger never fired; output:\n{output}")
    return Job(proc.returncode, output, Path(run_dir))


def worker_pids(events: list[dict[str, Any]], attempt: int | None = None) -> dict[int, int]:
    """rank -> pid of the workers started (in ``attempt``, default the latest)."""
    started = [e for e in events if e["event"] == "worker_started"]
    if attempt is None and started:
        attempt = max(e["attempt"] for e in started)
    return {e["rank"]: e["pid"] for e in started if e["attempt"] == attempt}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def survivors(pids: Iterable[int], *, within_s: float) -> list[int]:
    """The pids still alive once all exited or ``within_s`` passed (polling; [] is the goal)."""
    pids = list(pids)
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    os.kill(pid, sig)


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] == "T"
    except OSError:
        return False


def wait_until_stopped(pid: int, *, timeout: float) -> None:
    """Wait (polling /proc, no fixed sleep decides anything) until ``pid`` is stopped."""
    deadline = time.monotonic() + timeout
    while not stopped(pid):
        if not alive(pid):
            raise AssertionError(f"pid {pid} exited instead of stopping")
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} did not stop within {timeout} s")
        time.sleep(0.05)
