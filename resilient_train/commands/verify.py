"""The ``verify`` and ``ls`` commands: what is in a checkpoint root, and can it be restored.

Exit codes (a contract with scripts and CI; see errors.py):

* 0 (EXIT_OK): at least one checkpoint is committed and every committed one checks out
  (uncommitted leftovers are not checkpoints and do not fail the check);
* 1 (EXIT_FAILURE): at least one committed checkpoint is torn or corrupt, or a manifest
  does not parse (``corrupt manifest``), or nothing is committed at all (``no committed
  checkpoint``): a check that found nothing to check must not pass; the output still
  names the newest restorable one, which is what a restart would use;
* 2 (EXIT_USAGE): the URL is not a checkpoint root (a local path that does not exist, a
  file, a run directory) or the storage cannot be read (bad URL, no bucket, no
  permission, retries exhausted); one or two lines on stderr, no traceback.

``ls`` is ``verify`` without hashing (sizes from the listing only), so it is fast.

Both say when the newest restorable checkpoint is not what an uninterrupted run would have
at its step (its manifest's ``extra["inexact"]``: an inexact resume in its history, e.g. a
``dataset()`` with its own entropy): a ``not exact:`` line, and ``exact``/``inexact`` per
checkpoint in ``--json``. The checkpoint is still intact and restorable: the exit code does
not change.

Both also name the batches a run skipped after deterministic anomalies (``skipped batches:``,
from the newest restorable checkpoint's ``extra["skipped_steps"]``; ``skipped_steps`` per
checkpoint in ``--json``): a resume or re-run of the job skips them too.

``verify --deep`` then restores the newest checkpoint that passed (``--all``: each) into
the recipe's model and optimizer (see "--deep" below); any variable missing, unexpected or
of another shape or dtype, a counter that differs from the manifest, or a weights digest
that differs from the manifest's is exit 1. A recipe that cannot be loaded is exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from resilient_train.checkpoint.store import CheckpointInfo, CheckpointStore, Status
from resilient_train.supervisor.console import checkpoint_position, inexact_text
from resilient_train.errors import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CheckpointCorruptError,
                                   CheckpointIncompatibleError, ConfigError, RecipeError, StorageError)

__all__ = ["add_parser", "main", "format_rows", "verify_command", "ls_command", "status_text", "newest_restorable",
           "DeepOptions", "DeepResult", "deep_check", "compare_layouts", "expected_layout", "found_layout"]

def add_parser(subparsers: Any) -> None:
    """Both subcommands: ``verify`` and ``ls`` take the same arguments."""
    for name, help_text in (("verify", "verify every checkpoint (hashes all files)"), ("ls", "list checkpoints (no hashing)")):
        parser = subparsers.add_parser(name, help=help_text)
        parser.add_argument("url", help="storage URL (the --storage of the run)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
        if name == "verify":
            parser.add_argument("--deep", action="store_true",
                                help="also restore the newest checkpoint into the recipe's model and optimizer")
            parser.add_argument("--all", action="store_true", help="--deep: restore every committed checkpoint")
            parser.add_argument("--newest", type=int, default=None, metavar="N",
                                help="--deep: restore the N newest committed checkpoints (default 1)")
            parser.add_argument("--recipe", help="--deep: the recipe (default: the one the manifests record)")
            parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                                help="--deep: recipe parameter (default: the job's)")
        parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options

    options = parse_storage_options(args.storage_option)
    if args.command == "ls":
        return ls_command(args.url, options, as_json=args.json)
    deep = None
    if args.deep:
        from resilient_train.job.config import parse_set_pairs

        if args.newest is not None and (args.newest < 1 or args.all):
            print(f"resilient-train verify: --newest {args.newest}: expected N >= 1, and not with --all", file=sys.stderr)
            return EXIT_USAGE
        deep = DeepOptions(recipe=args.recipe, overrides=parse_set_pairs(args.set), all=args.all,
                           newest=args.newest or 1)
    elif args.all or args.recipe or args.set or args.newest is not None:
        print("resilient-train verify: --all, --newest, --recipe and --set need --deep", file=sys.stderr)
        return EXIT_USAGE
    if deep is None:
        return verify_command(args.url, options, as_json=args.json, hash=True, deep=None)
    from resilient_train.commands.tf_stderr import tensorflow_chatter_filtered

    with tensorflow_chatter_filtered():  # --deep loads TensorFlow in this process
        return verify_command(args.url, options, as_json=args.json, hash=True, deep=deep)


# "where" is the console's wording (1-based epochs: ``epoch 2, step 100``, ``end of epoch 1``);
# the --json fields keep the manifest's 0-based epoch and step_in_epoch.
_HEADER = ("global_step", "where", "size", "status")


def status_text(info: CheckpointInfo) -> str:
    """``ok``, ``uncommitted``, ``torn: missing file X``, ``corrupt: sha256 mismatch in X``."""
    if info.status in (Status.TORN, Status.CORRUPT) and info.detail:
        return f"{info.status.value}: {info.detail}"
    if _corrupt_manifest(info):
        return f"corrupt manifest: {info.detail[len(_UNREADABLE):]}"
    return info.status.value


_UNREADABLE = "manifest unreadable: "


def _corrupt_manifest(info: CheckpointInfo) -> bool:
    """A MANIFEST.json exists but does not parse: a damaged commit, not an unfinished upload."""
    return info.status is Status.UNCOMMITTED and info.detail.startswith(_UNREADABLE)


def _not_a_checkpoint_root(store: CheckpointStore) -> str | None:
    """Why a local ``store`` root cannot hold checkpoints, or None (remote roots: listing decides)."""
    if not store.local:
        return None
    root = Path(store.root)
    if not root.exists():
        return f"{store.url} does not exist; expected a checkpoint root (the --storage of a run)"
    if not root.is_dir():
        return f"{store.url} is a file; expected a checkpoint root directory (the --storage of a run)"
    if (root / "run.json").is_file() and not any(root.glob("ckpt-*")):
        return (f"{store.url} is a run directory, not a checkpoint root; its checkpoints are in "
                f"{root / 'checkpoints'} unless the run was given --storage")
    return None


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable: the loop returns at GiB


def format_rows(infos: Iterable[CheckpointInfo]) -> str:
    """A fixed-width table, one row per checkpoint directory, ascending global_step."""
    rows = [_HEADER]
    for info in infos:
        manifest = info.manifest
        rows.append((
            str(info.global_step),
            checkpoint_position({"epoch": manifest.epoch, "step_in_epoch": manifest.step_in_epoch}) if manifest else "-",
            _human(info.size),
            status_text(info),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER) - 1)]
    aligned = [str.rjust, str.ljust, str.rjust]  # global_step, where, size
    lines = ["  ".join(align(cell, w) for align, cell, w in zip(aligned, row[:-1], widths)) + "  " + row[-1]
             for row in rows]
    return "\n".join(lines)


def _skipped(info: CheckpointInfo) -> list[int]:
    """The global steps whose batches the run skipped up to this checkpoint (its manifest's
    ``extra["skipped_steps"]``, runner/health/anomaly_policy.py)."""
    steps = info.manifest.extra.get("skipped_steps") if info.manifest is not None else None
    return [int(step) for step in steps] if isinstance(steps, list) else []


def newest_restorable(infos: Iterable[CheckpointInfo]) -> CheckpointInfo | None:
    good = [info for info in infos if info.status is Status.OK]
    return good[-1] if good else None


def _as_json(url: str, infos: list[CheckpointInfo], newest: CheckpointInfo | None) -> dict[str, Any]:
    checkpoints: list[dict[str, Any]] = [
        {
            "global_step": info.global_step,
            "epoch": info.manifest.epoch if info.manifest else None,
            "step_in_epoch": info.manifest.step_in_epoch if info.manifest else None,
            "size": info.size,
            "status": info.status.value,
            "detail": info.detail,
            "path": info.path,
            "exact": not info.manifest.inexact if info.manifest else None,
            "inexact": info.manifest.inexact if info.manifest else [],
            "skipped_steps": _skipped(info),
        }
        for info in infos
    ]
    return {"url": url, "checkpoints": checkpoints, "newest_restorable": newest.global_step if newest else None}


def verify_command(
    url: str,
    storage_options: Mapping[str, Any] | None,
    *,
    as_json: bool,
    hash: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    store: CheckpointStore | None = None,
    deep: DeepOptions | None = None,
) -> int:
    """Print the state of every checkpoint under ``url``; return the exit code (see above).

    ``store`` may be passed instead of building one from ``url`` (tests, the faulty fs).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        store = store or CheckpointStore(url, storage_options)
        problem = _not_a_checkpoint_root(store)
        if problem is not None:
            err.write(f"error: {problem}\n")
            return EXIT_USAGE
        infos = store.verify() if hash else store.list()
    except StorageError as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    newest = newest_restorable(infos)
    bad = [info for info in infos if info.status in (Status.TORN, Status.CORRUPT) or _corrupt_manifest(info)]
    committed = [info for info in infos if info.manifest is not None]
    report = None
    if deep is not None:
        try:
            report = run_deep(store, infos, deep)
        except (ConfigError, RecipeError, StorageError) as exc:
            err.write(f"error: {exc}\n")
            return EXIT_USAGE
    deep_failed = report is not None and any(not result.consistent for result in report.results)
    if as_json:
        record = _as_json(store.url, infos, newest)
        if deep is not None:
            record["deep"] = report.to_dict() if report is not None else None
        out.write(json.dumps(record, indent=2) + "\n")
    else:
        out.write(f"{store.url}\n")
        out.write((format_rows(infos) if infos else "no checkpoints") + "\n")
        if newest:
            out.write(f"newest restorable: global_step {newest.global_step} ({newest.path})\n")
            if newest.manifest is not None and newest.manifest.inexact:
                out.write(f"not exact: global_step {newest.global_step} is not an uninterrupted run's: "
                          f"{inexact_text(newest.manifest.inexact)}\n")
            if _skipped(newest):
                out.write(f"skipped batches: global steps {', '.join(str(s) for s in _skipped(newest))} (deterministic "
                          "anomalies, --deterministic-anomaly skip); a resume or re-run of this job skips them too\n")
        else:
            out.write("newest restorable: none\n")
        if bad:
            noun = "checkpoint" if len(bad) == 1 else "checkpoints"
            out.write(f"{len(bad)} committed {noun} failed {'verification' if hash else 'the listing check'}\n")
        elif not committed:
            out.write(f"no committed checkpoint under {store.url}\n")
        if report is not None:
            out.write("\n".join(report.lines()) + "\n")
    return EXIT_FAILURE if bad or not committed or deep_failed else EXIT_OK


