"""JobConfig: everything a run needs, from flags and an optional TOML file, validated once.

The supervisor resolves the config, writes it to ``<run_dir>/attempt-<n>/job.json`` and
hands that file to every worker, so all workers of an attempt train with one config.
A worker launched by another engine (Kubernetes, Slurm) builds the same JobConfig from the
same flags.

Values a recipe can default (epochs, steps_per_epoch, global_batch_size, save_every_steps)
are ``None`` here until :meth:`JobConfig.with_recipe_defaults` fills them in on the worker.

Each field says in its metadata how it is set from outside (an :class:`Option`): by a flag
(of ``resilient-train run``, ``resilient-train worker`` and ``python -m
resilient_train.runner``, which all call :func:`add_job_arguments`), by a key of the
``--config`` TOML file, or both; ``recipe`` by the RECIPE argument each command adds itself.
A field without a flag says why. The flags, the flag -> field mapping and the TOML keys are
generated from that one table (:data:`JOB_OPTIONS`), so a flag cannot be parsed and then
dropped, and a new field cannot be added without saying how it is set (import fails).
``job.json`` carries every field, whatever its routes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from resilient_train.checkpoint.options import parse_storage_options
from resilient_train.cluster.notices import AUTO as NOTICE_AUTO, SETTINGS as NOTICE_SETTINGS
from resilient_train.errors import ConfigError
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.permissions import DEFAULT_RUN_DIR_MODE, parse_mode
from resilient_train.rundir.redact import drop_redacted, merge_secrets, redact_text, split_secrets
from resilient_train.job.recipe import recipe_name

__all__ = ["JobConfig", "Option", "JOB_OPTIONS", "TOML_KEYS", "STEPS_PER_EXECUTION_AUTO", "HANG_TIMEOUT_AUTO",
           "COLLECTIVE_TIMEOUT_OFF", "SNAPSHOT_EVERY_OFF", "SNAPSHOT_EVERY_AUTO", "check_steps_per_execution", "load_toml", "parse_set_pairs", "FALLBACK_DEFAULTS",
           "add_job_arguments", "job_from_args", "parse_workers", "SHARDED_SAVE_SETTINGS"]

LAUNCHERS = ("local", "ray", "slurm")  # where workers run: supervisor/launchers/
STRATEGIES = ("mirrored", "parameter-server")  # MultiWorkerMirroredStrategy | its own tier (docs/parameter_server.md)
RAY_STRATEGIES = ("spread", "pack")
CHECKPOINT_MODES = ("async", "sync")
SHARDED_SAVE_SETTINGS = ("auto", "on", "off")  # --sharded-save (runner/state/sharded_save.py)
READ_ONCE_SETTINGS = ("on", "off")  # --read-once (runner/state/read_once.py)
LOSS_SPIKE_OFF = "off"  # --loss-spike off (runner/health/spikes.py)
REPLICA_CHECK_OFF = "off"  # --replica-check-every off (runner/health/replicas.py)
TRANSIENTS_OFF = "off"  # --max-transients-per-host off (runner/health/anomaly_policy.py)
STRAGGLER_OFF = "off"  # --straggler-threshold off (runner/health/stragglers.py)
# --straggler-policy (runner/health/stragglers.py): what the run does about a named straggler.
STRAGGLER_WARN = "warn"
STRAGGLER_REPLACE = "replace"
STRAGGLER_POLICIES = (STRAGGLER_WARN, STRAGGLER_REPLACE)
# The provider of a replaced straggler's notice marker (runner/health/straggler_replace.py writes it,
# the supervisor and its launchers read it: its host is avoided where a launcher can, never doomed).
STRAGGLER_PROVIDER = "straggler"
# --on-anomaly (runner/health/anomaly_policy.py): what a non-finite step does to the run.
ON_ANOMALY_ROLLBACK = "rollback"
ON_ANOMALY_STOP = "stop"
ON_ANOMALY_IGNORE = "ignore"
ON_ANOMALY_CHOICES = (ON_ANOMALY_ROLLBACK, ON_ANOMALY_STOP, ON_ANOMALY_IGNORE)
# --deterministic-anomaly: what a rollback's replay does when the anomaly comes back at its step
DETERMINISTIC_SKIP = "skip"
DETERMINISTIC_STOP = "stop"
DETERMINISTIC_CHOICES = (DETERMINISTIC_SKIP, DETERMINISTIC_STOP)

FALLBACK_DEFAULTS = {"epochs": 1, "steps_per_epoch": 100, "global_batch_size": 32, "save_every_steps": 10}


STEPS_PER_EXECUTION_AUTO = "auto"  # the runner sizes calls by time (runner/training/call_size.py)
HANG_TIMEOUT_AUTO = "auto"  # scaled from observed call times (supervisor/watchdog.py)
COLLECTIVE_TIMEOUT_OFF = "off"  # no limit on one collective's wait (runner/training/strategy.py)
SNAPSHOT_EVERY_OFF = "off"  # no memory tier: a crash loses the steps since the last commit (runner/state/memory_tier.py)
SNAPSHOT_EVERY_AUTO = "auto"  # the default: an interval measured at start (runner/state/memory_tier.py, AutoInterval)


def check_steps_per_execution(setting: object) -> None:
    """ValueError naming ``setting`` unless it is ``"auto"`` or an integer >= 1."""
    if setting != STEPS_PER_EXECUTION_AUTO and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 1):
        raise ValueError(f"Received steps_per_execution={setting!r}; expected 'auto' or an integer >= 1")


# ------------------------------------------------------------ how a field is set from outside
@dataclass(frozen=True)
class Option:
    """How one JobConfig field is set: its flag with the flag's argparse settings, and its TOML key.

    ``flag`` None: no flag (``why`` says why; ``argument``: the RECIPE positional, which each
    command adds with its own help). ``toml`` False: not a ``--config`` key (CLI-only with a
    flag, internal without one: set by code and read back from job.json only).
    A flag's value lands in the field of the same name (the argparse ``dest``). ``pairs``: a
    repeatable ``KEY=VALUE`` flag parsed by that function and merged over the file's table of
    the same key. A flag's value is checked twice: its text by ``parse`` or ``choices``
    (argparse: exit 2), the value by ``JobConfig.__post_init__`` (ConfigError naming it).
    """

    flag: str | None = None
    toml: bool = True
    argument: bool = False
    why: str = ""
    help: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | type[argparse.Action] | None = None  # "store_true", argparse.BooleanOptionalAction
    pairs: Callable[[list[str]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.flag is not None and not self.flag.startswith("--"):
            raise ValueError(f"Received flag={self.flag!r}; expected a long flag, --name")
        if self.flag is None and not (self.why or self.argument):
            raise ValueError("Received an option without a flag and without why; expected the reason it has none")

    def add_to(self, parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
        """Add this flag to ``parser``; its value is ``args.<dest>``, None when not given ([] for pairs)."""
        settings: dict[str, Any] = {"help": self.help, "metavar": self.metavar, "type": self.parse,
                                    "choices": self.choices, "action": "append" if self.pairs else self.action}
        given = {key: value for key, value in settings.items() if value is not None}  # store_true takes no type
        if self.flag is None:
            raise ValueError(f"Received an option without a flag for {dest}; expected one to add")
        return parser.add_argument(self.flag, dest=dest, default=[] if self.pairs else None, **given)


_OPTION = "option"  # the key of a JobConfig field's metadata that holds its Option


def _flag(flag: str, **settings: Any) -> dict[str, Option]:
    """Field metadata: set by ``flag`` and by the ``--config`` key of the field's name (unless toml=False)."""
    return {_OPTION: Option(flag=flag, **settings)}


