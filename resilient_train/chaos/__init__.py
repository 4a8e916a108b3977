"""Fault injection for resilient-train: prove that a job survives kills and storage faults.

``python -m resilient_train.chaos`` runs named scenarios (or random ones, ``soak``) against a real job and
checks exact invariants after each: exit 0, final weights bit-identical to an uninterrupted
reference run and the same weights at every committed step (``resilient-train diff``), every
restore from the newest good commit, bounded lost steps, a clean ``resilient-train verify``,
no orphaned workers, a hung rank named as the one made to hang, nothing committed by a
fenced writer. ``python -m resilient_train.chaos check`` applies the same
invariants to any run directory. See the README section "Chaos testing".
"""

from resilient_train.chaos.invariants import CheckResult, check_run
from resilient_train.chaos.scenarios import CATALOGUE, ExternalFault, Scenario, StorageFaults, Trigger, WorkerFault

__all__ = [
    "CATALOGUE", "Scenario", "WorkerFault", "ExternalFault", "StorageFaults", "Trigger",
    "CheckResult", "check_run",
]
