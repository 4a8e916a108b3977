"""Entry point of one worker process.

Launched by the local supervisor as ``python -m resilient_train.runner --job JOB.json``, or
by another engine with the same flags as ``resilient-train run`` (``resilient-train worker
RECIPE ...``) and TF_CONFIG in the environment. Reads:

* ``TF_CONFIG``: the cluster and this task (absent: a single local worker);
* ``RT_ATTEMPT``, ``RT_RUN_ID``, ``RT_GENERATION`` (cluster/environment.py).

Exit codes and which exception ends a worker with which: resilient_train/errors.py.
Every exception that ends a worker is recorded in ``<attempt_dir>/error-<rank>.json`` for
the supervisor's root-cause report (runner/process/worker_main.py, rundir/errorfile.py ``recording``).
"""

from __future__ import annotations

import os
import sys

from resilient_train.runner.process.bootstrap import exit_process
from resilient_train.runner.process.worker_main import main

if __name__ == "__main__":
    exit_process(main(sys.argv[1:], environ=os.environ))