def _toml_only(why: str) -> dict[str, Option]:
    """Field metadata: a ``--config`` key without a flag, and why it has none."""
    return {_OPTION: Option(why=why)}


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _workers(text: str) -> int | str:
    """``N`` as an int (checked by JobConfig as before); ``MIN:MAX`` as text, which JobConfig parses."""
    return text if ":" in text else _integer(text)


def _loss_spike(text: str) -> float | str:
    if text == LOSS_SPIKE_OFF:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'off'") from None


def _straggler_threshold(text: str) -> float | str:
    if text == STRAGGLER_OFF:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'off'") from None


def _replica_check_every(text: str) -> int | str:
    return REPLICA_CHECK_OFF if text == REPLICA_CHECK_OFF else _integer(text)


def _max_transients(text: str) -> int | str:
    return TRANSIENTS_OFF if text == TRANSIENTS_OFF else _integer(text)


def _steps_per_execution(text: str) -> int | str:
    return STEPS_PER_EXECUTION_AUTO if text == STEPS_PER_EXECUTION_AUTO else _integer(text)


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


def _snapshot_every(text: str) -> int | str:
    """``auto`` and ``off`` as text, ``N`` as an int (JobConfig checks them)."""
    if text in (SNAPSHOT_EVERY_AUTO, SNAPSHOT_EVERY_OFF):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer number of steps, auto or off") from None


