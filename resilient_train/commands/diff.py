"""``resilient-train diff A B``: the first committed step at which two runs stop being the same run.

A run's *trajectory* is what it committed, step by step: the weights digest of every
committed checkpoint (``weights_sha256``, model_state.py's one digest) and the digest of
each epoch's first input batch (runner/input/determinism.py). Both are in the run dir's
``events.jsonl`` (``checkpoint_committed``'s ``weights_sha256``, ``input_digest``), which
retention never deletes, and in each committed manifest, which it does. So A and B may be
run dirs (their events; storage only for a run whose events predate those fields) or
storage URLs (the manifests still there).

The comparison lines up the global steps both runs committed and names the first one
whose weights differ, and the last one that matched before it; then the first epoch whose
first batch differs (input that is not a pure function of the seed and epoch shows up
there before it shows up in the weights); then what differs in the two jobs' fingerprints
(seed, params, workers, recipe source), which usually explains the rest. Steps only one
run committed (a preemption's extra save, retention) are listed, not compared. The batches a
run skipped after a deterministic anomaly (``--deterministic-anomaly skip``: the events'
``batch_skipped``, the manifests' ``skipped_steps``) are named for each run: a run that skipped
a batch the other trained on diverges from that step on, and this says why.

Exit codes (errors.py): 0 the trajectories are identical over at least one common
committed step; 1 they diverge, or they have no committed step in common (a comparison
that compared nothing must not pass); 2 usage: A or B is neither a run dir nor a
checkpoint root with a committed checkpoint, or storage cannot be read (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, StorageError

__all__ = ["add_parser", "main", "Trajectory", "Divergence", "compare_trajectories", "load_trajectory",
           "format_text", "as_record", "diff_command"]

_INPUT_DIGEST = "input_digest"  # the event and the manifest's extra key (runner/input/determinism.py)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("diff", help="the first committed step where two runs diverge")
    parser.add_argument("a", metavar="A", help="run dir or storage URL of the first run")
    parser.add_argument("b", metavar="B", help="run dir or storage URL of the second run")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options

    return diff_command(args.a, args.b, parse_storage_options(args.storage_option), as_json=args.json)


@dataclass(frozen=True)
class Trajectory:
    """What one run committed: ``weights`` global_step -> weights_sha256, ``inputs`` epoch ->
    first-batch sha256, and its job fingerprint (a dict, job/fingerprint.py) when recorded.

    Where a step or an epoch was recorded more than once (a restored attempt re-enters the
    epoch it stopped in), the last record wins: that is what the run went on from.
    """

    source: str
    weights: Mapping[int, str] = field(default_factory=dict)
    inputs: Mapping[int, str] = field(default_factory=dict)
    fingerprint: Mapping[str, Any] | None = None
    skipped: tuple[int, ...] = ()  # global steps whose batches were skipped (runner/health/anomaly_policy.py)


@dataclass(frozen=True)
class Divergence:
    """The comparison of two trajectories; :attr:`identical` decides the exit code."""

    common_steps: tuple[int, ...]
    only_a: tuple[int, ...]
    only_b: tuple[int, ...]
    first_divergent_step: int | None
    last_matching_step: int | None
    common_epochs: tuple[int, ...]
    first_divergent_epoch: int | None
    fingerprint_changes: tuple[tuple[str, Any, Any], ...]
    skipped_a: tuple[int, ...] = ()  # skipped by A only
    skipped_b: tuple[int, ...] = ()  # skipped by B only

    @property
    def identical(self) -> bool:
        return bool(self.common_steps) and self.first_divergent_step is None and self.first_divergent_epoch is None


def compare_trajectories(a: Trajectory, b: Trajectory) -> Divergence:
    """Line up ``a`` and ``b`` (pure: no I/O)."""
    from resilient_train.job.fingerprint import JobFingerprint, compare

    common = tuple(sorted(set(a.weights) & set(b.weights)))
    first_step = next((step for step in common if a.weights[step] != b.weights[step]), None)
    matched = [step for step in common if first_step is None or step < first_step]
    epochs = tuple(sorted(set(a.inputs) & set(b.inputs)))
    first_epoch = next((epoch for epoch in epochs if a.inputs[epoch] != b.inputs[epoch]), None)
    changes: tuple[tuple[str, Any, Any], ...] = ()
    if a.fingerprint is not None and b.fingerprint is not None:
        changes = tuple(compare(JobFingerprint.from_dict(a.fingerprint), JobFingerprint.from_dict(b.fingerprint)))
    return Divergence(
        common_steps=common,
        only_a=tuple(sorted(set(a.weights) - set(b.weights))),
        only_b=tuple(sorted(set(b.weights) - set(a.weights))),
        first_divergent_step=first_step,
        last_matching_step=matched[-1] if matched else None,
        common_epochs=epochs,
        first_divergent_epoch=first_epoch,
        fingerprint_changes=changes,
        skipped_a=tuple(sorted(set(a.skipped) - set(b.skipped))),
        skipped_b=tuple(sorted(set(b.skipped) - set(a.skipped))),
    )


# ------------------------------------------------------------------ loading


def _from_events(records: Iterable[Mapping[str, Any]]
                 ) -> tuple[dict[int, str], dict[int, str], str | None, tuple[int, ...]]:
    """weights, inputs, the storage URL (``run_started``) and the skipped steps of a run dir's events."""
    weights: dict[int, str] = {}
    inputs: dict[int, str] = {}
    storage = None
    skipped: set[int] = set()
    for record in records:
        name = record.get("event")
        if name == "batch_skipped" and isinstance(record.get("global_step"), int):
            skipped.add(record["global_step"])
        elif name == "checkpoint_committed" and isinstance(record.get("weights_sha256"), str):
            weights[int(record["global_step"])] = record["weights_sha256"]
        elif name == _INPUT_DIGEST and isinstance(record.get("sha256"), str):
            inputs[int(record["epoch"])] = record["sha256"]
        elif name == "run_started" and record.get("storage"):
            storage = str(record["storage"])
    return weights, inputs, storage, tuple(sorted(skipped))


