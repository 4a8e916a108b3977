"""Deterministic recipe errors, recognised and explained so the supervisor stops at once.

Some failures come from the recipe and happen again identically on every restart: a
dataset shorter than ``steps_per_epoch``, a TensorFlow op run at import time (the strategy
then cannot configure collectives). Retrying them burns the restart budget and ends with
a raw TensorFlow error. :func:`explain` turns such an exception into a
:class:`~resilient_train.errors.RecipeError` whose message names the fix; the worker
records it and exits ``EXIT_FATAL`` (3), which the restart policy never retries
(``supervisor/policy.py``). Anything not recognised is returned as ``None`` and handled
as before (a transient failure).

Batch-structure and loss-shape mistakes are raised as RecipeError directly where the step
is traced (``runner/input/batches.py``).

One rule covers what no list of known mistakes can: a failure after a FRESH start (no
checkpoint restored) and before this process finished its first call of training steps
(the trainer's ``untrained_fresh_start``). Nothing has trained yet, so nothing a restart
restores differs: it is the job's bug (a loss that refuses the label shapes, a typo in a
callback), and every restart fails the same way. It becomes a RecipeError with the
underlying error's one line, and the run stops at once (exit 3) instead of spending a
restart before the crash-loop rule stops it. A failure that may be the machine's or the
network's stays restartable even there (:data:`_MAY_BE_TRANSIENT`), and so does any failure
once a step finished or after a restore.

:func:`group_broken` is the opposite case: a failure that is not this worker's at all.
When a peer dies, freezes or becomes unreachable, every survivor's collective fails with
one of TensorFlow's ``UnavailableError``, ``DeadlineExceededError`` (the collective
timeout), ``AbortedError`` or ``CancelledError``, or with another TensorFlow error whose
message says the collective was aborted; the worker records it as
:class:`~resilient_train.errors.GroupBrokenError` and exits ``EXIT_GROUP_BROKEN`` (4), a
restartable symptom that the supervisor never takes for the root cause when another
worker left a better one (``rundir/errorfile.py``).

Recognition is by exception type name and message, without importing TensorFlow, so the
module stays cheap to import and to test.
"""

from __future__ import annotations

import re
from typing import Any

from resilient_train.errors import GroupBrokenError, RecipeError
from resilient_train.rundir.errorfile import is_secondary

__all__ = ["explain", "group_broken", "headline"]

_WHY_MAX = 300
_NODE = re.compile(r"Detected at node (\S+)")
_EMPTY_HEADLINES = frozenset({"Graph execution error:"})
# TensorFlow's error types for "a peer is gone" (tf.errors.*; matched by name and module).
_GROUP_ERRORS = frozenset({"UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError"})

