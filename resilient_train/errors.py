"""The few exception types and the exit codes of resilient-train: both defined here, once.

Exceptions subclass built-ins so callers can catch them generically; each carries a
message that names the bad value and what would have been accepted.

Exit codes are a contract with schedulers and with the supervisor (docs/failures.md's "Exit
codes" section and the README's table render this list):

* ``EXIT_OK`` (0): training completed (or was already complete).
* ``EXIT_FAILURE`` (1): training failed; a re-run resumes from the last commit.
* ``EXIT_USAGE`` (2): bad command line, config, recipe or storage URL. Nothing ran.
* ``EXIT_FATAL`` (3): a worker found a problem that a restart cannot fix (broken recipe,
  incompatible checkpoint). The supervisor does not restart on it.
* ``EXIT_GROUP_BROKEN`` (4): a collective failed because the worker group broke (a peer
  died, froze or became unreachable: TensorFlow's Unavailable, DeadlineExceeded, Aborted or
  Cancelled out of a collective). A symptom, never the root cause when another worker has a
  better one; the supervisor restarts the group.
* ``EXIT_PREEMPTED`` (143 = 128 + SIGTERM): the process was asked to stop, saved a
  checkpoint at an agreed step and exited cleanly. Schedulers treat 128-255 as retryable.

How a worker's exception becomes its exit code is one table, :data:`EXIT_RULES` (first
matching type wins, so subclasses come before their bases)::

    RecipeError, ConfigError, CheckpointIncompatibleError, StaleWriterError  -> 3 "fatal"
    GroupBrokenError                                                         -> 4 "group broke"
    PeerUnreachableError                                                     -> 1 "peer unreachable"
    StorageUnavailableError                                                  -> 1 "storage unavailable"
    StorageError (and StorageOwnedError)                                     -> 3 "fatal storage error"
    any other Exception (the recipe's, TensorFlow's)                         -> 1 "failed"

The worker's one error path (``rundir/errorfile.py`` ``recording``) applies it after
writing the error file; a failure before the worker knows its attempt dir and rank (bad
flags, job file, TF_CONFIG, RT_* environment) is ``EXIT_USAGE``: nothing ran. The
supervisor reads codes back through :data:`EXIT_DESCRIPTIONS` (``describe_exit``) and
:data:`NOT_RESTARTABLE` (``classify``).
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_FATAL = 3
EXIT_GROUP_BROKEN = 4
EXIT_PREEMPTED = 143

# How ``describe_exit`` names a code ("fatal error (exit 3)"); other codes are "exit code N".
EXIT_DESCRIPTIONS = {
    EXIT_OK: "completed",
    EXIT_PREEMPTED: "preempted",
    EXIT_FATAL: "fatal error",
    EXIT_USAGE: "usage error",
    EXIT_GROUP_BROKEN: "group broken",
}
# Codes that say a restart cannot help: the supervisor stops the run on them.
NOT_RESTARTABLE = frozenset({EXIT_FATAL, EXIT_USAGE})


class ConfigError(ValueError):
    """A flag, config key, recipe parameter or TF_CONFIG value is invalid."""


class RecipeError(ValueError):
    """A recipe cannot be loaded or does not satisfy the recipe contract."""


class RecipeRefused(RecipeError):
    """The job asks for something the runner refuses (a compiled model with two outputs, a
    second ``fit`` call...), found only once a worker built it. A user error, not a crash: its
    message is the whole story, so the supervisor shows that one line, no traceback."""


class NumericalAnomalyError(ArithmeticError):
    """A training step's loss or gradients were not finite, or a state about to be committed
    holds a non-finite value (runner/health/). With ``--on-anomaly stop`` the worker exits
    ``EXIT_FATAL``: a restart would replay the same batch. Its message is the whole story."""


class AnomalyRollbackError(NumericalAnomalyError):
    """``--on-anomaly rollback``: the workers leave after a non-finite step so that the gang
    restart restores the newest (healthy) commit and replays up to it. Restartable."""


class StorageError(OSError):
    """Checkpoint storage cannot be used (bad URL, no bucket, no permission).

    Permanent: retrying does not help. The message names the URL and the cause.
    """


class StorageUnavailableError(StorageError):
    """A transient storage failure that outlived the retry budget."""


class CheckpointCorruptError(ValueError):
    """A checkpoint's files do not match its manifest (torn upload, flipped bytes)."""