def ls_command(url: str, storage_options: Mapping[str, Any] | None, *, as_json: bool,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``verify`` without hashing: statuses from the listing and manifests only."""
    return verify_command(url, storage_options, as_json=as_json, hash=False, out=out, err=err)


# --------------------------------------------------------------------------- --deep
#
# The second level of verification: the bytes are intact (hashes), but do they restore
# into the job's model? Each selected checkpoint is restored into the recipe's model and
# optimizer, built in this process on CPU without a strategy, through the export path's
# restore code (commands/export.py ``training_checkpoint``, runner/state/ckpt_layout.py
# ``restore``). Before restoring, the variables the recipe expects are laid next to the
# ones the files hold, so a misfit names every variable (a restore alone stops at the first).


_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_NOT_VARIABLES = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter" + _VALUE_SUFFIX)


@dataclass(frozen=True)
class DeepOptions:
    """``verify --deep``: ``recipe`` None means the recipe the manifests record."""

    recipe: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    all: bool = False
    newest: int = 1  # how many of the newest checkpoints that passed the hash check (``all``: every one)

    def __post_init__(self) -> None:
        if isinstance(self.newest, bool) or not isinstance(self.newest, int) or self.newest < 1:
            raise ValueError(f"Received newest={self.newest!r}; expected an int >= 1")


@dataclass(frozen=True)
class Slot:
    """One variable of a checkpoint layout: its checkpoint key, a readable name, shape, dtype."""

    key: str
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "shape": list(self.shape), "dtype": self.dtype}

    def label(self) -> str:
        short = self.key[: -len(_VALUE_SUFFIX)] if self.key.endswith(_VALUE_SUFFIX) else self.key
        return self.name if self.name == short else f"{self.name} ({short})"


def compare_layouts(expected: Mapping[str, Slot], found: Mapping[str, Slot]) -> dict[str, Any]:
    """``missing`` (expected, not in the files), ``unexpected`` (in the files only) and
    ``mismatched`` (``(expected, found)`` pairs with another shape or dtype), by key."""
    return {
        "missing": [expected[key] for key in sorted(expected.keys() - found.keys())],
        "unexpected": [found[key] for key in sorted(found.keys() - expected.keys())],
        "mismatched": [(expected[key], found[key]) for key in sorted(expected.keys() & found.keys())
                       if (expected[key].shape, expected[key].dtype) != (found[key].shape, found[key].dtype)],
    }


def _escape(name: str) -> str:
    """A child's name as tf.train.Checkpoint writes it in a key ('.' and '/' escaped)."""
    return name.replace(".", "..").replace("/", ".S")


def expected_layout(checkpoint: Any) -> dict[str, Slot]:
    """The variables of ``checkpoint``'s object graph under the keys tf.train.Checkpoint gives
    them: the first path in breadth-first order of named children. Keras variables are
    named by their ``path`` (``sequential/dense/kernel``), others by their key."""
    import collections

    import keras
    import tensorflow as tf

    view = tf.train.TrackableView(checkpoint)
    seen = {id(checkpoint)}
    queue: collections.deque[tuple[Any, str]] = collections.deque([(checkpoint, "")])
    layout: dict[str, Slot] = {}
    while queue:
        obj, path = queue.popleft()
        for name, child in view.children(obj).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{_escape(name)}" if path else _escape(name)
            if isinstance(child, (tf.Variable, keras.Variable)):
                key = child_path + _VALUE_SUFFIX
                readable = child.path if isinstance(child, keras.Variable) else child_path
                layout[key] = Slot(key, readable, tuple(int(d) for d in child.shape),
                                   tf.as_dtype(child.dtype).name)
            else:
                queue.append((child, child_path))
    return layout


def found_layout(prefix: Path) -> dict[str, Slot]:
    """The variables a tf.train.Checkpoint at ``prefix`` holds, by key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    return {
        key: Slot(key, key[: -len(_VALUE_SUFFIX)] if key.endswith(_VALUE_SUFFIX) else key,
                  tuple(int(d) for d in shapes[key]), dtypes[key].name)
        for key in shapes if key not in _NOT_VARIABLES
    }


@dataclass
class DeepResult:
    """What restoring one checkpoint showed; ``consistent`` decides the exit code."""

    global_step: int
    missing: list[Slot] = field(default_factory=list)
    unexpected: list[Slot] = field(default_factory=list)
    mismatched: list[tuple[Slot, Slot]] = field(default_factory=list)
    restored: bool = False
    error: str = ""
    counters: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> manifest, restored
    weights_sha256: dict[str, str] = field(default_factory=dict)  # manifest, restored
    variables: int = 0

    @property
    def counter_mismatches(self) -> list[str]:
        return [name for name, pair in self.counters.items() if pair["manifest"] != pair["restored"]]

    @property
    def consistent(self) -> bool:
        return (self.restored and not (self.missing or self.unexpected or self.mismatched or self.error)
                and not self.counter_mismatches
                and self.weights_sha256.get("manifest") == self.weights_sha256.get("restored"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "consistent": self.consistent,
            "restored": self.restored,
            "error": self.error or None,
            "missing": [slot.to_dict() for slot in self.missing],
            "unexpected": [slot.to_dict() for slot in self.unexpected],
            "mismatched": [{"name": e.name, "key": e.key, "expected": {"shape": list(e.shape), "dtype": e.dtype},
                            "found": {"shape": list(f.shape), "dtype": f.dtype}} for e, f in self.mismatched],
            "counters": self.counters,
            "weights_sha256": self.weights_sha256,
        }

    def lines(self) -> list[str]:
        if self.consistent:
            return [f"global_step {self.global_step}: consistent: {self.variables} variables restored, counters "
                    f"match the manifest, weights_sha256 {self.weights_sha256['restored'][:12]}"]
        lines = [f"global_step {self.global_step}: inconsistent"]
        lines += [f"  missing variable {s.label()}: expected {s.shape} {s.dtype}" for s in self.missing]
        lines += [f"  unexpected variable {s.label()}: {s.shape} {s.dtype}" for s in self.unexpected]
        lines += [f"  mismatched variable {e.label()}: expected {e.shape} {e.dtype}, found {f.shape} {f.dtype}"
                  for e, f in self.mismatched]
        if self.error:
            lines.append(f"  not restored: {self.error}")
        for name in self.counter_mismatches:
            pair = self.counters[name]
            lines.append(f"  counter {name}: manifest {pair['manifest']}, restored {pair['restored']}")
        if self.restored and self.weights_sha256["manifest"] != self.weights_sha256["restored"]:
            lines.append(f"  weights_sha256: manifest {self.weights_sha256['manifest'][:12]}, "
                         f"restored {self.weights_sha256['restored'][:12]}")
        return lines


def deep_check(recipe: Any, params: Mapping[str, Any], manifest: Any, prefix: Path, where: str) -> DeepResult:
    """Restore the checkpoint at ``prefix`` into ``recipe``'s model and optimizer and compare
    it with its ``manifest``: variables, counters, weights digest."""
    from resilient_train.commands.export import training_checkpoint
    from resilient_train.runner.state import ckpt_layout
    from resilient_train.runner.state.model_state import weights_digest

    checkpoint, model, counters = training_checkpoint(recipe, params)
    expected = expected_layout(checkpoint)
    result = DeepResult(manifest.global_step, variables=len(expected),
                        **compare_layouts(expected, found_layout(prefix)))
    if result.missing or result.mismatched:
        result.error = "the variables above do not fit the recipe's model and optimizer"
        return result
    try:
        # unexpected ones are listed above
        ckpt_layout.restore(checkpoint, prefix, where=where, recipe_name=recipe.name, partial=True)
    except CheckpointIncompatibleError as exc:
        result.error = str(exc)
        return result
    result.restored = True
    result.counters = {name: {"manifest": getattr(manifest, name), "restored": int(variable.numpy())}
                       for name, variable in counters.items()}
    result.weights_sha256 = {"manifest": manifest.weights_sha256, "restored": weights_digest(model)}
    return result


@dataclass(frozen=True)
class DeepReport:
    recipe: str
    params: Mapping[str, Any]
    recipe_sha256: str
    fingerprint_recipe_sha256: str | None
    results: list[DeepResult]

    @property
    def recipe_changed(self) -> bool:
        return self.fingerprint_recipe_sha256 is not None and self.fingerprint_recipe_sha256 != self.recipe_sha256

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "params": dict(self.params), "recipe_sha256": self.recipe_sha256,
                "fingerprint_recipe_sha256": self.fingerprint_recipe_sha256, "recipe_changed": self.recipe_changed,
                "checkpoints": [result.to_dict() for result in self.results]}

    def lines(self) -> list[str]:
        lines = [f"deep check: restored into recipe {self.recipe} on CPU, without a strategy"]
        if self.recipe_changed:
            lines.append(f"note: {self.recipe} has sha256 {self.recipe_sha256[:12]}; the job that wrote these "
                         f"checkpoints had {str(self.fingerprint_recipe_sha256)[:12]} (the recipe file changed)")
        for result in self.results:
            lines += result.lines()
        failed = [r for r in self.results if not r.consistent]
        if failed:
            noun = "checkpoint" if len(failed) == 1 else "checkpoints"
            lines.append(f"{len(failed)} {noun} failed the deep check")
        return lines


def _recipe_for(options: DeepOptions, manifest: Any) -> tuple[Any, dict[str, Any], str | None]:
    """The recipe, its params (the job's, then ``--set``) and the fingerprint's recipe sha256."""
    from resilient_train.commands.export import script_recipe
    from resilient_train.job.recipe import is_fit_script, load_recipe, resolve_params

    spec = options.recipe or manifest.extra.get("recipe_source")
    if not spec:
        raise ConfigError(f"the manifest of global step {manifest.global_step} records no recipe file "
                          "(written before recipe_source was recorded); pass --recipe")
    fingerprint = manifest.extra.get("fingerprint")
    fingerprint = fingerprint if isinstance(fingerprint, Mapping) else {}
    sha = fingerprint.get("recipe_sha256")
    sha = sha if isinstance(sha, str) else None
    if is_fit_script(str(spec)):  # its model rebuilt as the run built it, as ``export`` does
        if options.overrides:
            raise ConfigError(f"--set {', '.join(options.overrides)} with the fit() script {spec}: a script has no "
                              "parameters")
        return script_recipe(str(spec), int(fingerprint.get("seed", 0) or 0)), {}, sha
    recipe = load_recipe(str(spec))
    base = dict(recipe.params)
    recorded = fingerprint.get("params")
    if isinstance(recorded, Mapping):
        base.update({key: value for key, value in recorded.items() if key in base})
    return recipe, resolve_params(base, options.overrides), sha


def run_deep(store: CheckpointStore, infos: list[CheckpointInfo], options: DeepOptions) -> DeepReport | None:
    """Restore the newest (``options.all``: every) checkpoint that passed the hash check."""
    import hashlib
    import tempfile

    from resilient_train.rundir import events

    good = [info for info in infos if info.status is Status.OK and info.manifest is not None]
    if not good:
        return None
    selected = good if options.all else good[-options.newest:]
    events.configure(None, console=None)  # the store's fetch events are not this command's output
    recipe, params, recorded_sha = _recipe_for(options, selected[-1].manifest)
    results = []
    for info in selected:
        with tempfile.TemporaryDirectory(prefix="rt-verify-") as scratch:
            try:
                manifest, local_dir = store.fetch(info.global_step, Path(scratch))
            except CheckpointCorruptError as exc:  # changed since the hash check (a writer, a retention)
                results.append(DeepResult(info.global_step, error=f"fetch failed: {exc}"))
                continue
            results.append(deep_check(recipe, params, manifest, local_dir / "ckpt", info.path))
    sha = hashlib.sha256(Path(recipe.source).read_bytes()).hexdigest()  # as job/fingerprint.py hashes it
    return DeepReport(recipe.source, params, sha, recorded_sha, results)