def parse_set_pairs(pairs: list[str], *, flag: str = "--set") -> dict[str, str]:
    """``["lr=0.1", "path=/x"]`` -> ``{"lr": "0.1", "path": "/x"}``."""
    result: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"Received {flag} {item!r}; expected key=value")
        result[key.strip()] = value
    return result


@dataclass(frozen=True)
class JobConfig:
    recipe: str = field(metadata={_OPTION: Option(
        argument=True, why="the RECIPE argument, which run, worker and python -m resilient_train.runner each add")})
    workers: int = field(default=2, metadata=_flag(  # the most workers (MAX of ``--workers MIN:MAX``)
        "--workers", parse=_workers, metavar="N|MIN:MAX",
        help="worker processes (default 2); MIN:MAX: elastic, go on with fewer (down to MIN) when nodes are lost "
        "and grow back to MAX at the next save when they return (docs/elastic.md)"))
    run_dir: str = field(default="", metadata=_flag(
        "--run-dir", help="where logs, events and summary go (default runs/<recipe>)"))
    storage: str = field(default="", metadata=_flag(
        "--storage", metavar="URL",
        help="checkpoint storage: path, file://, s3://, gs://, memory:// (default <run-dir>/checkpoints)"))
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False, metadata=_flag(  # may hold credentials
        "--storage-option", pairs=parse_storage_options, metavar="KEY=VALUE",
        help="passed to the fsspec filesystem (credentials are never written to the run dir; prefer the backend's "
        "environment variables, e.g. AWS_SECRET_ACCESS_KEY)"))
    epochs: int | None = field(default=None, metadata=_flag("--epochs", parse=_integer))
    steps_per_epoch: int | None = field(default=None, metadata=_flag("--steps-per-epoch", parse=_integer))
    global_batch_size: int | None = field(default=None, metadata=_flag("--global-batch-size", parse=_integer))
    save_every_steps: int | None = field(default=None, metadata=_flag(
        "--save-every-steps", parse=_integer, metavar="K", help="checkpoint every K global steps (0: only at epoch ends)"))
    seed: int = field(default=0, metadata=_flag("--seed", parse=_integer))
    params: Mapping[str, str] = field(default_factory=dict, metadata=_flag(
        "--set", pairs=parse_set_pairs, metavar="KEY=VALUE", help="recipe parameter"))
    keep: int = field(default=3, metadata=_flag(
        "--keep", parse=_integer, help="committed checkpoints to keep (default 3)"))
    on_anomaly: str = field(default=ON_ANOMALY_ROLLBACK, metadata=_flag(  # runner/health/anomaly_policy.py
        "--on-anomaly", choices=ON_ANOMALY_CHOICES,
        help="a step whose loss or gradients are not finite (its state is never saved): rollback (default) restarts "
        "from the newest commit and replays; the anomaly gone, training goes on (transient), back at the same step, "
        "the run stops (deterministic); stop ends the run at once with one line naming the step, the batch and the "
        "values; ignore: report it and train on, committing whatever the state is (docs/failures.md)"))
    deterministic_anomaly: str = field(default=DETERMINISTIC_SKIP, metadata=_flag(  # runner/health/anomaly_policy.py
        "--deterministic-anomaly", choices=DETERMINISTIC_CHOICES,
        help="with --on-anomaly rollback, a non-finite step that comes back when replayed (the data or the model): "
        "skip (default) rolls back once more and replays without that batch, recording the skip in every later "
        "checkpoint; stop ends the run with one line naming the step, the batch and the values"))
    loss_spike: float | str = field(default=LOSS_SPIKE_OFF, metadata=_flag(  # runner/health/spikes.py
        "--loss-spike", parse=_loss_spike, metavar="K|off",
        help="a step whose loss is more than K median absolute deviations above the median of the last 100 "
        "steps' (and over twice their largest) is an anomaly, acted on by --on-anomaly (default off)"))
    replica_check_every: int | str = field(default=100, metadata=_flag(  # runner/health/replicas.py
        "--replica-check-every", parse=_replica_check_every, metavar="K|off",
        help="compare every replica's trainable weights (silent data corruption) every K global steps, and always "
        "before a save or snapshot; differing replicas are an anomaly (--on-anomaly); 0: only before saves and "
        "snapshots; off: never (default 100)"))
    max_transients_per_host: int | str = field(default=3, metadata=_flag(  # runner/health/anomaly_policy.py
        "--max-transients-per-host", parse=_max_transients, metavar="N|off",
        help="after N anomalies on one host that a replay did not reproduce (transient: suspected faulty hardware), "
        "treat that host like one with a preemption notice: the group saves and stops, a local run stops (143), "
        "Ray and Slurm place no worker there again (default 3)"))
    straggler_threshold: float | str = field(default=0.5, metadata=_flag(  # runner/health/stragglers.py
        "--straggler-threshold", parse=_straggler_threshold, metavar="FRACTION|off",
        help="a worker busy more than this fraction longer per step than the other workers' median (0.5: 50%% "
        "slower) for all of --straggler-window is named a straggler: an event, a console line, a summary.json "
        "entry; off: not watched (default 0.5)"))
    straggler_window: float = field(default=20.0, metadata=_flag(
        "--straggler-window", parse=float, metavar="SECONDS",
        help="for how long a worker must stay slower than --straggler-threshold to be named (default 20)"))
    straggler_policy: str = field(default=STRAGGLER_WARN, metadata=_flag(  # runner/health/straggler_replace.py
        "--straggler-policy", choices=STRAGGLER_POLICIES,
        help="what a named straggler does to the run: warn (default) says so and trains on; replace, when the time "
        "it costs to the end of the run exceeds a restart's (this run's measured one, else an estimate), saves at "
        "an agreed step and restarts the group off its host (Ray, Slurm: that node is avoided; local: a fresh "
        "process on the same host)"))
    straggler_cooldown: float = field(default=600.0, metadata=_flag(
        "--straggler-cooldown", parse=float, metavar="SECONDS",
        help="--straggler-policy replace acts on one rank at most once in this many seconds (default 600)"))
    max_restarts: int = field(default=3, metadata=_flag(
        "--max-restarts", parse=_integer, help="gang restarts after failures (default 3)"))
    max_preemptions: int | None = field(default=None, metadata=_flag(
        "--max-preemptions", parse=_integer, help="cap on restarts after preemptions (default: unlimited)"))
    grace_period: float = field(default=30.0, metadata=_flag(
        "--grace-period", parse=float, help="seconds workers get to save after SIGTERM (default 30)"))
    gpus_per_worker: int = field(default=0, metadata=_flag(
        "--gpus-per-worker", parse=_integer, help="CUDA_VISIBLE_DEVICES slice per local worker (default 0)"))
    progress_every_s: float = field(default=1.0, metadata=_toml_only(
        "the chief emits train_progress at most every this many seconds; tests set 0 (an event per call)"))
    checkpoint_mode: str = field(default="async", metadata=_flag(
        "--checkpoint-mode", choices=CHECKPOINT_MODES,
        help="async (default): block only to snapshot, persist in the background; sync: write and upload before training on"))
    sharded_save: str = field(default="auto", metadata=_flag(  # runner/state/sharded_save.py
        "--sharded-save", choices=SHARDED_SAVE_SETTINGS,
        help="every worker writes and uploads its share of each checkpoint (one standard TF checkpoint); auto "
        "(default): only for a state of at least 64 MiB with several workers and async checkpoints; on: whenever "
        "it can work; off: the chief uploads everything (docs/checkpointing.md, Sharded saves)"))
    read_once: str = field(default="on", metadata=_flag(  # runner/state/read_once.py
        "--read-once", choices=READ_ONCE_SETTINGS,
        help="on (default): a sharded checkpoint is restored with each share read from storage by one worker and "
        "sent to the others over the collective; off: every worker downloads the whole checkpoint "
        "(docs/storage.md, Read-once restore)"))
    snapshot_every: int | str = field(default=SNAPSHOT_EVERY_AUTO, metadata=_flag(  # runner/state/memory_tier.py
        "--snapshot-every", parse=_snapshot_every, metavar="auto|N|off",
        help="memory tier: every worker keeps a snapshot of the whole training state taken every N steps, and "
        "when a worker dies or hangs a survivor commits it, so a crash loses at most about N steps; auto "
        "(default): as often as keeps the snapshots' cost under 2%% of step time (the input's iterator-state "
        "captures, which mid-epoch saves share, have 2%% of their own), off where the tier cannot "
        "work (sync checkpoints, parameter-server, one worker); off: no tier, no extra copy of the state "
        "(docs/failures.md, Rescue)"))
    snapshot_capture_every: int | None = field(default=None, metadata=_toml_only(  # runner/state/memory_tier.py
        "the memory tier captures the input's iterator state only every this many steps (the snapshots between "
        "carry the newest capture, and a restore replays the batches since); default: auto's choice, and with an "
        "explicit --snapshot-every N at every snapshot. Tests set it"))
    save_every_seconds: float | None = field(default=None, metadata=_flag(
        "--save-every-seconds", parse=float, metavar="T",
        help="also checkpoint when T seconds passed since the last save (the chief's clock; all workers agree on the step)"))
    warm_standby: bool = field(default=True, metadata=_flag(
        "--warm-standby", action=argparse.BooleanOptionalAction,
        help="keep workers with TensorFlow already imported waiting, so a restart skips the import (default on)"))
    launcher: str = field(default="local", metadata=_flag(
        "--launcher", choices=LAUNCHERS, help="where workers run (default local: child processes of this host)"))
    force_storage: bool = field(default=False, metadata=_flag(
        "--force-storage", action="store_true",
        help="take over a storage that another run (another run id) owns; its OWNER.json is rewritten"))
    ray_address: str | None = field(default=None, metadata=_flag(  # None: RAY_ADDRESS, else "auto"
        "--ray-address", metavar="ADDR", help="--launcher ray: the cluster to join (default RAY_ADDRESS, else auto)"))
    ray_strategy: str = field(default="spread", metadata=_flag(
        "--ray-strategy", choices=RAY_STRATEGIES,
        help="--launcher ray: spread (default) puts workers on different nodes, pack fills nodes first"))
    cpus_per_worker: float = field(default=1.0, metadata=_flag(
        "--cpus-per-worker", parse=float, metavar="N",
        help="--launcher ray: CPUs each worker's bundle reserves (default 1)"))
    storage_shared: bool = field(default=False, metadata=_flag(  # a local storage path is a mount every node shares
        "--storage-shared", action="store_true",
        help="--launcher ray: the local --storage path is a mount every node shares (otherwise refused)"))
    steps_per_execution: int | str = field(default=STEPS_PER_EXECUTION_AUTO, metadata=_flag(  # runner/training/call_size.py
        "--steps-per-execution", parse=_steps_per_execution, metavar="N",
        help="training steps per compiled call, or auto: as many as take ~0.1 s; saves, stop requests and "
        "progress happen between calls (default auto)"))
    eval_every_epochs: int | None = field(default=None, metadata=_flag(  # None: 1 with an eval_dataset, else 0
        "--eval-every-epochs", parse=_integer, metavar="N",
        help="evaluate on the recipe's eval_dataset every N epochs (default 1 when it has one; 0: never)"))
    eval_steps: int | None = field(default=None, metadata=_flag(  # None: the whole eval_dataset
        "--eval-steps", parse=_integer, metavar="S", help="evaluate at most S batches (default: all)"))
    strict_resume: bool = field(default=False, metadata=_flag(
        "--strict-resume", action="store_true",
        help="stop (exit 3) when a resumed epoch's input differs from the one recorded with the checkpoint"))
    record_indices: bool = field(default=False, metadata=_flag(  # rundir/stepindices.py
        "--record-indices", action="store_true",
        help="indexed recipes: write a digest of each global step's example indices to "
        "attempt-<n>/step-indices.txt (one all-gather per step; docs/recipes.md)"))
    max_iterator_state_bytes: int = field(default=4194304, metadata=_flag(  # runner/input/iterator_state.py
        "--max-iterator-state-bytes", parse=_integer, metavar="BYTES",
        help="dataset recipes without start_step: save each worker's tf.data iterator state with mid-epoch "
        "checkpoints when it is at most this large, so re-entry replays nothing (default 4194304; 0: never)"))
    hang_timeout: float | str = field(default=HANG_TIMEOUT_AUTO, metadata=_flag(  # supervisor/watchdog.py
        "--hang-timeout", parse=_hang_timeout, metavar="SECONDS|auto",
        help="restart the group when no worker finished a step for this long (default auto: "
        "max(60 s, 10 x the longest call seen); see docs/failures.md, Hangs)"))
    startup_timeout: float = field(default=600.0, metadata=_flag(
        "--startup-timeout", parse=float, metavar="SECONDS",
        help="allowance until an attempt's first step, and for evaluation and blocking saves; a worker "
        "waits half of it for its peers' addresses to answer (default 600)"))
    storage_timeout: float = field(default=60.0, metadata=_flag(  # checkpoint/deadline.py
        "--storage-timeout", parse=float, metavar="SECONDS",
        help="a storage call that moves no bytes for this long is retried; a store that stays stalled fails the "
        "save (restartable) instead of blocking it (default 60)"))
    collective_timeout: float | None = field(default=None, metadata=_flag(  # None ("off"): no limit
        "--collective-timeout", parse=_collective_timeout, metavar="SECONDS|off",
        help="fail a collective that waits longer than this (exit 4, the group is restarted); each collective "
        "then holds a thread for that long (default off; see docs/failures.md, Hangs)"))
    run_dir_mode: int = field(default=DEFAULT_RUN_DIR_MODE, metadata=_flag(  # an int once validated (TOML: a string)
        "--run-dir-mode", metavar="MODE",
        help="octal mode of the run dir and what it creates, e.g. 0750 to share with your group (default 0700: "
        "files 0600; a stricter umask is kept)"))
    min_workers: int | None = field(default=None, metadata=_toml_only(  # None: ``workers`` (not elastic)
        "the fewest workers an elastic run goes on with; the flag is --workers MIN:MAX"))
    strategy: str = field(default="mirrored", metadata=_flag(  # runner/process/ps_roles.py
        "--strategy", choices=STRATEGIES,
        help="mirrored (default): MultiWorkerMirroredStrategy; parameter-server: a coordinator, --ps parameter "
        "servers and --workers workers (docs/parameter_server.md)"))
    ps: int = field(default=1, metadata=_flag(
        "--ps", parse=_integer, metavar="P", help="--strategy parameter-server: parameter servers (default 1)"))
    preemption_notice: str = field(default=NOTICE_AUTO, metadata=_flag(  # cluster/notices/
        "--preemption-notice", choices=NOTICE_SETTINGS,
        help="watch this node's cloud preemption notices (GCE, AWS spot, Azure Scheduled Events) and save at an "
        "agreed step and exit 143 on one, before SIGTERM comes; auto (default): whichever metadata server answers "
        "a short probe, none: nothing (docs/preemption.md)"))
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
        if self.loss_spike != LOSS_SPIKE_OFF and (isinstance(self.loss_spike, bool) or not isinstance(
                self.loss_spike, (int, float)) or not self.loss_spike > 0):
            raise ConfigError(f"Received loss_spike={self.loss_spike!r}; expected a number > 0 or {LOSS_SPIKE_OFF!r}")
        if self.max_transients_per_host != TRANSIENTS_OFF and (
                isinstance(self.max_transients_per_host, bool) or not isinstance(self.max_transients_per_host, int)
                or self.max_transients_per_host < 1):
            raise ConfigError(f"Received max_transients_per_host={self.max_transients_per_host!r}; expected an "
                              f"integer >= 1 or {TRANSIENTS_OFF!r}")
        if self.straggler_threshold != STRAGGLER_OFF and (isinstance(self.straggler_threshold, bool) or not isinstance(
                self.straggler_threshold, (int, float)) or not 0 < self.straggler_threshold < math.inf):
            raise ConfigError(f"Received straggler_threshold={self.straggler_threshold!r}; expected a finite number > 0 "
                              f"or {STRAGGLER_OFF!r}")
        if isinstance(self.straggler_window, bool) or not isinstance(self.straggler_window, (int, float)) \
                or not 0 < self.straggler_window < math.inf:
            raise ConfigError(f"Received straggler_window={self.straggler_window!r}; expected a finite number of "
                              "seconds > 0")
        if self.straggler_policy not in STRAGGLER_POLICIES:
            raise ConfigError(f"Received straggler_policy={self.straggler_policy!r}; expected one of "
                              f"{', '.join(STRAGGLER_POLICIES)}")
        if isinstance(self.straggler_cooldown, bool) or not isinstance(self.straggler_cooldown, (int, float)) \
                or not 0 <= self.straggler_cooldown < math.inf:
            raise ConfigError(f"Received straggler_cooldown={self.straggler_cooldown!r}; expected a finite number of "
                              "seconds >= 0")
        if self.replica_check_every != REPLICA_CHECK_OFF and (
                isinstance(self.replica_check_every, bool) or not isinstance(self.replica_check_every, int)
                or self.replica_check_every < 0):
            raise ConfigError(f"Received replica_check_every={self.replica_check_every!r}; expected an integer >= 0 "
                              f"or {REPLICA_CHECK_OFF!r}")
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
        if self.preemption_notice not in NOTICE_SETTINGS:
            raise ConfigError(f"Received preemption_notice={self.preemption_notice!r}; "
                              f"expected one of {', '.join(NOTICE_SETTINGS)}")
        if not isinstance(self.grace_period, (int, float)) or self.grace_period <= 0:
            raise ConfigError(f"Received grace_period={self.grace_period!r}; expected a number of seconds > 0")
        if isinstance(self.progress_every_s, bool) or not isinstance(self.progress_every_s, (int, float)) \
                or not 0 <= self.progress_every_s < math.inf:
            raise ConfigError(
                f"Received progress_every_s={self.progress_every_s!r}; expected a finite number of seconds >= 0 (0: after every call)")
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
        if self.collective_timeout == COLLECTIVE_TIMEOUT_OFF:  # type: ignore[comparison-overlap]  # the flag's parser gives 'off'
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
        if self.checkpoint_mode not in CHECKPOINT_MODES:
            raise ConfigError(f"Received checkpoint_mode={self.checkpoint_mode!r}; expected 'async' or 'sync'")
        if self.sharded_save not in SHARDED_SAVE_SETTINGS:
            raise ConfigError(f"Received sharded_save={self.sharded_save!r}; expected 'auto', 'on' or 'off'")
        if self.read_once not in READ_ONCE_SETTINGS:
            raise ConfigError(f"Received read_once={self.read_once!r}; expected 'on' or 'off'")
        if self.sharded_save == "on" and (self.checkpoint_mode != "async" or self.strategy != "mirrored"):
            raise ConfigError(f"Received sharded_save='on' with checkpoint_mode={self.checkpoint_mode!r} and "
                              f"strategy={self.strategy!r}; each worker writes its share from the async "
                              "checkpointer's twin of the replicated state: use --checkpoint-mode async, --strategy "
                              "mirrored")
        _check_snapshot_every(self)
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
    def snapshot_every_steps(self) -> int | None:
        """The memory tier's fixed interval in steps; None when it is off or ``auto``."""
        return None if self.snapshot_every in (SNAPSHOT_EVERY_OFF, SNAPSHOT_EVERY_AUTO) else int(self.snapshot_every)

    @property
    def memory_tier_off_reason(self) -> str | None:
        """Why this job runs without the memory tier (None: it runs with it, at least where
        a worker has a peer; runner/training/loop.py says when a single worker turns ``auto`` off)."""
        value = self.snapshot_every
        if value == SNAPSHOT_EVERY_OFF:
            return "--snapshot-every off"
        if value != SNAPSHOT_EVERY_AUTO:
            return None  # an explicit N: _check_snapshot_every refused what cannot work
        if self.checkpoint_mode != "async":
            return f"checkpoint_mode={self.checkpoint_mode!r}: the snapshot lives in the async checkpointer's twin"
        if self.strategy != "mirrored":
            return f"strategy={self.strategy!r}: no worker holds the whole state"
        if self.workers == 1:
            return "a single worker: no survivor to rescue from"
        return None

    @property
    def memory_tier(self) -> bool:
        """Whether workers keep snapshots and a survivor may be asked to rescue."""
        return self.memory_tier_off_reason is None

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
        updates: dict[str, Any] = {
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
        """A job from ``values`` keyed by field names (``-`` for ``_`` too); ConfigError naming unknown keys."""
        normalised = {key.replace("-", "_"): value for key, value in values.items()}
        _refuse_unknown(normalised, (f.name for f in dataclasses.fields(cls)), source)
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


def _check_snapshot_every(job: "JobConfig") -> None:
    """``auto`` (never refused: it turns itself off where the tier cannot work, saying why),
    ``off``, or an integer >= 1, and that only with async checkpoints under MultiWorkerMirroredStrategy."""
    value = job.snapshot_every
    capture = job.snapshot_capture_every
    if capture is not None:
        if isinstance(capture, bool) or not isinstance(capture, int) or capture < 1:
            raise ConfigError(f"Received snapshot_capture_every={capture!r}; expected an integer number of steps >= 1")
    if value in (SNAPSHOT_EVERY_OFF, SNAPSHOT_EVERY_AUTO):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Received snapshot_every={value!r}; expected 'auto', 'off' or an integer number of "
                          "steps >= 1")
    if job.checkpoint_mode != "async":
        raise ConfigError(f"Received snapshot_every={value} with checkpoint_mode={job.checkpoint_mode!r}; the memory "
                          "tier keeps its snapshot in the async checkpointer's twin: use --checkpoint-mode async")
    if job.strategy != "mirrored":
        raise ConfigError(f"Received snapshot_every={value} with strategy={job.strategy!r}; the memory tier needs "
                          "every worker to hold the whole state (--strategy mirrored)")


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


