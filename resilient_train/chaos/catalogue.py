"""The scenario catalogue: one TOML file per scenario, found, loaded and validated here.

Why files: a user reads the catalogue, copies a scenario and extends it without touching
the package. The engine (this package) owns the format; the repository's
``chaos/scenarios/<name>.toml`` holds the catalogue; ``chaos/README.md`` documents every
key. A scenario's name is its file's name.

Where the catalogue is (:func:`catalogue_dir`, first match wins): ``--catalogue DIR``;
``$RT_CHAOS_SCENARIOS``; ``chaos/scenarios`` next to the ``resilient_train`` package (a
clone, or an editable install); ``chaos/scenarios`` under the current directory (a clone
with a regular install). A directory named by the flag or the variable must exist: a typo
never falls back to another catalogue. A wheel does not ship the catalogue, as it does not
ship ``recipes/`` (the catalogue's default recipe): without a clone, name a directory or
run a scenario file by its path.

Validation: every mistake of a file is found, not only the first, each as one line
``FILE: KEY: received VALUE; expected WHAT`` (unknown keys with the closest accepted one,
wrong TOML types, unknown fault points, ops and events, a rank outside the job, missing
keys); they are raised together as one :class:`~resilient_train.errors.ConfigError`, a
line per mistake, which ``python -m resilient_train.chaos`` prints and exits 2 on. What
depends on the command line (a rank against ``--workers``, a ``[job]`` recipe file) is
checked in the same pass when the scenario is loaded to run (``workers=``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from resilient_train.errors import ConfigError
from resilient_train.job.config import STRAGGLER_POLICIES

from resilient_train.chaos.scenarios import (
    EVERY_ATTEMPT, EXTERNAL_OPS, PARAMETER_SERVER, SIGNALS, WORKER_POINTS, ExternalFault, Fault, Scenario,
    StorageFaults, Trigger, WorkerFault,
)

__all__ = [
    "CATALOGUE_ENV", "SUFFIX", "RENAMED", "catalogue_dir", "catalogue_names", "load_catalogue", "load_scenario",
    "by_name", "is_path", "resolve",
]

CATALOGUE_ENV = "RT_CHAOS_SCENARIOS"
CATALOGUE_IN_REPO = Path("chaos") / "scenarios"
SUFFIX = ".toml"
# Old name -> name: `run OLD` still works (seed-kill-chief-at-7 became the kill-chief-at-7).
RENAMED = {"seed-kill-chief-at-7": "kill-chief-at-7"}
RANK_WORDS = ("chief", "random", "ps-worker")  # resolved by scenarios.plan
STRATEGIES = ("mirrored", PARAMETER_SERVER)
# The events.jsonl vocabulary a trigger may count (rundir/events.py's docstring, docs/events.md).
EVENTS = (
    "run_started", "run_finished", "run_already_complete", "attempt_reached", "job_changed", "run_state",
    "worker_started", "worker_exited", "worker_failed", "worker_preempted", "worker_restarted", "first_step",
    "startup_phases",
    "fresh_start", "restored", "train_progress", "epoch_finished", "training_completed", "training_stopped",
    "world_size_changed", "input_mismatch", "input_digest", "input_torn_down", "input_teardown_waited",
    "iterator_state_sized", "preemption_requested", "preempted",
    "checkpoint_committed", "checkpoint_rejected", "checkpoint_waited", "checkpoint_failed", "checkpoint_fetched",
    "cache_rejected", "cache_write_failed", "garbage_collected", "storage_retry", "storage_claimed",
    "generation_claimed", "stale_writer_fenced",
    "gang_restart", "restart_budget_exhausted", "crash_loop_detected", "fatal_error", "launch_failed", "hang_detected",
    "standby_started", "standby_ready", "standby_lost", "standby_disabled", "standby_template_started",
    "standby_template_ready", "standby_template_lost", "model_exported", "model_export_failed",
    "ray_connected", "placement_ready", "placement_lost", "node_lost", "slurm_step_started",
    "server_started", "server_stopped", "script_output", "attempt_incomplete", "chaos_fault_injected",
    "anomaly_detected", "rolled_back", "replay_verdict", "batch_skipped", "host_suspected",
    "straggler_detected", "straggler_replaced",
)


# ------------------------------------------------------------------ where the catalogue is
def catalogue_dir(option: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None,
                  cwd: Path | None = None, package: Path | None = None) -> Path:
    """The catalogue directory (see the module docstring for the order); ConfigError if there is none.

    ``package``: the ``resilient_train`` directory (default: this one's), whose parent is the clone.
    """
    environ = os.environ if environ is None else environ
    for given, origin in ((option, "--catalogue"), (environ.get(CATALOGUE_ENV) or None, CATALOGUE_ENV)):
        if given is not None:
            if not Path(given).is_dir():
                raise ConfigError(f"Received {origin} {str(given)!r}; expected a directory of scenario files (*.toml)")
            return Path(given)
    checkout = (package or Path(__file__).resolve().parents[1]).parent / CATALOGUE_IN_REPO
    here = (cwd or Path.cwd()) / CATALOGUE_IN_REPO
    for candidate in (checkout, here):
        if candidate.is_dir():
            return candidate
    raise ConfigError(
        f"No scenario catalogue: looked in {checkout} (next to the package) and {here}; run from a clone of "
        f"resilient-train, pass --catalogue DIR or set {CATALOGUE_ENV}, or run a scenario file by its path")


def catalogue_names(directory: Path) -> list[str]:
    return sorted(path.stem for path in Path(directory).glob(f"*{SUFFIX}"))


def load_catalogue(directory: Path, *, workers: int | None = None) -> tuple[Scenario, ...]:
    """Every scenario of ``directory``, by name; ConfigError with every mistake of every file."""
    scenarios, mistakes = [], []
    for name in catalogue_names(directory):
        try:
            scenarios.append(load_scenario(Path(directory) / f"{name}{SUFFIX}", workers=workers))
        except ConfigError as exc:
            mistakes.append(str(exc))
    if mistakes:
        raise ConfigError("\n".join(mistakes))
    return tuple(scenarios)


def by_name(name: str, directory: Path | None = None, *, workers: int | None = None) -> Scenario:
    """The catalogue's scenario ``name`` (``chaos/scenarios/<name>.toml``)."""
    directory = catalogue_dir() if directory is None else Path(directory)
    path = Path(directory) / f"{name}{SUFFIX}"
    if not path.is_file() and name in RENAMED:
        name = RENAMED[name]
        path = Path(directory) / f"{name}{SUFFIX}"
    if not path.is_file():
        known = catalogue_names(directory)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"Unknown scenario {name!r}: no {path}; {hint}expected one of {', '.join(known) or '(none)'}")
    return load_scenario(path, workers=workers)


