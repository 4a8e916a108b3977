"""Entry point of one worker process.

Launched by the local supervisor as ``python -m resilient_train.runner --job JOB.json``, or
by another engine with the same flags as ``resilient-train run`` (``resilient-train worker
RECIPE ...``) and TF_CONFIG in the environment. Reads:

* ``TF_CONFIG``: the cluster and this task (absent: a single local worker);
* ``RT_ATTEMPT``: the attempt number (default 1), ``RT_RUN_ID``: the run id.

Exit codes (resilient_train.errors): 0 done, 1 failed (restartable), 3 fatal (a restart
cannot help: bad recipe, incompatible checkpoint, bad storage URL), 143 preempted after an
agreed save. Every uncaught exception is recorded in ``<attempt_dir>/error-<rank>.json`` for
the supervisor's root-cause report.
"""

from __future__ import annotations

import os
import sys

from resilient_train.runner.worker import exit_process, main

if __name__ == "__main__":
    exit_process(main(sys.argv[1:], environ=os.environ))