# ------------------------------------------------------------ generated from the fields
# Shared by `resilient-train run`, `resilient-train worker` and the worker process
# (python -m resilient_train.runner), so they live with JobConfig, not in the CLI.

def _options_of(config: type) -> dict[str, Option]:
    """Each field of the dataclass ``config`` -> its Option; TypeError naming a field that has none."""
    options = {}
    for spec in dataclasses.fields(config):
        if not isinstance(spec.metadata.get(_OPTION), Option):
            raise TypeError(f"{config.__name__}.{spec.name} has no Option; say in its metadata how it is set "
                            "(a flag, a --config key, or why neither)")
        options[spec.name] = spec.metadata[_OPTION]
    return options


JOB_OPTIONS: Mapping[str, Option] = _options_of(JobConfig)  # in field order, which is --help's order
TOML_KEYS = frozenset(name for name, option in JOB_OPTIONS.items() if option.toml)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and the flag of each field that has one, in field order (all default to None = config
    file / recipe; a ``KEY=VALUE`` flag to [])."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the flags")
    for name, option in JOB_OPTIONS.items():
        if option.flag is not None:
            option.add_to(parser, dest=name)


def job_from_args(args: argparse.Namespace) -> JobConfig:
    """The job of a parsed command line: the ``--config`` file's keys, then the flags given over them."""
    source = args.config or "flags"
    from_file = {key.replace("-", "_"): value
                 for key, value in (load_toml(args.config) if args.config else {}).items()}
    values: dict[str, Any] = dict(from_file)
    flags = {name: option for name, option in JOB_OPTIONS.items() if option.flag is not None}
    for name, option in flags.items():
        value = getattr(args, name, None)
        if not option.pairs and value is not None:
            values[name] = value
    if args.recipe:
        values["recipe"] = args.recipe
    if "recipe" not in values:
        raise ConfigError("No recipe given; expected `resilient-train run RECIPE` (e.g. recipes/digits_cnn.py)")
    for name, option in flags.items():
        if option.pairs:  # KEY=VALUE flags over the file's table of the same key
            merged = dict(values.pop(name, {}) or {})
            merged.update(option.pairs(getattr(args, name)))
            values[name] = merged
    _refuse_unknown(from_file, TOML_KEYS, source)
    return JobConfig.from_mapping(values, source=source)


def _refuse_unknown(keys: Iterable[str], accepted: Iterable[str], source: str) -> None:
    """ConfigError naming each key of ``keys`` not in ``accepted``, and listing those that are."""
    names = sorted(accepted)
    unknown = sorted(set(keys) - set(names))
    if unknown:
        raise ConfigError(f"Unknown key(s) {unknown} in {source}; accepted: {names}")