def is_path(reference: str) -> bool:
    """``run``'s argument names a file (it ends in .toml or has a directory part), not a catalogue name."""
    return reference.endswith(SUFFIX) or os.sep in reference or bool(os.altsep and os.altsep in reference)


def resolve(reference: str, directory: Path | None = None, *, workers: int | None = None) -> Scenario:
    """``run``'s argument: a scenario file's path (:func:`is_path`), else a catalogue name."""
    if is_path(reference):
        if not Path(reference).is_file():
            raise ConfigError(f"Received scenario file {reference!r}; no such file")
        return load_scenario(Path(reference), workers=workers)
    return by_name(reference, directory, workers=workers)


# ------------------------------------------------------------------ the format
Check = Callable[[Any], "str | None"]  # None: accepted; else what is expected ("an integer >= 1")


def _toml_type(value: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                       (list, "an array"), (dict, "a table")):
        if isinstance(value, kind):
            return name
    return "a date/time"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(minimum: int, *, words: tuple[str, ...] = ()) -> Check:
    expected = f"an integer >= {minimum}" + "".join(f" or {w!r}" for w in words)
    return lambda v: None if (_is_int(v) and v >= minimum) or (isinstance(v, str) and v in words) else expected


def _seconds(value: Any) -> str | None:
    return None if _is_number(value) and value > 0 else "a number of seconds > 0"


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _line(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() and "\n" not in value else "a non-empty one-line string"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _one_of(choices: tuple[str, ...], *, shown: str | None = None) -> Check:
    """One of ``choices`` (named in the message, or ``shown`` when they are too many to list)."""
    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in choices:
            return None
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6) if isinstance(value, str) else []
        return f"one of {shown or ', '.join(choices)}" + (f"; did you mean {close[0]!r}?" if close else "")
    return check


