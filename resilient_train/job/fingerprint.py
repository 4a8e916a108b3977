"""The job fingerprint: what a run's weights are a function of, kept with the run.

A run dir (and its storage) holds one job. Re-running "the same command" after an edit to
the recipe, its params or ``--seed`` used to resume (or report "already completed") with
the old state: weights from one job continued under another, and a digest that matches
neither. The fingerprint records what decides the weights:

    recipe_sha256, params, seed, epochs, steps_per_epoch, global_batch_size, workers, strategy

(``strategy``: a run dir trained under MultiWorkerMirroredStrategy is not continued under
the parameter-server tier, or back, without ``--accept-changes``; fingerprints written
before it was recorded leave it unknown.)

It is written to ``<run-dir>/fingerprint.json`` when a run starts and into every
checkpoint manifest's ``extra`` (so a new run dir pointed at old storage is checked too).
A re-run compares; any difference stops with exit 2, listing what changed and how to go
on: a new ``--run-dir``/``--storage`` for a new job, or ``--accept-changes`` to continue
this one under the new values (the fingerprint is then replaced and ``job_changed`` is
emitted). Before the first checkpoint is committed a change is simply recorded: there are
no weights of the old job yet (the usual case: a recipe bug fixed after a failed start).

One change is allowed without asking: **more epochs**. Training a finished (or running)
job for longer is what a user who raises ``--epochs`` means; the first ``epochs`` epochs
are the same, so the result equals a run started with the larger value. It emits
``job_changed`` with ``accepted: "more epochs"``. Fewer epochs is a change like any other.

A field is ``None`` when it cannot be known without importing the recipe (a computed
``DEFAULTS`` or ``PARAMS``); unknown fields are never reported as changed.

No TensorFlow here: the supervisor computes the fingerprint from the recipe's source.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from resilient_train.job.config import FALLBACK_DEFAULTS, JobConfig
from resilient_train.errors import ConfigError
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.layout import FINGERPRINT
from resilient_train.job.recipe import check_recipe_source, resolve_params

__all__ = ["JobFingerprint", "FINGERPRINT_FILE", "fingerprint_for_supervisor", "fingerprint_for_worker",
           "compare", "check_and_record", "guard_job"]

FINGERPRINT_FILE = FINGERPRINT  # the run-dir name (rundir/layout.py)
_SIZES = ("epochs", "steps_per_epoch", "global_batch_size")


@dataclass(frozen=True)
class JobFingerprint:
    recipe_sha256: str
    params: Mapping[str, Any] | None
    seed: int
    epochs: int | None
    steps_per_epoch: int | None
    global_batch_size: int | None
    workers: int
    strategy: str | None = None  # None: recorded before strategies were (never "changed")

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["params"] = dict(self.params) if self.params is not None else None
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "JobFingerprint":
        names = {f.name for f in dataclasses.fields(cls)}
        fields: dict[str, Any] = {name: values.get(name) for name in names}
        return cls(**fields)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# A worker hashes its recipe once (at start, worker.py): the source it imported, not a
# later edit of the file while it trains.
_sha256_as_imported = functools.lru_cache(maxsize=8)(_sha256)


def fingerprint_for_worker(job: JobConfig, recipe_source: str, params: Mapping[str, Any]) -> JobFingerprint:
    """From what a worker knows: the job with recipe defaults filled in, resolved params."""
    return JobFingerprint(
        recipe_sha256=_sha256_as_imported(Path(recipe_source).resolve()),
        params=_plain(params),
        seed=job.seed,
        epochs=job.epochs,
        steps_per_epoch=job.steps_per_epoch,
        global_batch_size=job.global_batch_size,
        workers=job.workers,
        strategy=job.strategy,
    )


def fingerprint_for_supervisor(job: JobConfig) -> JobFingerprint:
    """From the recipe's source: literal DEFAULTS/PARAMS resolve; computed ones stay None."""
    from resilient_train.job.preflight import literal_recipe_dicts

    path = check_recipe_source(job.recipe)
    literals = literal_recipe_dicts(path)
    defaults, recipe_params = literals["DEFAULTS"], literals["PARAMS"]
    sizes: dict[str, int | None] = {}
    for name in _SIZES:
        flag = getattr(job, name)
        if flag is not None:
            sizes[name] = flag
        elif defaults is not None:
            sizes[name] = defaults.get(name, FALLBACK_DEFAULTS[name])
        else:
            sizes[name] = None
    params = _plain(resolve_params(recipe_params, job.params)) if recipe_params is not None else None
    return JobFingerprint(recipe_sha256=_sha256(path.resolve()), params=params, seed=job.seed, workers=job.workers,
                          strategy=job.strategy, **sizes)


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-comparable params (what a manifest round trip would give back)."""
    return json.loads(json.dumps(dict(params), sort_keys=True, default=str))


def compare(recorded: JobFingerprint, current: JobFingerprint) -> list[tuple[str, Any, Any]]:
    """``(field, recorded, current)`` for every field known on both sides that differs."""
    changes = []
    for name in (f.name for f in dataclasses.fields(JobFingerprint)):
        old, new = getattr(recorded, name), getattr(current, name)
        if name == "params" and old is not None and new is not None:
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    changes.append((f"params.{key}", old.get(key), new.get(key)))
        elif old is not None and new is not None and old != new:
            changes.append((name, old, new))
    return changes


def _describe(changes: list[tuple[str, Any, Any]]) -> str:
    parts = []
    for name, old, new in changes:
        if name == "recipe_sha256":
            parts.append("recipe source edited")
        else:
            parts.append(f"{name} {old!r} -> {new!r}")
    return ", ".join(parts)


def _as_fields(changes: list[tuple[str, Any, Any]]) -> dict[str, dict[str, Any]]:
    return {name: {"was": old, "now": new} for name, old, new in changes}


def _only_more_epochs(changes: list[tuple[str, Any, Any]]) -> bool:
    return len(changes) == 1 and changes[0][0] == "epochs" and changes[0][2] > changes[0][1]


def guard_job(job: JobConfig, manifest_extra: Mapping[str, Any] | None, *, accept_changes: bool) -> dict[str, Any] | None:
    """The supervisor's call: :func:`check_and_record` for ``job`` in its run dir.

    ``--force-storage`` ("its checkpoints become this run's") accepts the storage's job as
    changed too; what does not fit the model is then the worker's fatal error to name.
    """
    accepted = "--force-storage" if job.force_storage and not accept_changes else accept_changes
    return check_and_record(Path(job.run_dir), fingerprint_for_supervisor(job), manifest_extra,
                            accept_changes=accepted)


def check_and_record(
    run_dir: Path,
    current: JobFingerprint,
    manifest_extra: Mapping[str, Any] | None,
    *,
    accept_changes: bool | str,
) -> dict[str, Any] | None:
    """Compare ``current`` with the run dir's and the newest manifest's fingerprint.

    ``manifest_extra`` is the newest committed manifest's ``extra``, None when nothing is
    committed: then a change has no old weights to mix with and is recorded, not refused.
    Returns the ``job_changed`` event fields when the run goes on under changed values
    (nothing committed yet, more epochs, or ``--accept-changes``), None when nothing
    changed. Raises ``ConfigError`` (exit 2) listing the changes otherwise. Writes
    ``fingerprint.json``.
    """
    path = Path(run_dir) / FINGERPRINT_FILE
    recorded = _read(path)
    if recorded is None and manifest_extra and isinstance(manifest_extra.get("fingerprint"), Mapping):
        recorded = JobFingerprint.from_dict(manifest_extra["fingerprint"])
    changes = compare(recorded, current) if recorded is not None else []
    event = None
    if changes and manifest_extra is None:
        # Nothing committed yet (e.g. the first attempt failed on a recipe bug that is now
        # fixed): no weights of the old job exist to be mixed with the new one.
        event = {"changes": _as_fields(changes), "accepted": "no checkpoint committed yet"}
    elif changes:
        if not (accept_changes or _only_more_epochs(changes)):
            raise ConfigError(
                f"{run_dir} holds a job with other settings ({_describe(changes)}). To start a new run, "
                "pass a new --run-dir (and --storage if set); to continue this one as changed, add --accept-changes"
            )
        event = {
            "changes": _as_fields(changes),
            "accepted": "more epochs" if _only_more_epochs(changes) else
                        accept_changes if isinstance(accept_changes, str) else "--accept-changes",
        }
    if recorded is None or changes:
        _write(path, current)
    return event


def _read(path: Path) -> JobFingerprint | None:
    try:
        return JobFingerprint.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); remove it to record the current job") from None


def _write(path: Path, fingerprint: JobFingerprint) -> None:
    write_atomic(path, json.dumps(fingerprint.to_dict(), indent=2, sort_keys=True) + "\n")
