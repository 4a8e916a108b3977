"""``resilient-train worker RECIPE``: one worker, for Kubernetes/Slurm/Ray.

TF_CONFIG comes from the launcher's environment (or ``--tf-config-from slurm``). The
arguments are parsed here, once; the worker itself is ``runner.process.worker_main.run``.
Once it has run, this process leaves as every worker does, by ``exit_process``
(runner/process/bootstrap.py: its ``local/rank-<rank>/tmp`` removed, no interpreter or TensorFlow
teardown), never back through ``cli.main``: ``python -m resilient_train.runner`` and this command
end a worker the same way. Only a refusal before the worker starts (a bad flag, the
parameter-server strategy) returns to ``cli.main`` for its one line.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from resilient_train.cluster.slurm_env import add_tf_config_arguments
from resilient_train.errors import ConfigError
from resilient_train.job.config import add_job_arguments, job_from_args

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("worker", help="run one worker (TF_CONFIG set by your launcher)")
    parser.add_argument("recipe", nargs="?")
    add_job_arguments(parser)
    add_tf_config_arguments(parser)
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.runner.process.bootstrap import exit_process
    from resilient_train.runner.process.worker_main import run

    job = job_from_args(args)
    if job.strategy == "parameter-server":
        raise ConfigError(
            "resilient-train worker runs MultiWorkerMirroredStrategy workers only; --strategy parameter-server "
            "runs under `resilient-train run` on one host (docs/parameter_server.md)"
        )
    exit_process(run(job, tf_config_from=args.tf_config_from, port_base=args.port_base, environ=os.environ))