def _from_manifests(manifests: Iterable[Any]
                    ) -> tuple[dict[int, str], dict[int, str], Mapping[str, Any] | None, tuple[int, ...]]:
    """weights, inputs, the newest fingerprint and skip list of committed manifests (ascending steps)."""
    weights: dict[int, str] = {}
    inputs: dict[int, str] = {}
    fingerprint = None
    skipped: tuple[int, ...] = ()
    for manifest in manifests:
        if isinstance(manifest.extra.get("skipped_steps"), list):
            skipped = tuple(int(step) for step in manifest.extra["skipped_steps"])
        weights[manifest.global_step] = manifest.weights_sha256
        recorded = manifest.extra.get(_INPUT_DIGEST)
        if isinstance(recorded, Mapping) and isinstance(recorded.get("sha256"), str) and "epoch" in recorded:
            inputs[int(recorded["epoch"])] = recorded["sha256"]
        if isinstance(manifest.extra.get("fingerprint"), Mapping):
            fingerprint = manifest.extra["fingerprint"]
    return weights, inputs, fingerprint, skipped


def _committed_manifests(url: str, storage_options: Mapping[str, Any]) -> tuple[str, list[Any]]:
    from resilient_train.checkpoint import CheckpointStore

    store = CheckpointStore(url, storage_options)
    return store.url, [info.manifest for info in store.list() if info.manifest is not None]


def load_trajectory(location: str, storage_options: Mapping[str, Any]) -> Trajectory:
    """A run dir's trajectory (its events), else a checkpoint root's (its manifests).

    Raises ``ValueError`` naming ``location`` when it is neither; ``StorageError`` when
    storage cannot be read.
    """
    from resilient_train.rundir.events import read_events
    from resilient_train.rundir.layout import RunDir

    path = Path(location)
    if "://" not in location and not path.exists():
        raise ValueError(f"{location} does not exist; expected a run dir or a storage URL")
    run_dir = RunDir(path)
    if "://" not in location and run_dir.events.is_file():
        weights, inputs, storage, skipped = _from_events(read_events(run_dir.events))
        fingerprint = _read_json(run_dir.fingerprint)
        source = f"{location} (events.jsonl)"
        if not weights:  # events written before checkpoint_committed carried the digest
            url = storage or str(run_dir.checkpoints)
            url, manifests = _committed_manifests(url, storage_options)
            weights, stored_inputs, stored_fingerprint, stored_skips = _from_manifests(manifests)
            inputs = inputs or stored_inputs
            fingerprint = fingerprint or stored_fingerprint
            skipped = skipped or stored_skips
            source = f"{location} (manifests in {url})"
        return Trajectory(source, weights, inputs, fingerprint, skipped)
    url, manifests = _committed_manifests(location, storage_options)
    if not manifests:
        raise ValueError(f"{location} is neither a run dir (no events.jsonl) nor a checkpoint root with a "
                         "committed checkpoint")
    weights, inputs, fingerprint, skipped = _from_manifests(manifests)
    return Trajectory(f"{url} (manifests)", weights, inputs, fingerprint, skipped)


