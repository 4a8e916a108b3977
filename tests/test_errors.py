"""The exit table (errors.EXIT_RULES): each exception type ends a worker with one exact code."""

from __future__ import annotations

import pytest

from resilient_train import errors
from resilient_train.errors import (
    EXIT_FAILURE,
    EXIT_FATAL,
    EXIT_GROUP_BROKEN,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    NOT_RESTARTABLE,
    UNEXPECTED,
    CheckpointCorruptError,
    CheckpointIncompatibleError,
    ConfigError,
    GroupBrokenError,
    PeerUnreachableError,
    RecipeError,
    RestartNotPlacedError,
    RunDirLockedError,
    StaleWriterError,
    StorageError,
    StorageOwnedError,
    StorageUnavailableError,
    exit_code_for,
    exit_rule_for,
)


@pytest.mark.parametrize(
    ("exc", "code", "label"),
    [
        (RecipeError("r"), EXIT_FATAL, "fatal"),
        (ConfigError("c"), EXIT_FATAL, "fatal"),
        (CheckpointIncompatibleError("i"), EXIT_FATAL, "fatal"),
        (StaleWriterError("s"), EXIT_FATAL, "fatal"),
        (StorageUnavailableError("u"), EXIT_FAILURE, "storage unavailable"),
        (StorageError("e"), EXIT_FATAL, "fatal storage error"),
        (StorageOwnedError("o"), EXIT_FATAL, "fatal storage error"),
        (GroupBrokenError("g"), EXIT_GROUP_BROKEN, "group broke"),
        (PeerUnreachableError("p"), EXIT_FAILURE, "peer unreachable"),
        # not in the table: the recipe's, TensorFlow's, or ours that a restart may fix
        (CheckpointCorruptError("x"), EXIT_FAILURE, "failed"),
        (RunDirLockedError("l"), EXIT_FAILURE, "failed"),
        (RestartNotPlacedError("p"), EXIT_FAILURE, "failed"),
        (ValueError("v"), EXIT_FAILURE, "failed"),
        (OSError("o"), EXIT_FAILURE, "failed"),
        (RuntimeError("t"), EXIT_FAILURE, "failed"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_each_exception_type_has_its_exact_exit_code(exc: BaseException, code: int, label: str) -> None:
    assert exit_code_for(exc) == code
    assert exit_rule_for(exc).label == label


def test_a_subclass_comes_before_its_base_in_the_table() -> None:
    rules = errors.EXIT_RULES
    for i, earlier in enumerate(rules):
        for later in rules[i + 1:]:
            assert not issubclass(later.error, earlier.error), (
                f"{later.error.__name__} after its base {earlier.error.__name__}: it would never match")
    assert rules[-1] is UNEXPECTED


def test_unexpected_is_the_catch_all_for_exceptions_only() -> None:
    assert exit_rule_for(ZeroDivisionError()) is UNEXPECTED
    assert exit_rule_for(KeyboardInterrupt()) is UNEXPECTED  # never raised into the table: requested exits pass through


def test_codes_are_distinct_and_the_not_restartable_ones_are_fatal_and_usage() -> None:
    assert len({EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_FATAL, EXIT_GROUP_BROKEN, EXIT_PREEMPTED}) == 6
    assert NOT_RESTARTABLE == {EXIT_FATAL, EXIT_USAGE}  # a broken group is restarted
    assert EXIT_PREEMPTED == 128 + 15


def test_the_placement_errors_cannot_be_confused() -> None:
    from resilient_train.supervisor.launchers.ray import RayPlacementError

    assert issubclass(RayPlacementError, ConfigError)  # before anything ran: the CLI's exit 2
    assert not issubclass(RestartNotPlacedError, ConfigError)  # a restart could not start: run failed, exit 1
