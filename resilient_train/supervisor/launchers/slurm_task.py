"""What each task of a Slurm launcher step runs: the worker, plus two reports for the supervisor.

    python -m resilient_train.supervisor.launchers.slurm_task ATTEMPT_DIR -- WORKER ARGV...

One ``srun`` step runs every rank of an attempt, so the supervisor only has ``srun``'s single
exit status, which mixes the tasks together. This wrapper writes, into the (shared) attempt
dir, per task (``SLURM_PROCID`` = rank):

* ``slurm-task-<rank>.json`` when the worker ends: its own exit code (negative = killed by
  that signal, so 143 "preempted after a save" stays distinct from "killed by SIGTERM");
* ``slurm-term-<rank>`` the moment Slurm delivers SIGTERM to the task (``scancel
  --signal=TERM``, preemption with GraceTime, ``sbatch --signal``): a stop asked by Slurm,
  not by one worker's fault, so the supervisor saves and exits 143 instead of restarting.

Slurm signals every process of the step (the proctrack plugin), so the worker gets the
signal itself; the wrapper only records it and never forwards it. A task killed by SIGKILL
(or whose node is lost) writes nothing; the launcher reports that as SIGKILL when the step ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.layout import AttemptDir

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m resilient_train.supervisor.launchers.slurm_task ATTEMPT_DIR -- ARGV...", file=sys.stderr)
        return 2
    attempt_dir, command = AttemptDir.at(argv[0]), argv[2:]
    rank = int(os.environ.get("SLURM_PROCID", "0"))

    def record_term(signum: int, frame: object) -> None:
        attempt_dir.slurm_term(rank).write_text(f"{socket.gethostname()}\n")

    signal.signal(signal.SIGTERM, record_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # srun forwards Ctrl-C; the worker handles it
    child = subprocess.Popen(command)
    code = child.wait()
    report = {"rank": rank, "exit_code": code, "pid": child.pid, "host": socket.gethostname()}
    write_atomic(attempt_dir.slurm_exit(rank), json.dumps(report) + "\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
