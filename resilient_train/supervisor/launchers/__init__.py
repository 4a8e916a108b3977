"""Launchers: where workers run (see api.py). ``make_launcher`` picks one by name."""

from __future__ import annotations

from resilient_train.job.config import LAUNCHERS, JobConfig
from resilient_train.errors import ConfigError
from resilient_train.supervisor.launchers.api import Launcher, WorkerHandle, WorkerSpec

__all__ = ["Launcher", "WorkerHandle", "WorkerSpec", "make_launcher"]


def make_launcher(job: JobConfig) -> Launcher:
    """The launcher ``job.launcher`` names; engines are imported only when chosen."""
    if job.launcher == "local":
        from resilient_train.supervisor.launchers.local import LocalLauncher

        return LocalLauncher(job)
    if job.launcher == "ray":
        from resilient_train.supervisor.launchers.ray import RayLauncher

        return RayLauncher(job)
    if job.launcher == "slurm":
        from resilient_train.supervisor.launchers.slurm import SlurmLauncher

        return SlurmLauncher(job)
    raise ConfigError(f"Received launcher={job.launcher!r}; expected one of {list(LAUNCHERS)}")
