"""JobConfig: everything a run needs, from flags and an optional TOML file, validated once.

The supervisor resolves the config, writes it to ``<run_dir>/attempt-<n>/job.json`` and
hands that file to every worker, so all workers of an attempt train with one config.
A worker launched by another engine (Kubernetes, Slurm) builds the same JobConfig from the
same flags.

Values a recipe can default (epochs, steps_per_epoch, global_batch_size, save_every_steps)
are ``None`` here until :meth:`JobConfig.with_recipe_defaults` fills them in on the worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from resilient_train.errors import ConfigError
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.permissions import DEFAULT_RUN_DIR_MODE, parse_mode
from resilient_train.rundir.redact import drop_redacted, merge_secrets, redact_text, split_secrets
from resilient_train.job.recipe import recipe_name

__all__ = ["JobConfig", "STEPS_PER_EXECUTION_AUTO", "HANG_TIMEOUT_AUTO", "COLLECTIVE_TIMEOUT_OFF", "check_steps_per_execution", "load_toml", "parse_set_pairs", "FALLBACK_DEFAULTS", "add_job_arguments", "job_from_args", "parse_workers"]

LAUNCHERS = ("local", "ray", "slurm")  # where workers run: supervisor/launchers/
STRATEGIES = ("mirrored", "parameter-server")  # MultiWorkerMirroredStrategy | its own tier (docs/parameter_server.md)
RAY_STRATEGIES = ("spread", "pack")

FALLBACK_DEFAULTS = {"epochs": 1, "steps_per_epoch": 100, "global_batch_size": 32, "save_every_steps": 10}


STEPS_PER_EXECUTION_AUTO = "auto"  # the runner sizes calls by time (runner/call_size.py)
HANG_TIMEOUT_AUTO = "auto"  # scaled from observed call times (supervisor/watchdog.py)
COLLECTIVE_TIMEOUT_OFF = "off"  # no limit on one collective's wait (runner/strategy.py)


def check_steps_per_execution(setting: object) -> None:
    """ValueError naming ``setting`` unless it is ``"auto"`` or an integer >= 1."""
    if setting != STEPS_PER_EXECUTION_AUTO and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 1):
        raise ValueError(f"Received steps_per_execution={setting!r}; expected 'auto' or an integer >= 1")


@dataclass(frozen=True)
class JobConfig:
    recipe: str
    workers: int = 2  # the most workers (MAX of ``--workers MIN:MAX``)
    run_dir: str = ""
    storage: str = ""
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials
    epochs: int | None = None
    steps_per_epoch: int | None = None
    global_batch_size: int | None = None
    save_every_steps: int | None = None
    seed: int = 0
    params: Mapping[str, str] = field(default_factory=dict)
    keep: int = 3
    max_restarts: int = 3
    max_preemptions: int | None = None
    grace_period: float = 30.0
    gpus_per_worker: int = 0
    progress_every_s: float = 1.0
    checkpoint_mode: str = "async"
    save_every_seconds: float | None = None
    warm_standby: bool = True
    launcher: str = "local"
    force_storage: bool = False
    ray_address: str | None = None  # None: RAY_ADDRESS, else "auto"
    ray_strategy: str = "spread"
    cpus_per_worker: float = 1.0
    storage_shared: bool = False  # a local storage path is a mount every node shares
    steps_per_execution: int | str = "auto"  # or a fixed N >= 1 (runner/call_size.py)
    eval_every_epochs: int | None = None  # None: 1 when the recipe defines eval_dataset, else 0
    eval_steps: int | None = None  # None: the whole eval_dataset
    strict_resume: bool = False
    record_indices: bool = False  # indexed recipes: per-step index digests (rundir/stepindices.py)
    max_iterator_state_bytes: int = 262144  # runner/input/iterator_state.py; 0: never save iterator state
    hang_timeout: float | str = "auto"  # seconds without progress, or auto (supervisor/watchdog.py)
    startup_timeout: float = 600.0  # seconds until an attempt's first step (and slow phases)
    storage_timeout: float = 60.0  # seconds a storage call may make no progress (checkpoint/deadline.py)
    collective_timeout: float | None = None  # seconds one collective may wait; None ("off"): no limit
    run_dir_mode: int | str = DEFAULT_RUN_DIR_MODE  # "0750" on the command line; an int once validated
    min_workers: int | None = None  # the fewest workers an elastic run goes on with; None: ``workers`` (not elastic)
    strategy: str = "mirrored"  # or "parameter-server": coordinator + ps + workers (runner/ps_roles.py)
    ps: int = 1  # --strategy parameter-server: parameter server processes

    def __post_init__(self) -> None:
        if not self.recipe:
            raise ConfigError("No recipe given; expected a recipe file or module, e.g. recipes/digits_cnn.py")
        if isinstance(self.workers, str):  # "MIN:MAX" (a flag or a TOML string), or "N"
            low, high = parse_workers(self.workers)
            if self.min_workers is not None and self.min_workers != low:
                raise ConfigError(f"Received workers={self.workers!r} and min_workers={self.min_workers!r}; "
                                  "expected one of them to give the minimum")
            object.__setattr__(self, "workers", high)
            object.__setattr__(self, "min_workers", low if low != high else None)
        _check_int("workers", self.workers, minimum=1)
        if self.min_workers is not None:
            _check_int("min_workers", self.min_workers, minimum=1)
            if self.min_workers > self.workers:
                raise ConfigError(f"Received --workers {self.min_workers}:{self.workers}; expected MIN <= MAX")
        for name in ("epochs", "steps_per_epoch", "global_batch_size"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        if self.save_every_steps is not None:
            _check_int("save_every_steps", self.save_every_steps, minimum=0)
        _check_int("seed", self.seed, minimum=0)
        _check_int("keep", self.keep, minimum=1)
        _check_int("max_restarts", self.max_restarts, minimum=0)
        if self.max_preemptions is not None:
            _check_int("max_preemptions", self.max_preemptions, minimum=0)
        _check_int("gpus_per_worker", self.gpus_per_worker, minimum=0)
        try:
            check_steps_per_execution(self.steps_per_execution)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.eval_every_epochs is not None:
            _check_int("eval_every_epochs", self.eval_every_epochs, minimum=0)
        if self.eval_steps is not None:
            _check_int("eval_steps", self.eval_steps, minimum=1)
        if not isinstance(self.grace_period, (int, float)) or self.grace_period <= 0:
            raise ConfigError(f"Received grace_period={self.grace_period!r}; expected a number of seconds > 0")
        if self.hang_timeout != HANG_TIMEOUT_AUTO and (
            isinstance(self.hang_timeout, bool) or not isinstance(self.hang_timeout, (int, float))
            or not self.hang_timeout > 0
        ):
            raise ConfigError(f"Received hang_timeout={self.hang_timeout!r}; expected 'auto' or a number of seconds > 0")
        if isinstance(self.startup_timeout, bool) or not isinstance(self.startup_timeout, (int, float)) \
                or not self.startup_timeout > 0:
            raise ConfigError(f"Received startup_timeout={self.startup_timeout!r}; expected a number of seconds > 0")
        if isinstance(self.storage_timeout, bool) or not isinstance(self.storage_timeout, (int, float)) \
                or not 0 < self.storage_timeout < math.inf:
            raise ConfigError(
                f"Received storage_timeout={self.storage_timeout!r}; expected a finite number of seconds > 0"
            )
        if self.collective_timeout == COLLECTIVE_TIMEOUT_OFF:
            object.__setattr__(self, "collective_timeout", None)
        if self.collective_timeout is not None and (
            isinstance(self.collective_timeout, bool) or not isinstance(self.collective_timeout, (int, float))
            or not 0 < self.collective_timeout < math.inf
        ):
            raise ConfigError(
                f"Received collective_timeout={self.collective_timeout!r}; expected 'off' or a finite number of seconds > 0"
            )
        if self.global_batch_size is not None and self.strategy == "mirrored":  # PS: one step is one worker's batch
            indivisible = self.size_not_dividing(self.global_batch_size)
            if indivisible is not None and not self.elastic:
                raise ConfigError(
                    f"Received global_batch_size={self.global_batch_size} with workers={self.workers}; "
                    "expected a global batch size divisible by the number of workers"
                )
            if indivisible is not None:
                raise ConfigError(
                    f"Received global_batch_size={self.global_batch_size} with --workers "
                    f"{self.min_workers}:{self.workers}; {indivisible} workers cannot split it evenly (expected "
                    "every size in MIN..MAX to divide the global batch, which stays the same at every size)"
                )
        if self.checkpoint_mode not in ("async", "sync"):
            raise ConfigError(f"Received checkpoint_mode={self.checkpoint_mode!r}; expected 'async' or 'sync'")
        if self.save_every_seconds is not None and (
            isinstance(self.save_every_seconds, bool)
            or not isinstance(self.save_every_seconds, (int, float))
            or not self.save_every_seconds > 0
        ):
            raise ConfigError(
                f"Received save_every_seconds={self.save_every_seconds!r}; expected a number of seconds > 0"
            )
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"Received launcher={self.launcher!r}; expected one of {list(LAUNCHERS)}")
        _check_ray_fields(self)
        _check_strategy_fields(self)
        if not isinstance(self.warm_standby, bool):
            raise ConfigError(f"Received warm_standby={self.warm_standby!r}; expected true or false")
        _check_int("max_iterator_state_bytes", self.max_iterator_state_bytes, minimum=0)
        if not isinstance(self.record_indices, bool):
            raise ConfigError(f"Received record_indices={self.record_indices!r}; expected true or false")
        if not isinstance(self.force_storage, bool):
            raise ConfigError(f"Received force_storage={self.force_storage!r}; expected true or false")
        try:
            object.__setattr__(self, "run_dir_mode", parse_mode(self.run_dir_mode))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.run_dir:
            object.__setattr__(self, "run_dir", str(Path("runs") / recipe_name(self.recipe)))
        if not self.storage:
            object.__setattr__(self, "storage", str(RunDir(self.run_dir).checkpoints))

    @property
    def elastic(self) -> bool:
        """``--workers MIN:MAX`` with MIN < MAX: the supervisor may resize the group."""
        return self.min_workers is not None and self.min_workers < self.workers

    @property
    def world_sizes(self) -> range:
        """Every worker count the run may train at, MIN..MAX (just ``workers`` when not elastic)."""
        return range(self.min_workers if self.min_workers is not None else self.workers, self.workers + 1)

    def size_not_dividing(self, global_batch_size: int) -> int | None:
        """The first world size that does not divide ``global_batch_size``; None when all do."""
        return next((n for n in self.world_sizes if global_batch_size % n), None)

    def with_recipe_defaults(self, defaults: Mapping[str, int]) -> "JobConfig":
        """Fill the values left unset from the recipe's DEFAULTS, then the fallbacks."""
        updates = {
            key: defaults.get(key, FALLBACK_DEFAULTS[key])
            for key in FALLBACK_DEFAULTS
            if getattr(self, key) is None
        }
        return dataclasses.replace(self, **updates)

    def to_json(self) -> str:
        """The job as ``job.json`` holds it: credentials as ``***`` (see :meth:`secrets`)."""
        values = dataclasses.asdict(self)
        values["storage_options"], _ = split_secrets(self.storage_options)
        values["storage"] = redact_text(self.storage)
        if self.ray_address is not None:
            values["ray_address"] = redact_text(self.ray_address)
        return json.dumps(values, indent=2, default=dict)

    def secrets(self) -> dict[str, Any]:
        """What :meth:`to_json` left out, for a worker's environment (``RT_STORAGE_SECRETS``).

        ``{"storage_options": <only the secret values, nested as given>, "storage": <the
        URL, when it has user info>}``; ``{}`` when the job holds no credential.
        """
        _, options = split_secrets(self.storage_options)
        found: dict[str, Any] = {"storage_options": options} if options else {}
        if redact_text(self.storage) != self.storage:
            found["storage"] = self.storage
        return found

    def with_secrets(self, secrets: Mapping[str, Any]) -> "JobConfig":
        """The job read from ``job.json`` with :meth:`secrets` put back.

        A ``***`` no secret replaced is dropped, so the storage library falls back to its
        own credential chain (``AWS_*`` variables, ``~/.aws``) instead of sending ``***``.
        """
        options = drop_redacted(merge_secrets(self.storage_options, secrets.get("storage_options") or {}))
        return dataclasses.replace(self, storage_options=options, storage=secrets.get("storage") or self.storage)

    @classmethod
    def from_json(cls, text: str) -> "JobConfig":
        return cls.from_mapping(json.loads(text), source="job file")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, source: str) -> "JobConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        normalised = {key.replace("-", "_"): value for key, value in values.items()}
        unknown = sorted(set(normalised) - names)
        if unknown:
            raise ConfigError(f"Unknown key(s) {unknown} in {source}; accepted: {sorted(names)}")
        return cls(**normalised)


