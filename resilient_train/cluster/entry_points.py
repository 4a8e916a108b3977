"""The modules a launcher runs on a node (``python -m MODULE``), named once.

Launchers sit beside the runner (supervisor/ never imports runner/), so they start the
worker side by module path. The paths live here, below both, where tests/test_layering.py
checks that each names a runnable module and that no other module spells one out.
"""

from __future__ import annotations

CLI = "resilient_train"
"""``python -m resilient_train run ...``: the command line (the chaos harness starts jobs with it)."""

WORKER = "resilient_train.runner"
"""One MultiWorkerMirroredStrategy worker (runner/__main__.py)."""

WARM_STANDBY = "resilient_train.runner.process.warm_standby"
"""A process with TensorFlow imported, waiting for a worker's argv (runner/process/warm_standby.py)."""

STANDBY_TEMPLATE = "resilient_train.runner.process.standby_template"
"""One process with TensorFlow imported that forks the warm standbys (runner/process/standby_template.py)."""

PS_ROLE = "resilient_train.runner.process.ps_roles"
"""A parameter-server tier process: coordinator, parameter server or worker (runner/process/ps_roles.py)."""

INPUT_PROBE = "resilient_train.runner.input.check_input"
"""``resilient-train check``'s fresh process that builds a recipe's first batches (runner/input/check_input.py)."""

SLURM_TASK = "resilient_train.supervisor.launchers.slurm_task"
"""The wrapper around each Slurm task's worker (supervisor/launchers/slurm_task.py)."""