def _steps(value: Any) -> str | None:
    if isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value):
        return None
    return "an array of integers >= 0 (global steps)"


def _attempts(value: Any) -> str | None:
    if value == "all" or (isinstance(value, list) and value and all(_is_int(v) and v >= 1 for v in value)):
        return None
    return "'all' or a non-empty array of attempt numbers >= 1"


def _positive(value: Any) -> str | None:
    return None if _is_number(value) and 0 < value < float("inf") else "a number > 0"


def _expected_events(value: Any) -> str | None:
    """``[[expect.events]]``: tables naming an ``event`` of events.jsonl plus the fields it must have."""
    expected = ("an array of tables, each with 'event' (an event of events.jsonl, docs/events.md) and the "
                "fields that event must have")
    if not isinstance(value, list) or not value:
        return expected
    for item in value:
        if not isinstance(item, dict) or len(item) < 2 or item.get("event") not in EVENTS:
            return expected
    return None


def _factor(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value < float("inf")
    return None if ok else "a number >= 1 (point slow: how many times slower; loss_spike: times the loss)"


def _rank(value: Any) -> str | None:
    return None if (_is_int(value) and value >= 0) or value in RANK_WORDS else \
        f"an integer >= 0 (a rank) or one of {', '.join(repr(w) for w in RANK_WORDS)}"


_TOP: dict[str, Check] = {"summary": _line, "ci": _boolean, "job": lambda v: None, "faults": lambda v: None,
                          "expect": lambda v: None}
_TOP_REQUIRED = ("summary", "faults")
_JOB: dict[str, Check] = {
    "recipe": _string, "workers": _integer(1), "epochs": _integer(1), "steps_per_epoch": _integer(1),
    "save_every_steps": _integer(1), "hang_timeout": _seconds, "storage_timeout": _seconds,
    "startup_timeout": _seconds, "strategy": _one_of(STRATEGIES), "ps": _integer(1),
    "snapshot_every": _integer(1), "straggler_window": _seconds, "loss_spike": _positive, "keep": _integer(1),
    "straggler_policy": _one_of(STRAGGLER_POLICIES),
}
_EXPECT: dict[str, Check] = {"restored": _steps, "skipped": _steps, "events": _expected_events}
KINDS = ("worker", "external", "storage")
_WORKER: dict[str, Check] = {"kind": lambda v: None, "point": _one_of(WORKER_POINTS), "global_step": _integer(0),
                             "rank": _rank, "attempt": _integer(1, words=(EVERY_ATTEMPT,)), "signal": _one_of(SIGNALS),
                             "factor": _factor}
_WORKER_REQUIRED = ("point", "global_step")
_EXTERNAL: dict[str, Check] = {"kind": lambda v: None, "op": _one_of(EXTERNAL_OPS), "rank": _rank,
                               "when": lambda v: None, "stop_ms": _integer(1), "run_ms": _integer(1)}
_EXTERNAL_REQUIRED = ("op",)
_WHEN: dict[str, Check] = {"event": _one_of(EVENTS, shown="the events of events.jsonl (docs/events.md)"), "nth": _integer(1, words=("random",)),
                           "attempt": _integer(1, words=("any",)), "mid_epoch": _boolean, "max_nth": _integer(1)}


def _storage_options() -> dict[str, Check]:
    """The faulty:// filesystem's options, typed from FaultSpec's own fields (faultfs.py owns them)."""
    from resilient_train.chaos.faultfs import FaultSpec

    checks: dict[str, Check] = {"kind": lambda v: None, "attempts": _attempts}
    for spec_field in dataclasses.fields(FaultSpec):
        annotation = str(spec_field.type)
        if "float" in annotation:
            checks[spec_field.name] = lambda v: None if _is_number(v) else "a number"
        elif "int" in annotation:
            checks[spec_field.name] = lambda v: None if _is_int(v) else "an integer"
        else:
            checks[spec_field.name] = lambda v: None if isinstance(v, str) else "a string"
    return checks


class _Mistakes:
    """Collects one line per mistake, each naming the file, the key and the value."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, key: str, text: str) -> None:
        self.lines.append(f"{self.source}: {key}: {text}")

    def bad_value(self, key: str, value: Any, expected: str) -> None:
        """``received '7' (a string); expected an integer >= 0``: the TOML type is named when it is the mistake."""
        kind = _toml_type(value)
        same_type = (kind.split()[-1] in expected or ("number" in expected and _is_number(value))
                     or (isinstance(value, str) and expected.startswith("one of")))
        note = "" if same_type or isinstance(value, (list, dict)) else f" ({kind})"
        self.add(key, f"received {value!r}{note}; expected {expected}")

    def table(self, where: str, value: Any, checks: dict[str, Check], required: tuple[str, ...] = (),
              what: str = "") -> dict[str, Any] | None:
        """``value`` as a table whose keys all pass ``checks``; None (mistakes added) if not.

        Every key is looked at, so a table with an unknown key still has its other values checked.
        """
        if not isinstance(value, dict):
            self.bad_value(where, value, f"a table{what}")
            return None
        return self.entries(where, value, checks, required)[1]

    def entries(self, where: str, value: dict[str, Any], checks: dict[str, Check],
                required: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the entries that passed, ``value`` if every entry passed and none is missing, else None)."""
        before = len(self.lines)
        prefix = f"{where}." if where else ""
        good = {}
        for key, item in value.items():
            if key not in checks:
                close = difflib.get_close_matches(key, list(checks), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.add(f"{prefix}{key}", f"unknown key; {hint}accepted: {', '.join(checks)}")
                continue
            expected = checks[key](item)
            if expected is not None:
                self.bad_value(f"{prefix}{key}", item, expected)
            else:
                good[key] = item
        for key in required:
            if key not in value:
                self.add(f"{prefix}{key}", "missing; expected " + {
                    "summary": "a one-line description of the scenario (a string)",
                    "faults": "at least one [[faults]] table",
                }.get(key, "this key (chaos/README.md)"))
        return good, (value if len(self.lines) == before else None)

    def build(self, key: str, factory: Callable[[], Any]) -> Any:
        """``factory()``, or None with its ValueError (a dataclass's own rule) as the mistake at ``key``."""
        try:
            return factory()
        except ValueError as exc:
            text = str(exc)
            self.add(key, text[:1].lower() + text[1:] if text.startswith("Received ") else text)
            return None


def _fault(mistakes: _Mistakes, where: str, raw: Any) -> Fault | None:
    if not isinstance(raw, dict):
        mistakes.bad_value(where, raw, "a table ([[faults]])")
        return None
    kind = raw.get("kind")
    if kind is None:
        mistakes.add(f"{where}.kind", f"missing; expected one of {', '.join(KINDS)}")
        return None
    expected = _one_of(KINDS)(kind)
    if expected is not None:
        mistakes.bad_value(f"{where}.kind", kind, expected)
        return None
    if kind == "worker":
        fields = mistakes.table(where, raw, _WORKER, _WORKER_REQUIRED)
        if fields is None:
            return None
        return mistakes.build(where, lambda: WorkerFault(**{k: v for k, v in fields.items() if k != "kind"}))
    if kind == "external":
        fields = mistakes.table(where, raw, _EXTERNAL, _EXTERNAL_REQUIRED)
        when = mistakes.table(f"{where}.when", raw.get("when", {}), _WHEN, what=" (when the fault fires)")
        if fields is None or when is None:
            return None
        trigger = mistakes.build(f"{where}.when", lambda: Trigger(
            **{k: (None if k == "attempt" and v == "any" else v) for k, v in when.items()}))
        options = {k: v for k, v in fields.items() if k not in ("kind", "when")}
        return None if trigger is None else mistakes.build(where, lambda: ExternalFault(trigger=trigger, **options))
    good, fields = mistakes.entries(where, raw, _storage_options())
    attempts = good.get("attempts", [1])
    scope = None if attempts == "all" else tuple(attempts)
    options = {k: v for k, v in good.items() if k not in ("kind", "attempts")}
    # Each value against faultfs's own rules (FaultSpec), one at a time, so every bad one is named.
    checked = [mistakes.build(f"{where}.{key}", lambda: StorageFaults.of(attempts=scope, **{key: value}))
               for key, value in options.items()]
    if not set(raw) - {"kind", "attempts", "seed"}:
        faults = [k for k in _storage_options() if k not in ("kind", "attempts", "seed")]
        mistakes.add(where, f"no storage fault; expected one or more of {', '.join(faults)}")
        return None
    if fields is None or None in checked:
        return None
    return mistakes.build(where, lambda: StorageFaults.of(attempts=scope, **options))


def load_scenario(path: Path | str, *, workers: int | None = None) -> Scenario:
    """One scenario file; ConfigError with a line per mistake (see the module docstring).

    ``workers``: the command line's ``--workers`` when the scenario is about to run; then
    every rank is checked against the job's ranks (a ``[job]`` may set ``workers``) and a
    ``[job]`` recipe must be a file, in the same pass as the format.
    """
    source = str(path)
    name = Path(path).stem
    mistakes = _Mistakes(source)
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    if not name or not name.replace("-", "").isalnum() or name != name.lower():
        mistakes.add("(file name)", f"received {name!r}; expected lowercase words joined by '-' "
                                    "(the file's name is the scenario's name)")
    if "name" in raw:
        mistakes.add("name", f"unknown key; the scenario's name is its file's name ({name!r})")
        raw = {k: v for k, v in raw.items() if k != "name"}
    top = mistakes.table("", raw, _TOP, _TOP_REQUIRED)
    job_good, job = ({}, None) if not isinstance(raw.get("job", {}), dict) else \
        mistakes.entries("job", raw.get("job", {}), _JOB)
    if not isinstance(raw.get("job", {}), dict):
        mistakes.bad_value("job", raw["job"], "a table ([job])")
    expect = mistakes.table("expect", raw.get("expect", {}), _EXPECT)
    faults_raw = raw.get("faults", [])
    if not isinstance(faults_raw, list) or ("faults" in raw and not faults_raw):
        mistakes.bad_value("faults", faults_raw, "one or more [[faults]] tables")
        faults_raw = []
    faults = [_fault(mistakes, f"faults[{i}]", item) for i, item in enumerate(faults_raw, start=1)]
    if workers is not None:
        _check_for_run(mistakes, job_good, faults_raw, workers)
    if mistakes.lines or top is None or job is None or expect is None or None in faults:
        raise ConfigError("\n".join(mistakes.lines))
    restored, skipped = expect.get("restored"), expect.get("skipped")
    scenario = mistakes.build("expect", lambda: Scenario(
        name=name, summary=top["summary"], faults=tuple(faults), job=tuple(job.items()),
        expect_restored=None if restored is None else tuple(restored), ci=top.get("ci", False), source=source,
        expect_skipped=None if skipped is None else tuple(skipped),
        expect_events=tuple(dict(item) for item in expect.get("events", ()))))
    if scenario is None:
        raise ConfigError("\n".join(mistakes.lines))
    return scenario


def _check_for_run(mistakes: _Mistakes, job: dict[str, Any], faults: list[Any], workers: int) -> None:
    """Ranks inside the job (``workers``, or the ``[job]``'s; 1 + ps + workers ranks under the
    parameter-server strategy, as :meth:`Scenario.ranks` counts) and the ``[job]``'s recipe on disk."""
    if "recipe" in job and not Path(job["recipe"]).is_file():
        mistakes.add("job.recipe", f"received {job['recipe']!r}; no such file (relative to the directory you run from)")
    workers = job.get("workers", workers)
    ps_tier = job.get("strategy") == PARAMETER_SERVER
    first_worker = 1 + job.get("ps", 1) if ps_tier else 0
    ranks = first_worker + workers
    words = "'chief' or 'random'" + (" or 'ps-worker'" if ps_tier else "")
    what = f"{ranks} ranks: coordinator, ps, workers" if ps_tier else f"{workers} workers"
    for index, fault in enumerate(faults, start=1):
        # Every rank is resolved (scenarios.plan), even one that an op ignores.
        rank = fault.get("rank", 0) if isinstance(fault, dict) else 0
        if _rank(rank) is not None:
            continue  # its type is already a mistake
        if (_is_int(rank) and rank >= ranks) or (rank == "ps-worker" and not (ps_tier and first_worker < ranks)):
            mistakes.add(f"faults[{index}].rank", f"received {rank!r}; expected 0..{ranks - 1} ({what}) or {words}")