class CheckpointIncompatibleError(ValueError):
    """A committed checkpoint does not fit the recipe's model (names the variable)."""


class RunDirLockedError(RuntimeError):
    """Another live ``resilient-train run`` holds the run dir's lock (names the holder)."""


class StorageOwnedError(StorageError):
    """The checkpoint storage belongs to another run (``OWNER.json``); ``--force-storage`` takes it over."""


class StaleWriterError(RuntimeError):
    """A newer attempt claimed a higher generation of the storage: this writer must not touch it.

    Raised on the commit path (upload, manifest, delete) of a chief whose attempt was
    superseded; never retried (the worker exits ``EXIT_FATAL``).
    """


class RestartNotPlacedError(RuntimeError):
    """The launcher could not place a restart's workers (no node can take a lost slot).

    Raised by ``Launcher.start`` only once an attempt of this run has started; the
    supervisor ends the run as failed (``EXIT_FAILURE``, ``summary.json`` with this as the
    root cause), and a re-run resumes from the last commit. The same problem before the
    first attempt is a ``ConfigError`` (the Ray launcher's ``RayPlacementError``, exit 2):
    nothing ran, the request is the likely cause.
    """


class GroupBrokenError(RuntimeError):
    """A collective failed because the worker group broke, not because of this worker.

    What a survivor raises when a peer died, froze or became unreachable (TensorFlow's
    ``UnavailableError``/``DeadlineExceededError``/``AbortedError``/``CancelledError`` out
    of a collective, mapped by ``runner/failures/diagnose.py``). The message keeps TensorFlow's type
    and first line. Recorded as a secondary failure (``rundir/errorfile.py``): the worker
    that broke the group is the root cause when it left any trace.
    """


class PeerUnreachableError(ConnectionError):
    """At start-up, a peer's address from TF_CONFIG did not answer before the deadline.

    Raised by ``cluster/reach.py`` before the strategy exists, instead of TensorFlow's long
    registration wait; the message names this rank, the peer's rank and ``host:port``.
    """


@dataclass(frozen=True)
class ExitRule:
    """One row of the exit table: exceptions of type ``error`` end a worker with ``code``.

    ``label`` prefixes the worker's one-line message on stderr
    (``resilient-train worker 0: fatal storage error: ...``).
    """

    error: type[BaseException]
    code: int
    label: str


# A failure none of the rows below names: the recipe's or TensorFlow's. Restartable; the
# worker prints its traceback (and first asks runner/failures/diagnose.py whether it is a recipe bug).
UNEXPECTED = ExitRule(Exception, EXIT_FAILURE, "failed")

EXIT_RULES: tuple[ExitRule, ...] = (
    ExitRule(RecipeError, EXIT_FATAL, "fatal"),
    ExitRule(ConfigError, EXIT_FATAL, "fatal"),
    ExitRule(CheckpointIncompatibleError, EXIT_FATAL, "fatal"),
    ExitRule(StaleWriterError, EXIT_FATAL, "fatal"),
    ExitRule(AnomalyRollbackError, EXIT_FAILURE, "numerical anomaly"),  # before its base
    ExitRule(NumericalAnomalyError, EXIT_FATAL, "numerical anomaly"),
    ExitRule(GroupBrokenError, EXIT_GROUP_BROKEN, "group broke"),
    ExitRule(PeerUnreachableError, EXIT_FAILURE, "peer unreachable"),
    ExitRule(StorageUnavailableError, EXIT_FAILURE, "storage unavailable"),  # before its base
    ExitRule(StorageError, EXIT_FATAL, "fatal storage error"),
    UNEXPECTED,
)


def exit_rule_for(exc: BaseException) -> ExitRule:
    """The first row of :data:`EXIT_RULES` that ``exc`` is an instance of (else UNEXPECTED)."""
    return next((rule for rule in EXIT_RULES if isinstance(exc, rule.error)), UNEXPECTED)


def exit_code_for(exc: BaseException) -> int:
    """The exit code of a worker that ``exc`` ended."""
    return exit_rule_for(exc).code
