"""Elastic world size with real processes: ``--workers 1:2`` on the local launcher.

The local launcher's capacity is the run dir's ``local-slots`` file (RunDir.local_slots),
the stand-in for nodes that come and go. The scenario: 2 workers train; capacity drops
to 1 and rank 1 is SIGKILLed (its node is gone, no spare) -> the group restarts at 1 worker
from the last commit, spending no restart; capacity returns -> at the next agreed save
the group stops cleanly and restarts at 2; the run completes at the last step.

The recipe is a parameter: the lead wires an indexed recipe (per-step example-index
digests) into the same scenario.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from resilient_train.rundir.layout import RunDir
from tests.integration.harness import REPO, Job, command, environment, read_events, worker_pids


EPOCHS, STEPS_PER_EPOCH = 2, 10
FLAGS = ("--workers", "1:2", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH),
         "--global-batch-size", "32", "--save-every-steps", "4", "--steps-per-execution", "1",
         "--set", "step_delay_s=0.3")

Trigger = tuple[Callable[[list[dict[str, Any]]], bool], Callable[[list[dict[str, Any]]], None]]


def run_with_triggers(recipe: str, run_dir: Path, *flags: str, triggers: list[Trigger], timeout: float = 300) -> Job:
    """Run a job; fire each (when, action) in order, once, as the events allow."""
    proc = subprocess.Popen(command(recipe, run_dir, *flags), cwd=REPO, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pending = list(triggers)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job in {run_dir} did not finish in {timeout} s")
            if pending:
                events = read_events(run_dir)
                when, action = pending[0]
                if when(events):
                    action(events)
                    pending.pop(0)
            time.sleep(0.05)
        output = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not pending, f"{len(pending)} trigger(s) never fired; output:\n{output}"
    return Job(proc.returncode, output, Path(run_dir))


def _of(events: list[dict[str, Any]], name: str, attempt: int) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name and e.get("attempt") == attempt]


@pytest.mark.parametrize("recipe", ["tests/recipes/slow_digits.py"])
def test_a_node_loss_without_a_spare_shrinks_the_group_and_returning_capacity_grows_it_back(tmp_path, recipe):
    run_dir = tmp_path / "run"
    slots = RunDir(run_dir).local_slots
    run_dir.mkdir()
    slots.write_text("2\n")

    def lose_rank_1(events):
        slots.write_text("1\n")  # the node is gone and no spare exists...
        os.kill(worker_pids(events, attempt=1)[1], signal.SIGKILL)  # ...and so is its worker

    triggers: list[Trigger] = [
        (lambda events: any(e["global_step"] >= 4 for e in _of(events, "checkpoint_committed", 1)), lose_rank_1),
        (lambda events: bool(_of(events, "first_step", 2)), lambda events: slots.write_text("2\n")),
    ]
    job = run_with_triggers(recipe, run_dir, *FLAGS, triggers=triggers)

    assert job.returncode == 0, job.output
    resizes = [(e["attempt"], e["from"], e["to"], e["reason"]) for e in job.named("world_size_changed") if "from" in e]
    assert resizes == [
        (2, 2, 1, "capacity fell: the launcher can place 1 of 2 workers"),
        (3, 1, 2, "capacity returned: the launcher can place 2 workers"),
    ]
    summary = job.summary
    assert summary["world_sizes"] == {"1": 2, "2": 1, "3": 2}
    assert (summary["restarts"], summary["membership_changes"], summary["preemptions"]) == (0, 2, 0)
    assert summary["global_step"] == EPOCHS * STEPS_PER_EPOCH
    events = job.events
    # Attempt 2 resumed from attempt 1's last commit; attempt 3 from attempt 2's agreed save.
    last_commit_1 = max(e["global_step"] for e in _of(events, "checkpoint_committed", 1))
    assert [e["global_step"] for e in _of(events, "restored", 2)] == [last_commit_1]
    saved_for_resize = [e["global_step"] for e in _of(events, "preempted", 2)]
    assert len(saved_for_resize) == 1
    assert [e["global_step"] for e in _of(events, "restored", 3)] == saved_for_resize
    assert not [e for e in events if e["event"] == "gang_restart" and "restart 1 of" in e["reason"]]
