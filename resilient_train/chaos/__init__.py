"""Fault injection for resilient-train: prove that a job survives kills and storage faults.

``python -m resilient_train.chaos`` runs scenarios (the catalogue's files, chaos/scenarios/<name>.toml of the
repository, or a user's own file; ``catalogue.py``) or random ones (``soak``) against a real job and
checks exact invariants after each: exit 0, final weights bit-identical to an uninterrupted
reference run and the same weights at every committed step (``resilient-train diff``), every
restore from the newest good commit, bounded lost steps, a clean ``resilient-train verify``,
no orphaned workers, a hung rank named as the one made to hang, nothing committed by a
fenced writer. ``python -m resilient_train.chaos check`` applies the same
invariants to any run directory. See docs/chaos.md, and chaos/README.md for the scenario files.
"""

from resilient_train.chaos.catalogue import load_catalogue, load_scenario
from resilient_train.chaos.invariants import CheckResult, check_run
from resilient_train.chaos.scenarios import ExternalFault, Scenario, StorageFaults, Trigger, WorkerFault

__all__ = [
    "Scenario", "WorkerFault", "ExternalFault", "StorageFaults", "Trigger",
    "CheckResult", "check_run", "load_scenario", "load_catalogue",
]