def _read_json(path: Path) -> Mapping[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ------------------------------------------------------------------ output


def _short(digest: str) -> str:
    return digest[:12]


def _describe_change(name: str, old: Any, new: Any) -> str:
    if name == "recipe_sha256":
        return f"recipe source {_short(str(old))} -> {_short(str(new))}"
    return f"{name} {old!r} -> {new!r}"


def format_text(a: Trajectory, b: Trajectory, result: Divergence) -> list[str]:
    """The human view: one fact per line, the verdict last; epochs counted from 1, as the console does
    (``as_record``, the --json view, keeps the events' 0-based epoch)."""
    lines = [f"A: {a.source}: {len(a.weights)} committed steps, {len(a.inputs)} epoch input digests",
             f"B: {b.source}: {len(b.weights)} committed steps, {len(b.inputs)} epoch input digests"]
    if result.only_a or result.only_b:
        lines.append(f"committed by one run only (not compared): A {list(result.only_a)}, B {list(result.only_b)}")
    step = result.first_divergent_step
    if step is not None:
        lines.append(f"first divergent global step: {step} (A {_short(a.weights[step])}, B {_short(b.weights[step])})")
        last = result.last_matching_step
        lines.append(f"last matching global step: {last if last is not None else 'none'}")
    elif result.common_steps:
        lines.append(f"weights identical at all {len(result.common_steps)} common committed steps "
                     f"({result.common_steps[0]}..{result.common_steps[-1]})")
    else:
        lines.append("no committed global step in common: nothing to compare")
    epoch = result.first_divergent_epoch
    if epoch is not None:
        lines.append(f"first divergent epoch input: epoch {epoch + 1} (first batch A {_short(a.inputs[epoch])}, "
                     f"B {_short(b.inputs[epoch])})")
    elif result.common_epochs:
        lines.append(f"epoch inputs identical in all {len(result.common_epochs)} common epochs")
    if result.skipped_a or result.skipped_b:
        lines.append(f"batches skipped by one run only (deterministic anomalies, --deterministic-anomaly skip): "
                     f"A {list(result.skipped_a)}, B {list(result.skipped_b)}; the weights differ from the first "
                     "of those steps on")
    elif a.skipped:
        lines.append(f"batches skipped by both runs (deterministic anomalies): {list(a.skipped)}")
    if result.fingerprint_changes:
        lines.append("job fingerprint differs: " + ", ".join(_describe_change(*c) for c in result.fingerprint_changes))
    elif a.fingerprint is None or b.fingerprint is None:
        lines.append("job fingerprint: not recorded for " + ("A" if a.fingerprint is None else "B"))
    else:
        lines.append("job fingerprint: identical")
    lines.append("identical trajectories" if result.identical else "diverged")
    return lines


def as_record(a: Trajectory, b: Trajectory, result: Divergence) -> dict[str, Any]:
    step, epoch = result.first_divergent_step, result.first_divergent_epoch
    return {
        "a": a.source,
        "b": b.source,
        "identical": result.identical,
        "common_steps": list(result.common_steps),
        "only_a": list(result.only_a),
        "only_b": list(result.only_b),
        "first_divergent_step": step,
        "last_matching_step": result.last_matching_step,
        "weights_sha256": {"a": a.weights[step], "b": b.weights[step]} if step is not None else None,
        "common_epochs": list(result.common_epochs),
        "first_divergent_epoch": epoch,
        "input_sha256": {"a": a.inputs[epoch], "b": b.inputs[epoch]} if epoch is not None else None,
        "fingerprint_changes": [{"field": name, "a": old, "b": new} for name, old, new in result.fingerprint_changes],
        "skipped_steps": {"a": list(a.skipped), "b": list(b.skipped)},
    }


def diff_command(a: str, b: str, storage_options: Mapping[str, Any], *, as_json: bool,
                 out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Compare the runs at ``a`` and ``b``; return the exit code (see above)."""
    from resilient_train.rundir import events

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    events.configure(None, console=None)  # the store's progress events are not this command's output
    try:
        left, right = load_trajectory(a, storage_options), load_trajectory(b, storage_options)
    except (ValueError, StorageError) as exc:
        err.write(f"resilient-train diff: {exc}\n")
        return EXIT_USAGE
    result = compare_trajectories(left, right)
    if as_json:
        out.write(json.dumps(as_record(left, right, result), indent=2) + "\n")
    else:
        out.write("\n".join(format_text(left, right, result)) + "\n")
    return EXIT_OK if result.identical else EXIT_FAILURE