_IMPORT_OP = "Collective ops must be configured at program startup"
# Failures a restart may cure even before the first step: the OS, the network, memory or a
# device (matched by class name along the MRO: OSError covers ConnectionError, TimeoutError
# and the storage errors; TensorFlow's InternalError/UnknownError come from the runtime).
_MAY_BE_TRANSIENT = frozenset({"OSError", "MemoryError", "ResourceExhaustedError", "InternalError", "UnknownError"})
# autograph's "in user code: ... <Type>Error: <message>": the innermost error line.
_TRACED_ERROR = re.compile(r"^\s*(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)
_OP_SUFFIX = re.compile(r"\s*(\[\[.*?\]\])?\s*(\[Op:[^\]]*\])?\s*$")
# autograph turns an exception raised while tracing into a StagingError ("in user code:
# ... RecipeError: <message>"); the message is ours, so take it back out.
_RAISED_WHILE_TRACING = re.compile(r"^\s*RecipeError: (.+)$", re.MULTILINE)


def explain(exc: BaseException, *, recipe_name: str, trainer: Any | None, steps_per_epoch: int | None,
            job_label: str | None = None) -> RecipeError | None:
    """A RecipeError with the fix for a known deterministic recipe failure, else None.

    ``job_label`` names the job in the fresh-start rule's message (``Script train.py`` for
    a fit script; default ``recipe <recipe_name>``).
    """
    type_name = type(exc).__name__
    message = str(exc)
    traced = _RAISED_WHILE_TRACING.search(message)
    if traced:  # runner/input/batches.py raised it inside tf.function; autograph re-wrapped it
        return RecipeError(traced.group(1).strip())
    if _IMPORT_OP in message:
        return RecipeError(
            f"recipe {recipe_name} runs a TensorFlow op at import (before the distribution strategy "
            "starts, TensorFlow says: Collective ops must be configured at program startup); move module-level "
            "TensorFlow calls (tf.constant, tf.config.*, building layers) into build_model() or dataset()"
        )
    if trainer is not None and steps_per_epoch and (
        type_name == "OutOfRangeError" or "End of sequence" in message
    ):
        epoch, yielded = _position(trainer)
        if epoch is not None and yielded is not None and yielded < steps_per_epoch:
            return RecipeError(
                f"recipe {recipe_name}: dataset() yielded {yielded} batches for epoch {epoch}; "
                f"steps_per_epoch is {steps_per_epoch}: add .repeat() (or lower --steps-per-epoch)"
            )
    if getattr(trainer, "untrained_fresh_start", False) and not _may_be_transient(exc):
        return RecipeError(
            f"{job_label or f'recipe {recipe_name}'}: failed before the first training step of a fresh start "
            f"(a bug in the job, not a fault: a restart fails the same way): {headline(exc)}"
        )
    return None


def _may_be_transient(exc: BaseException) -> bool:
    return any(cls.__name__ in _MAY_BE_TRANSIENT for cls in type(exc).__mro__)


def headline(exc: BaseException) -> str:
    """``Type: the line that says what went wrong``, on one line: the innermost error of an
    exception raised while tracing, the op's message of a graph execution error."""
    message = str(exc)
    if "in user code:" in message:
        found = _TRACED_ERROR.findall(message)
        if found:
            name, text = found[-1]
            return f"{name}: {text.strip()[:_WHY_MAX]}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if lines and lines[0] in _EMPTY_HEADLINES:  # TensorFlow's: the op's message ends it, before "[[{{node ...}}]]"
        told = [line for line in lines[1:] if not line.startswith("[[")]
        text = _OP_SUFFIX.sub("", told[-1]) if told else ""
    else:
        text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:_WHY_MAX]}" if text else type(exc).__name__


def group_broken(exc: BaseException) -> GroupBrokenError | None:
    """A GroupBrokenError for a TensorFlow error that says the worker group broke, else None.

    Only TensorFlow's own errors qualify (``tf.errors.*``, module ``tensorflow...``): a
    recipe's ``ConnectionResetError`` from its own download is the recipe's failure.
    """
    cls = type(exc)
    if not cls.__module__.startswith("tensorflow"):
        return None
    if cls.__name__ not in _GROUP_ERRORS and not is_secondary(cls.__name__, str(exc)):
        return None
    broken = GroupBrokenError(f"the worker group broke: {cls.__name__}{_collective_summary(str(exc))}")
    broken.__cause__ = exc  # the error file's traceback shows TensorFlow's, chained
    return broken


def _collective_summary(message: str) -> str:
    """`` at node N: <the line that says why>`` from a TensorFlow message (its first line
    is often just "Graph execution error:"); as much of that as the message has."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    node = _NODE.search(message)
    at_why = next((i for i, line in enumerate(lines) if is_secondary("", line)), None)
    if at_why is None:
        why = next((line for line in lines if line not in _EMPTY_HEADLINES), "")
    else:  # "...unhealthy (stopped sending heartbeats):" names the tasks on the next line
        why = lines[at_why]
        if why.endswith(":") and at_why + 1 < len(lines):
            why = f"{why} {lines[at_why + 1]}"
    at = f" at node {node.group(1)}" if node else ""
    return f"{at}: {why[:_WHY_MAX]}" if why else at


def _position(trainer: Any) -> tuple[int | None, int | None]:
    """(epoch, batches consumed in it) from the trainer's counters; Nones if unreadable."""
    try:
        return int(trainer.epoch.numpy()), int(trainer.step_in_epoch.numpy())
    except Exception:  # a failure report must not fail: the counters may not exist yet
        return None, None
