"""A stand-in worker: speaks the worker side of the run-dir contract, without TensorFlow.

What a supervisor costs as the group grows (benchmarks/supervisor_scaling.py, and the test
of the real supervisor at 64 workers in tests/supervisor/test_standin_scaling.py) cannot be
measured with 64 or 256 TensorFlow workers on one small machine. This process is started
by the real local launcher in a real worker's place (:class:`StandinSpawner`, the
launcher's ``spawner`` seam: the worker's argv with ``-m resilient_train.runner`` replaced
by this script), and writes what a real worker writes, through the real worker's code:

* the start-up and the exit of every worker process (runner/process/bootstrap.py
  ``worker_process``, ``exit_process``): the error file (rundir/errorfile.py ``recording``),
  the events bound to run id, attempt, rank and role, the SIGUSR1 stack dumps, SIGTERM and
  SIGINT setting the stop request;
* the step marker after each step and the phase marker (rundir/stepmarker.py
  ``StepMarker``, ``PhaseMarker``), which the supervisor's watchdog reads;
* the chief's checkpoint commits (checkpoint/store.py ``CheckpointStore.commit``, fenced by
  the attempt's generation like the real chief's), the last one ``completed``, so the
  supervisor's "the run is complete" is the real check;
* every rank restores: it starts the attempt at the newest committed step;
* the group trains in lock-step, as under MultiWorkerMirroredStrategy: no rank trains
  before every rank of the attempt started, nor runs ahead of a dead peer (``_Group``:
  one byte per rank and step appended to ``attempt-<n>/standin-group``).

Its "training" is a sleep of ``--step-s`` per step. ``--die-at RANK:STEP`` makes that rank
SIGKILL itself after finishing STEP in attempt ``--die-attempt`` (a kill -9, exit -9). On
SIGTERM a stand-in leaves at once as a survivor of a broken group does (a
``GroupBrokenError`` in its error file, exit 4): the supervisor SIGTERMs a group after one
of its workers died, and a real survivor cannot agree on a save then. Unlike a real one it
never waits in the broken collective, so a teardown here measures the supervisor, not
TensorFlow. (No agreed preemption save: stand-ins model the failure path only.) Non-chief ranks exit 0 after the last step; the chief
commits the final checkpoint, then exits 0.

Run as ``python tests/support/standin_worker.py [STAND-IN OPTIONS] --job attempt-<n>/job.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository root, not tests/support, is the import root
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from resilient_train.checkpoint import CheckpointStore  # noqa: E402
from resilient_train.cluster import entry_points  # noqa: E402
from resilient_train.cluster.tf_config import parse_tf_config  # noqa: E402
from resilient_train.errors import EXIT_OK, GroupBrokenError  # noqa: E402
from resilient_train.job.config import JobConfig  # noqa: E402
from resilient_train.job.recipe import recipe_name  # noqa: E402
from resilient_train.rundir import events  # noqa: E402
from resilient_train.rundir.errorfile import recording  # noqa: E402
from resilient_train.rundir.stepmarker import PHASE_FINISH, PHASE_TRAIN, PhaseMarker, StepMarker  # noqa: E402
from resilient_train.runner.process.bootstrap import exit_process, worker_process  # noqa: E402
from resilient_train.supervisor.launchers.local import PopenSpawner  # noqa: E402

__all__ = ["StandinOptions", "StandinSpawner", "main", "SCRIPT"]

SCRIPT = Path(__file__).resolve()
PREFIX = "stand-in worker"
GROUP_FILE = "standin-group"  # in the attempt dir: the group's lock-step (see _Group)


@dataclass(frozen=True)
class StandinOptions:
    """How every stand-in of a run trains: ``steps`` in all, ``step_s`` each, the chief
    commits every ``save_every`` steps; ``die_at`` (rank, step) in attempt ``die_attempt``."""

    steps: int = 20
    step_s: float = 0.05
    save_every: int = 10
    die_at: tuple[int, int] | None = None
    die_attempt: int = 1

    def argv(self) -> list[str]:
        args = ["--steps", str(self.steps), "--step-s", str(self.step_s), "--save-every", str(self.save_every),
                "--die-attempt", str(self.die_attempt)]
        if self.die_at is not None:
            args += ["--die-at", f"{self.die_at[0]}:{self.die_at[1]}"]
        return args


@dataclass
class StandinSpawner:
    """The local launcher's spawner seam: a real process, this script in the worker's place.

    ``started`` records each spawn's pid (the benchmark picks its victim there)."""

    options: StandinOptions = field(default_factory=StandinOptions)
    popen: PopenSpawner = field(default_factory=PopenSpawner)

    def __call__(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        python, flag, module, *worker_argv = argv
        if (flag, module) != ("-m", entry_points.WORKER):
            raise ValueError(f"Received worker argv {argv!r}; expected [python, '-m', {entry_points.WORKER!r}, ...]")
        return self.popen([python, str(SCRIPT), *self.options.argv(), *worker_argv], env, log_path)


def _die_at(text: str) -> tuple[int, int]:
    try:
        rank, step = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"Received --die-at {text!r}; expected RANK:STEP, e.g. 3:12") from None
    return rank, step


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="standin_worker.py", allow_abbrev=False)
    parser.add_argument("--job", required=True, help="the attempt's job.json, as a real worker gets it")
    parser.add_argument("--steps", type=int, default=StandinOptions.steps)
    parser.add_argument("--step-s", type=float, default=StandinOptions.step_s)
    parser.add_argument("--save-every", type=int, default=StandinOptions.save_every)
    parser.add_argument("--die-at", type=_die_at, default=None)
    parser.add_argument("--die-attempt", type=int, default=StandinOptions.die_attempt)
    return parser


