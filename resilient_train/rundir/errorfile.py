"""Per-worker error files and the root cause of a failed attempt.

When one MultiWorkerMirroredStrategy worker dies, every survivor fails seconds later with
``UnavailableError`` / "Collective ops is aborted by: ..." from the collectives. Reporting
all N tracebacks (or the last one) buries the cause. Following torch elastic's
``record``/``ErrorHandler``, each worker writes its uncaught exception as JSON to
``<attempt_dir>/error-<rank>.json``, and the supervisor picks one *root cause*:

1. a failure that is not a known consequence of a peer's death (a *primary* failure)
   beats one that is (*secondary*), whatever their times;
2. among equals, the earliest wins (error time, or exit time when there is no file);
3. a worker that died without writing a file (SIGKILL, OOM killer, segfault) is a primary
   failure at its exit time: it had no chance to explain itself.

Secondary failures are recognised by exception type name and message text (see
``_SECONDARY_TYPES`` and ``_SECONDARY_PATTERNS``), never by importing TensorFlow: this
module is pure stdlib so the supervisor stays light and tests stay fast.

The worker's one error path is :func:`recording` (torch elastic's ``record``): the worker's
whole main runs inside it; an exception that ends the worker is written to its error file
and turned into the exit code of ``errors.EXIT_RULES``.

Files are written atomically (``rundir/atomic.py``, fsynced); the reader still tolerates
a torn or foreign file by skipping it with a note, because a report about a crash must not
crash. Times are epoch seconds (``time.time()``): error times and the supervisor's exit
times are compared directly, which holds on one host.

``describe_exit`` lives here rather than in ``supervisor.policy`` so that the worker side
can import this module without the supervisor package; the policy re-exports it.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, TextIO

from resilient_train.rundir.layout import AttemptDir
from resilient_train.errors import (
    EXIT_DESCRIPTIONS,
    EXIT_GROUP_BROKEN,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    UNEXPECTED,
    ConfigError,
    exit_rule_for,
)
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.redact import redact_text

__all__ = [
    "describe_exit",
    "is_secondary",
    "error_file_path",
    "record_exception",
    "recording",
    "Recording",
    "WorkerError",
    "read_errors",
    "RootCause",
    "choose_root_cause",
    "tail_lines",
    "log_tail",
    "is_tf_noise",
    "TF_NOISE_PATTERNS",
]

_log = logging.getLogger(__name__)

# Errors whose message is the whole story: rendered as that one line (WorkerFailure.render).
_ONE_LINE_ERRORS = frozenset({"RecipeRefused", "NumericalAnomalyError"})

# Exception types that TensorFlow raises in a survivor when a peer disappears, and ours
# for the same (errors.GroupBrokenError: what the worker records them as).
_SECONDARY_TYPES = frozenset(
    {"UnavailableError", "CancelledError", "DeadlineExceededError", "AbortedError", "GroupBrokenError"}
)
# Message fragments with the same meaning, whatever the type (often InternalError/Unknown).
_SECONDARY_PATTERNS = re.compile(
    r"collective ops? (is |are |were |was )?aborted"
    r"|connection reset by peer"
    r"|failed to connect to all addresses"
    r"|socket closed"
    r"|heartbeat (timeout|timed out)"
    r"|stopped sending heartbeats"
    r"|coordination service (has stopped|is shutting down|shut down|agent .*error)"
    r"|coordinationservice.*(heartbeat|unavailable|stopped)",
    re.IGNORECASE,
)

_TRACEBACK_TAIL = 8


def describe_exit(returncode: int) -> str:
    """A short human description of a ``Popen.returncode``: "killed by SIGKILL", ..."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode in EXIT_DESCRIPTIONS:
        return f"{EXIT_DESCRIPTIONS[returncode]} (exit {returncode})"
    return f"exit code {returncode}"


def is_secondary(type_name: str, message: str) -> bool:
    """Whether an exception is a consequence of a peer's death rather than a cause."""
    if type_name.rsplit(".", 1)[-1] in _SECONDARY_TYPES:
        return True
    return _SECONDARY_PATTERNS.search(message) is not None


def _qualified_name(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def error_file_path(attempt_dir: Path, rank: int) -> Path:
    return AttemptDir(Path(attempt_dir)).error(rank)


def record_exception(
    attempt_dir: Path,
    rank: int,
    exc: BaseException,
    *,
    global_step: int | None,
    clock: Callable[[], float] = time.time,
) -> Path:
    """Write ``<attempt_dir>/error-<rank>.json`` for ``exc``, atomically; return its path.

    A later exception of the same worker replaces the file: the last one recorded is the
    one that ended the process.
    """
    now = clock()
    type_name = _qualified_name(type(exc))
    message = redact_text(str(exc))  # a message or traceback may quote an options dict or a URL
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "type": type_name,
        "message": message,
        "traceback": redact_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))),
        "global_step": global_step,
        "time": now,
        "time_iso": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(
            timespec="milliseconds"
        ),
        "secondary": is_secondary(type_name, message),
    }
    return write_atomic(error_file_path(attempt_dir, rank), json.dumps(record, indent=1), fsync=True)


