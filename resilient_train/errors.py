"""The few exception types and the exit codes of resilient-train.

Exceptions subclass built-ins so callers can catch them generically; each carries a
message that names the bad value and what would have been accepted.

Exit codes are a contract with schedulers and with the supervisor (see README,
"Exit codes"):

* ``EXIT_OK`` (0): training completed (or was already complete).
* ``EXIT_FAILURE`` (1): training failed; a re-run resumes from the last commit.
* ``EXIT_USAGE`` (2): bad command line, config, recipe or storage URL. Nothing ran.
* ``EXIT_FATAL`` (3): a worker found a problem that a restart cannot fix (broken recipe,
  incompatible checkpoint). The supervisor does not restart on it.
* ``EXIT_PREEMPTED`` (143 = 128 + SIGTERM): the process was asked to stop, saved a
  checkpoint at an agreed step and exited cleanly. Schedulers treat 128-255 as retryable.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_FATAL = 3
EXIT_PREEMPTED = 143


class ConfigError(ValueError):
    """A flag, config key, recipe parameter or TF_CONFIG value is invalid."""


class RecipeError(ValueError):
    """A recipe cannot be loaded or does not satisfy the recipe contract."""


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


class LaunchError(RuntimeError):
    """The launcher could not start a restart's workers (no node can take a lost slot).

    Raised by ``Launcher.start`` only once an attempt of this run has started; the
    supervisor ends the run as failed (``EXIT_FAILURE``, ``summary.json`` with this as the
    root cause), and a re-run resumes from the last commit. The same problem before the
    first attempt is a ``ConfigError`` (exit 2): nothing ran, the request is the likely cause.
    """