def main(argv: list[str]) -> int:
    args = argument_parser().parse_args(argv)
    with recording(PREFIX) as state:
        job = JobConfig.from_json(Path(args.job).read_text())
        cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
        with worker_process(state, job, rank=cluster.rank, role=cluster.role, writes_group_events=cluster.is_chief,
                            environ=os.environ) as process:
            state.exit_code = _train(process, cluster.is_chief, args)
    return state.exit_code


def _train(process, is_chief: bool, args: argparse.Namespace) -> int:
    job, launched = process.job, process.launched
    store = CheckpointStore(job.storage, job.storage_options)
    if is_chief:
        store.claim_generation(launched.generation, run_id=launched.run_id, attempt=launched.attempt)
    newest = store.latest_manifest()
    step = newest.global_step if newest is not None else 0
    if newest is None:
        events.emit("fresh_start", group=True, epoch=0, step_in_epoch=0, global_step=0)
    else:
        events.emit("restored", group=True, epoch=0, step_in_epoch=step, global_step=step,
                    checkpoint=f"{store.url}/{store.dir_name(step)}", input_reentry="start_step",
                    input_reentry_reason="a stand-in has no input pipeline")
    marker = StepMarker(process.attempt_dir.step_marker(process.rank))
    phase = PhaseMarker(process.attempt_dir.phase_marker(process.rank))
    phase.enter(PHASE_TRAIN, epoch=0, epoch_start_step=0)
    group = _Group(process.attempt_dir.path / GROUP_FILE, job.workers, process.stop)
    dies = args.die_at is not None and args.die_at[0] == process.rank and launched.attempt == args.die_attempt
    first = True
    while True:
        group.arrive()  # joined (the first time), then: finished the step before
        if not group.wait():
            process.ignore_stop_signals()
            raise GroupBrokenError(f"the worker group broke: stand-in rank {process.rank} was stopped at step {step}")
        if step >= args.steps:
            break
        time.sleep(args.step_s)
        step += 1
        marker.write(step)
        if first:
            events.emit("first_step", group=True, global_step=step)
            first = False
        if dies and step == args.die_at[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        if is_chief and step % args.save_every == 0 and step < args.steps:
            _commit(store, job, launched.run_id, step, completed=False)
    process.ignore_stop_signals()
    if is_chief:
        phase.enter(PHASE_FINISH)
        _commit(store, job, launched.run_id, step, completed=True)
    return EXIT_OK


class _Group:
    """The group's lock-step, as MultiWorkerMirroredStrategy's collectives impose it: no rank
    trains before every rank of the attempt joined, nor starts a step before every rank
    finished the one before. Each rank appends one byte to ``path`` when it joins and after
    each step; the k-th barrier is passed at ``workers * k`` bytes (a stat per poll, whatever
    the group's size). A dead rank stops the group there, as a dead peer stops an all-reduce."""

    POLL_S = 0.01  # between steps: the ranks arrive within a step's skew
    JOIN_POLL_S = 0.05  # while the group forms: up to 256 ranks wait for the slowest start-up

    def __init__(self, path: Path, workers: int, stop) -> None:
        self.path, self.workers, self.stop = path, workers, stop
        self.arrived = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def arrive(self) -> None:
        os.write(self._fd, b".")
        self.arrived += 1

    def wait(self) -> bool:
        """True once every rank arrived as often as this one; False when stopped (SIGTERM) first."""
        while self.path.stat().st_size < self.workers * self.arrived:
            if self.stop.is_set():
                return False
            time.sleep(self.JOIN_POLL_S if self.arrived == 1 else self.POLL_S)
        return not self.stop.is_set()


def _commit(store: CheckpointStore, job: JobConfig, run_id: str, step: int, *, completed: bool) -> None:
    """Commit a one-file checkpoint of ``step``; its 'weights' are the step's digest."""
    weights = f"stand-in weights at step {step}\n".encode()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "weights.bin").write_bytes(weights)
        extra = {"recipe": recipe_name(job.recipe), "standin": True}
        if completed:
            extra["completed"] = True
        manifest = store.commit(Path(tmp), run_id=run_id, epoch=0, step_in_epoch=step, global_step=step,
                     world_size=job.workers, weights_sha256=hashlib.sha256(weights).hexdigest(),
                     tf_version="stand-in", extra=extra)
    events.emit("checkpoint_committed", group=True, epoch=0, step_in_epoch=step, global_step=step,
                weights_sha256=manifest.weights_sha256, path=f"{store.url}/{store.dir_name(step)}",
                size=manifest.total_size, commit_s=round(time.monotonic() - started, 3))


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