# Before the worker knows where its error file goes, these mean a bad flag, job file,
# TF_CONFIG or RT_* variable: a usage error, reported in one line.
_USAGE_ERRORS = (ConfigError, OSError, ValueError)


@dataclass
class Recording:
    """What the worker tells :func:`recording` as it goes, and how the block ended.

    ``locate`` names the error file (attempt dir and rank) once TF_CONFIG is known; until
    then nothing has run. ``global_step`` reads the step for the file, ``diagnose`` may
    turn an unexpected exception into the recipe bug it is (a ``RecipeError`` with the
    fix, runner/failures/diagnose.py) or into the broken group it is, ``on_failure`` runs after an
    unexpected failure or a broken group was recorded (the chief lets its in-flight
    checkpoint commit). ``exit_code`` is the worker's exit
    code: the body sets it on success, :func:`recording` on an exception.
    """

    prefix: str
    attempt_dir: Path | None = None
    rank: int | None = None
    global_step: Callable[[], int | None] | None = None
    diagnose: Callable[[Exception], Exception | None] | None = None
    on_failure: Callable[[], None] | None = None
    exit_code: int = EXIT_OK
    error_file: Path | None = None

    def locate(self, attempt_dir: Path, rank: int) -> None:
        self.attempt_dir, self.rank = Path(attempt_dir), rank


@contextmanager
def recording(
    prefix: str = "resilient-train worker",
    *,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[Recording]:
    """Run a worker's main; an ``Exception`` that ends it sets ``exit_code`` instead of escaping.

    Once located, the exception (or what ``diagnose`` made of it) is written to
    ``<attempt_dir>/error-<rank>.json`` and the exit code comes from ``errors.EXIT_RULES``:
    a known type is one line on ``err`` (``<prefix> <rank>: fatal: ...``), an unexpected one
    its traceback, after ``on_failure``. Before ``locate``, a ConfigError, OSError or
    ValueError is one line (``<prefix>: ...``) and ``EXIT_USAGE``; anything else propagates.
    ``SystemExit`` and ``KeyboardInterrupt`` always pass through unrecorded: they are
    requested exits. A clean block writes nothing. Failing to read the step or to write the
    file never hides the original exception.
    """
    state = Recording(prefix)
    try:
        yield state
    except Exception as exc:
        stream = err if err is not None else sys.stderr
        if state.attempt_dir is None or state.rank is None:
            if not isinstance(exc, _USAGE_ERRORS):
                raise
            print(redact_text(f"{prefix}: {exc}"), file=stream)
            state.exit_code = EXIT_USAGE
            return
        state.exit_code = _ended_by(state, state.attempt_dir, state.rank, exc, stream, clock)


def _ended_by(state: Recording, attempt_dir: Path, rank: int, exc: Exception, stream: TextIO,
              clock: Callable[[], float]) -> int:
    """Record ``exc`` as worker ``rank``'s error, say it on ``stream``; its exit code."""
    rule = exit_rule_for(exc)
    recorded: Exception = exc
    if rule is UNEXPECTED and state.diagnose is not None:
        diagnosed = state.diagnose(exc)
        if diagnosed is not None:  # a recipe bug that every restart would hit again
            recorded, rule = diagnosed, exit_rule_for(diagnosed)
    step: int | None = None
    if state.global_step is not None:
        try:
            step = state.global_step()
        except Exception:  # the step variable may be unreadable (not built, a peer died)
            step = None
    try:
        state.error_file = record_exception(attempt_dir, rank, recorded, global_step=step, clock=clock)
    except OSError as write_error:
        print(redact_text(f"could not write error file for rank {rank}: {write_error}"), file=stream)
    # A broken group is a transient failure like an unexpected one: the chief's in-flight
    # checkpoint may still commit (fencing keeps a superseded chief out).
    if (rule is UNEXPECTED or rule.code == EXIT_GROUP_BROKEN) and state.on_failure is not None:
        state.on_failure()
    if rule is UNEXPECTED:
        stream.write(redact_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
    else:
        print(redact_text(f"{state.prefix} {rank}: {rule.label}: {recorded}"), file=stream)
    return rule.code


@dataclass(frozen=True)
class WorkerError:
    """One worker's recorded exception, as read back from its error file."""

    rank: int
    pid: int
    type: str
    message: str
    traceback: str
    global_step: int | None
    time: float
    time_iso: str
    secondary: bool

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any]) -> WorkerError:
        """Parse an error file's content; ``ValueError`` naming the bad field otherwise."""
        obj = json.loads(data) if isinstance(data, str) else data
        if not isinstance(obj, Mapping):
            raise ValueError(f"Received a {type(obj).__name__}; expected a JSON object")
        checks: dict[str, tuple[type, ...]] = {
            "rank": (int,),
            "pid": (int,),
            "type": (str,),
            "message": (str,),
            "traceback": (str,),
            "global_step": (int, type(None)),
            "time": (int, float),
            "time_iso": (str,),
            "secondary": (bool,),
        }
        for name, types in checks.items():
            if name not in obj:
                raise ValueError(f"Missing field {name!r}; expected {sorted(checks)}")
            value = obj[name]
            bad_bool = isinstance(value, bool) and bool not in types
            if bad_bool or not isinstance(value, types):
                raise ValueError(
                    f"Received {name}={value!r}; expected {' or '.join(t.__name__ for t in types)}"
                )
        return cls(**{name: obj[name] for name in checks} | {"time": float(obj["time"])})

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    @property
    def signature(self) -> str:
        """Type and first message line: equal for the same failure on another attempt."""
        first_line = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first_line}"


