"""The chaos report: one table row per scenario run, and chaos-report.json with everything."""

from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any, Iterable

from resilient_train.chaos.harness import JobSpec, ScenarioResult

__all__ = ["table", "write_report"]

COLUMNS = ("scenario", "faults injected", "restarts", "lost steps", "digest match",
           "checkpoints verified", "verdict", "wall time")


def _row(result: ScenarioResult) -> tuple[str, ...]:
    return (
        f"{result.scenario} (seed {result.seed})",
        f"{result.faults_injected}/{result.faults_planned}",
        str(result.check.restarts),
        str(result.check.lost_steps),
        _digest_cell(result),
        str(result.check.checkpoints_verified) + (f" (+{len(result.check.checkpoints_bad)} bad)"
                                                  if result.check.checkpoints_bad else ""),
        "PASS" if result.passed else "FAIL",
        f"{result.wall_s:.1f} s",
    )


def _digest_cell(result: ScenarioResult) -> str:
    """``yes``, or ``NO`` with the first committed step whose weights left the reference's. A run
    that skipped batches is compared with its re-run (harness.py), and left the reference at the skip."""
    check = result.check
    if check.strategy == "parameter-server":
        return "n/a (parameter-server)"
    if check.digest_match and check.skipped_steps:
        return f"yes, the re-run's (skipped {', '.join(map(str, check.skipped_steps))})"
    if check.digest_match and check.first_divergent_step is None:
        return "yes"
    if check.first_divergent_step is not None:
        return f"NO (from step {check.first_divergent_step}; same until {check.last_matching_step})"
    return "NO"


def table(results: Iterable[ScenarioResult]) -> str:
    results = list(results)
    rows = [COLUMNS] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for result in results:
        reasons = list(result.problems) + list(result.check.violations)
        for reason in reasons:
            lines.append(f"  {result.scenario}: {reason}")
    return "\n".join(lines)


def write_report(path: Path, results: Iterable[ScenarioResult], *, spec: JobSpec, reference: dict[str, str],
                 command: list[str]) -> dict[str, Any]:
    results = list(results)
    report = {
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "job": {k: v for k, v in spec.resolved().__dict__.items()},
        "references": reference,
        "passed": all(r.passed for r in results),
        "scenarios": [r.to_dict() for r in results],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report