def _check_ray_fields(job: "JobConfig") -> None:
    if job.ray_strategy not in RAY_STRATEGIES:
        raise ConfigError(f"Received ray_strategy={job.ray_strategy!r}; expected one of {list(RAY_STRATEGIES)}")
    cpus = job.cpus_per_worker
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus > 0:
        raise ConfigError(f"Received cpus_per_worker={cpus!r}; expected a number of CPUs > 0")
    if job.ray_address is not None and (not isinstance(job.ray_address, str) or not job.ray_address):
        raise ConfigError(f"Received ray_address={job.ray_address!r}; expected host:port, ray://host:port or auto")
    if not isinstance(job.storage_shared, bool):
        raise ConfigError(f"Received storage_shared={job.storage_shared!r}; expected true or false")


def parse_workers(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2), ``"1:4"`` -> (1, 4); ConfigError naming the text otherwise."""
    low, sep, high = str(text).partition(":")
    try:
        bounds = (int(low), int(high)) if sep else (int(low), int(low))
    except ValueError:
        raise ConfigError(f"Received --workers {text!r}; expected N or MIN:MAX (integers >= 1)") from None
    if min(bounds) < 1:
        raise ConfigError(f"Received --workers {text!r}; expected N or MIN:MAX with both >= 1")
    if bounds[0] > bounds[1]:
        raise ConfigError(f"Received --workers {text!r}; expected MIN <= MAX")
    return bounds


def _check_strategy_fields(job: "JobConfig") -> None:
    if job.strategy not in STRATEGIES:
        raise ConfigError(f"Received strategy={job.strategy!r}; expected one of {list(STRATEGIES)}")
    _check_int("ps", job.ps, minimum=1)
    if job.strategy == "parameter-server" and job.elastic:
        raise ConfigError(
            f"Received --workers {job.min_workers}:{job.workers} with strategy='parameter-server'; expected a fixed N "
            "(the parameter-server tier restarts a lost worker in place instead of resizing)"
        )
    if job.strategy == "parameter-server" and job.launcher != "local":
        raise ConfigError(
            f"Received launcher={job.launcher!r} with strategy='parameter-server'; expected 'local' "
            "(the parameter-server tier places its processes on this host only, docs/parameter_server.md)"
        )


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"Received {name}={value!r}; expected an integer >= {minimum}")


def load_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"Config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Config file {path!r} is not valid TOML: {exc}") from None


def parse_set_pairs(pairs: list[str], *, flag: str = "--set") -> dict[str, str]:
    """``["lr=0.1", "path=/x"]`` -> ``{"lr": "0.1", "path": "/x"}``."""
    result: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"Received {flag} {item!r}; expected key=value")
        result[key.strip()] = value
    return result


# ------------------------------------------------------------ the job's flags
# Shared by `resilient-train run`, `resilient-train worker` and the worker process
# (python -m resilient_train.runner), so they live with JobConfig, not in the CLI.

_JOB_FLAGS = (
    "workers", "run_dir", "storage", "epochs", "steps_per_epoch", "global_batch_size",
    "save_every_steps", "seed", "keep", "max_restarts", "max_preemptions", "grace_period",
    "gpus_per_worker", "checkpoint_mode", "save_every_seconds",
    "warm_standby", "launcher", "steps_per_execution",
    "force_storage", "ray_address", "ray_strategy", "cpus_per_worker", "storage_shared",
    "eval_every_epochs", "eval_steps", "strict_resume", "record_indices", "max_iterator_state_bytes", "hang_timeout", "startup_timeout",
    "collective_timeout", "run_dir_mode", "storage_timeout", "strategy", "ps",
)


def _positive_or_zero_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _workers(text: str) -> int | str:
    """``N`` as an int (checked by JobConfig as before); ``MIN:MAX`` as text, which JobConfig parses."""
    return text if ":" in text else _positive_or_zero_int(text)


def _steps_per_execution(text: str) -> int | str:
    return "auto" if text == "auto" else _positive_or_zero_int(text)


def _hang_timeout(text: str) -> float | str:
    if text == HANG_TIMEOUT_AUTO:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or auto") from None


def _collective_timeout(text: str) -> float | str:
    if text == COLLECTIVE_TIMEOUT_OFF:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or off") from None


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``worker`` (all default to None = config file / recipe)."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="TOML file with the same keys as the flags")
    add("--workers", type=_workers, metavar="N|MIN:MAX",
        help="worker processes (default 2); MIN:MAX: elastic, go on with fewer (down to MIN) when nodes are lost "
        "and grow back to MAX at the next save when they return (docs/elastic.md)")
    add("--run-dir", help="where logs, events and summary go (default runs/<recipe>)")
    add("--storage", metavar="URL", help="checkpoint storage: path, file://, s3://, gs://, memory:// (default <run-dir>/checkpoints)")
    add("--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="passed to the fsspec filesystem (credentials are never written to the run dir; prefer the backend's "
        "environment variables, e.g. AWS_SECRET_ACCESS_KEY)")
    add("--storage-timeout", type=float, metavar="SECONDS",
        help="a storage call that moves no bytes for this long is retried; a store that stays stalled fails the "
        "save (restartable) instead of blocking it (default 60)")
    add("--run-dir-mode", metavar="MODE",
        help="octal mode of the run dir and what it creates, e.g. 0750 to share with your group (default 0700: "
        "files 0600; a stricter umask is kept)")
    add("--epochs", type=_positive_or_zero_int)
    add("--steps-per-epoch", type=_positive_or_zero_int)
    add("--global-batch-size", type=_positive_or_zero_int)
    add("--save-every-steps", type=_positive_or_zero_int, metavar="K", help="checkpoint every K global steps (0: only at epoch ends)")
    add("--save-every-seconds", type=float, metavar="T",
        help="also checkpoint when T seconds passed since the last save (the chief's clock; all workers agree on the step)")
    add("--checkpoint-mode", choices=("async", "sync"),
        help="async (default): block only to snapshot, persist in the background; sync: write and upload before training on")
    add("--seed", type=_positive_or_zero_int)
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    add("--keep", type=_positive_or_zero_int, help="committed checkpoints to keep (default 3)")
    add("--max-restarts", type=_positive_or_zero_int, help="gang restarts after failures (default 3)")
    add("--max-preemptions", type=_positive_or_zero_int, help="cap on restarts after preemptions (default: unlimited)")
    add("--grace-period", type=float, help="seconds workers get to save after SIGTERM (default 30)")
    add("--gpus-per-worker", type=_positive_or_zero_int, help="CUDA_VISIBLE_DEVICES slice per local worker (default 0)")
    add("--steps-per-execution", type=_steps_per_execution, metavar="N",
        help="training steps per compiled call, or auto: as many as take ~0.1 s; saves, stop requests and "
        "progress happen between calls (default auto)")
    add("--eval-every-epochs", type=_positive_or_zero_int, metavar="N",
        help="evaluate on the recipe's eval_dataset every N epochs (default 1 when it has one; 0: never)")
    add("--eval-steps", type=_positive_or_zero_int, metavar="S", help="evaluate at most S batches (default: all)")
    add("--launcher", choices=LAUNCHERS, help="where workers run (default local: child processes of this host)")
    add("--force-storage", action="store_true", default=None,
        help="take over a storage that another run (another run id) owns; its OWNER.json is rewritten")
    add("--ray-address", metavar="ADDR", help="--launcher ray: the cluster to join (default RAY_ADDRESS, else auto)")
    add("--ray-strategy", choices=RAY_STRATEGIES,
        help="--launcher ray: spread (default) puts workers on different nodes, pack fills nodes first")
    add("--cpus-per-worker", type=float, metavar="N", help="--launcher ray: CPUs each worker's bundle reserves (default 1)")
    add("--storage-shared", action="store_true", default=None,
        help="--launcher ray: the local --storage path is a mount every node shares (otherwise refused)")
    add("--warm-standby", action=argparse.BooleanOptionalAction, default=None,
        help="keep workers with TensorFlow already imported waiting, so a restart skips the import (default on)")
    add("--hang-timeout", type=_hang_timeout, metavar="SECONDS|auto",
        help="restart the group when no worker finished a step for this long (default auto: "
        "max(60 s, 10 x the longest call seen); see docs/failures.md, Hangs)")
    add("--startup-timeout", type=float, metavar="SECONDS",
        help="allowance until an attempt's first step, and for evaluation and blocking saves; a worker "
        "waits half of it for its peers' addresses to answer (default 600)")
    add("--collective-timeout", type=_collective_timeout, metavar="SECONDS|off",
        help="fail a collective that waits longer than this (exit 4, the group is restarted); each collective "
        "then holds a thread for that long (default off; see docs/failures.md, Hangs)")
    add("--strategy", choices=STRATEGIES,
        help="mirrored (default): MultiWorkerMirroredStrategy; parameter-server: a coordinator, --ps parameter "
        "servers and --workers workers (docs/parameter_server.md)")
    add("--ps", type=_positive_or_zero_int, metavar="P", help="--strategy parameter-server: parameter servers (default 1)")
    add("--strict-resume", action="store_true", default=None,
        help="stop (exit 3) when a resumed epoch's input differs from the one recorded with the checkpoint")
    add("--max-iterator-state-bytes", type=_positive_or_zero_int, metavar="BYTES",
        help="dataset recipes without start_step: save each worker's tf.data iterator state with mid-epoch "
        "checkpoints when it is at most this large, so re-entry replays nothing (default 262144; 0: never)")
    add("--record-indices", action="store_true", default=None,
        help="indexed recipes: write a digest of each global step's example indices to "
        "attempt-<n>/step-indices.txt (one all-gather per step; docs/recipes.md)")


def job_from_args(args: argparse.Namespace) -> JobConfig:
    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    values = {key.replace("-", "_"): value for key, value in values.items()}
    for name in _JOB_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.recipe:
        values["recipe"] = args.recipe
    if "recipe" not in values:
        raise ConfigError("No recipe given; expected `resilient-train run RECIPE` (e.g. recipes/digits_cnn.py)")
    params = dict(values.pop("params", {}) or {})
    params.update(parse_set_pairs(args.set))
    values["params"] = params
    from resilient_train.checkpoint import parse_storage_options

    options = dict(values.pop("storage_options", {}) or {})
    options.update(parse_storage_options(args.storage_option))
    values["storage_options"] = options
    return JobConfig.from_mapping(values, source=args.config or "flags")