def read_errors(
    attempt_dir: Path, *, note: Callable[[str], None] | None = None
) -> list[WorkerError]:
    """All readable error files of an attempt, by rank; unreadable ones skipped with a note."""
    note = note if note is not None else _log.warning
    errors: list[WorkerError] = []
    directory = Path(attempt_dir)
    if not directory.is_dir():
        return errors
    for path in AttemptDir(directory).errors():
        try:
            errors.append(WorkerError.from_json(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
            note(f"skipped unreadable error file {path}: {exc}")
    return sorted(errors, key=lambda e: e.rank)


@dataclass(frozen=True)
class RootCause:
    """The failure that ended an attempt, and what else failed after it.

    ``secondary_ranks`` are the other failed workers; ``secondary_details`` describes each
    in one line. ``global_step`` is the root cause's own step, or, when it recorded none
    (a SIGKILLed worker leaves no error file), the step the attempt reached: the number
    ``lost_steps`` counts from (rundir/stepmarker.py ``reached_step``).
    """

    rank: int
    pid: int
    exit_description: str
    error: WorkerError | None
    secondary_ranks: list[int]
    last_log_lines: list[str]
    returncode: int | None = None
    global_step: int | None = None
    secondary_details: dict[int, str] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        """What identifies this failure across attempts (crash-loop detection)."""
        return self.error.signature if self.error is not None else self.exit_description

    def render(self) -> str:
        """A short block for humans: cause, traceback tail, log tail, secondary failures; for
        a refusal (errors.py ``RecipeRefused``: the job asks for what the runner refuses) and
        a stop on a numerical anomaly (``NumericalAnomalyError``: the step, the batch, the values),
        its one line in the user's terms and nothing else (the worker's log keeps the rest)."""
        if self.error is not None and self.error.short_type in _ONE_LINE_ERRORS:
            return _first_line(self.error.message)
        at_step = f" at global_step {self.global_step}" if self.global_step is not None else ""
        lines = [
            f"root cause: worker {self.rank} (pid {self.pid}) {self.exit_description}{at_step}"
        ]
        if self.error is not None:
            lines.append(f"  {self.error.short_type}: {_first_line(self.error.message)}")
            tb = self.error.traceback.rstrip().splitlines()[-_TRACEBACK_TAIL:]
            if tb:
                lines.append(f"  traceback (last {len(tb)} lines):")
                lines.extend(f"    {line}" for line in tb)
        if self.last_log_lines:
            lines.append(f"  log of worker {self.rank} (last {len(self.last_log_lines)} lines):")
            lines.extend(f"    {line}" for line in self.last_log_lines)
        for rank in self.secondary_ranks:
            detail = self.secondary_details.get(rank, "failed")
            lines.append(f"worker {rank}: {detail}")
        return "\n".join(lines)


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


@dataclass(frozen=True)
class _Failure:
    rank: int
    pid: int
    returncode: int | None
    time: float
    error: WorkerError | None
    note: str | None = None
    torn_down: bool = False  # SIGKILLed by the supervisor's teardown, having recorded nothing

    @property
    def secondary(self) -> bool:
        if self.error is None:
            return self.torn_down
        return self.error.secondary

    def describe_exit(self) -> str:
        if self.note is not None:
            return self.note
        if self.torn_down:
            return "killed by the supervisor's teardown"
        return describe_exit(self.returncode) if self.returncode is not None else "still running"

    def one_line(self) -> str:
        what = self.describe_exit()
        if self.error is not None:
            what = f"{what}: {self.error.short_type}: {_first_line(self.error.message)}"
        label = "(secondary: peer failure)" if self.secondary else "(failed after the root cause)"
        return f"(pid {self.pid}) {what} {label}"


def choose_root_cause(
    exits: Mapping[int, tuple[int, int, float]],
    errors: list[WorkerError],
    log_tail: Callable[[int], list[str]],
    exit_notes: Mapping[int, str] | None = None,
    torn_down: Collection[int] = (),
    reached: int | None = None,
) -> RootCause | None:
    """Pick the root cause of an attempt; ``None`` when no worker failed.

    ``exits`` maps rank to ``(pid, returncode, exit_time)`` for the workers that exited
    (``exit_time`` in epoch seconds). A worker failed if it exited with a code other than
    ``EXIT_OK`` / ``EXIT_PREEMPTED``, or recorded an error and did not exit cleanly.
    ``log_tail(rank)`` is called for the root cause only. ``exit_notes`` replaces the exit
    description of a rank where the supervisor knows better than the exit status (a
    stopped worker it SIGKILLed "stopped responding"; the SIGKILL was its teardown).
    ``torn_down``: ranks the supervisor SIGKILLed while tearing the group down after a
    failure; one that recorded no error of its own is secondary (its SIGKILL is ours, not
    its failure), so a survivor's "the group broke" names what happened instead.
    ``reached``: the highest step the attempt's workers finished (rundir/stepmarker.py
    ``reached_step``), the root cause's step when it recorded none of its own.
    """
    notes = exit_notes or {}
    by_rank = {e.rank: e for e in errors}
    failures: list[_Failure] = []
    for rank, (pid, returncode, exit_time) in exits.items():
        error = by_rank.get(rank)
        if returncode == EXIT_OK or (returncode == EXIT_PREEMPTED and error is None):
            continue
        when = error.time if error is not None else exit_time
        failures.append(_Failure(rank, pid, returncode, when, error, notes.get(rank), rank in torn_down))
    for rank, error in by_rank.items():
        if rank not in exits:  # recorded its error, not reaped yet
            failures.append(_Failure(rank, error.pid, None, error.time, error))
    if not failures:
        return None

    failures.sort(key=lambda f: (f.secondary, f.time, f.rank))
    root, others = failures[0], failures[1:]
    step = root.error.global_step if root.error is not None else None
    if step is None:
        step = reached
    return RootCause(
        rank=root.rank,
        pid=root.pid,
        exit_description=root.describe_exit(),
        error=root.error,
        secondary_ranks=[f.rank for f in others],
        last_log_lines=list(log_tail(root.rank)),
        returncode=root.returncode,
        global_step=step,
        secondary_details={f.rank: f.one_line() for f in others},
    )


# TensorFlow's chatter in a worker log: lines that appear on healthy runs too, so they never
# explain a failure and only push the lines that do out of the root cause's log tail. One
# named pattern per source; add to this list, nowhere else.
TF_NOISE_PATTERNS: dict[str, str] = {
    "start-up: oneDNN": r"oneDNN custom operations are on|TF_ENABLE_ONEDNN_OPTS",
    "start-up: no CUDA": r"cudart|Could not find cuda drivers|failed call to cuInit",
    "start-up: CUDA plugins": r"Unable to register cu(DNN|FFT|BLAS) factory|TF-TRT Warning",
    "start-up: CPU features": r"This TensorFlow binary is optimized|rebuild TensorFlow with the appropriate "
                              r"compiler flags|cpu_feature_guard\.cc",
    "start-up: logging": r"All log messages before absl::InitializeLog|computation_placer\.cc"
                         r"|successful NUMA node read",
    # An eager strategy.run (a recipe's own, or TensorFlow's; ours are tf.functions, runner/training/loop.py):
    "eager strategy advice": r"Using \w+Strategy eagerly has significant overhead",
}
_TF_NOISE = re.compile("|".join(f"(?:{pattern})" for pattern in TF_NOISE_PATTERNS.values()))


def is_tf_noise(line: str) -> bool:
    """A line of :data:`TF_NOISE_PATTERNS` (start-up chatter, eager-strategy advice)."""
    return _TF_NOISE.search(line) is not None


def log_tail(path: Path, n: int = 15) -> list[str]:
    """The last ``n`` lines of a worker log that are not TensorFlow noise (:data:`TF_NOISE_PATTERNS`)."""
    lines = [line for line in tail_lines(path, 4 * n + 50) if not is_tf_noise(line)]
    return lines[-n:]


def tail_lines(path: Path, n: int = 20, *, block_size: int = 8192) -> list[str]:
    """The last ``n`` lines of a text file, reading backwards from its end.

    Missing file -> ``[]``. Undecodable bytes are replaced, never raised.
    """
    if n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            data = b""
            position = end
            while position > 0 and data.count(b"\n") <= n:
                step = min(block_size, position)
                position -= step
                f.seek(position)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]
