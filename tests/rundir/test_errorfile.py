"""Error files (worker side) and the root-cause choice (supervisor side)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from resilient_train.errors import (
    EXIT_FAILURE,
    EXIT_FATAL,
    EXIT_GROUP_BROKEN,
    EXIT_OK,
    EXIT_USAGE,
    CheckpointIncompatibleError,
    ConfigError,
    GroupBrokenError,
    RecipeError,
    StorageError,
    StorageUnavailableError,
)
from resilient_train.rundir.errorfile import (
    RootCause,
    WorkerError,
    choose_root_cause,
    is_secondary,
    read_errors,
    record_exception,
    recording,
    tail_lines,
)

T0 = 1_700_000_000.5  # 2023-11-14T22:13:20.500Z


class UnavailableError(Exception):
    """Stands in for tf.errors.UnavailableError: matched by name, TF never imported."""


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def worker_error(
    rank: int,
    time: float,
    *,
    type: str = "ValueError",
    message: str = "boom",
    secondary: bool = False,
    global_step: int | None = 7,
) -> WorkerError:
    return WorkerError(
        rank=rank,
        pid=1000 + rank,
        type=type,
        message=message,
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "train.py", line 3, in step\n'
            "    raise thing\n"
            f"{type}: {message}\n"
        ),
        global_step=global_step,
        time=time,
        time_iso="",
        secondary=secondary,
    )


def no_log(rank: int) -> list[str]:
    return []


# --- worker side ------------------------------------------------------------------------


def test_record_exception_writes_every_field(tmp_path: Path) -> None:
    exc = _raised(ValueError("boom"))
    path = record_exception(tmp_path / "attempt-0", 1, exc, global_step=7, clock=lambda: T0)

    assert path == tmp_path / "attempt-0" / "error-1.json"
    data = json.loads(path.read_text())
    traceback_text = data.pop("traceback")
    assert data == {
        "rank": 1,
        "pid": os.getpid(),
        "type": "ValueError",
        "message": "boom",
        "global_step": 7,
        "time": T0,
        "time_iso": "2023-11-14T22:13:20.500+00:00",
        "secondary": False,
    }
    assert traceback_text.startswith("Traceback (most recent call last):\n")
    assert "raise exc" in traceback_text
    assert traceback_text.endswith("ValueError: boom\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["error-1.json"]  # no temp left


def test_record_exception_names_the_qualified_type_and_flags_peer_failures(
    tmp_path: Path,
) -> None:
    exc = _raised(UnavailableError("Socket closed"))
    path = record_exception(tmp_path, 0, exc, global_step=None, clock=lambda: T0)
    data = json.loads(path.read_text())
    assert data["type"] == f"{__name__}.UnavailableError"
    assert data["secondary"] is True
    assert data["global_step"] is None


def test_record_exception_replaces_an_earlier_file(tmp_path: Path) -> None:
    record_exception(tmp_path, 0, _raised(ValueError("first")), global_step=1, clock=lambda: T0)
    record_exception(tmp_path, 0, _raised(KeyError("second")), global_step=2, clock=lambda: T0)
    [error] = read_errors(tmp_path)
    assert (error.type, error.message, error.global_step) == ("KeyError", "'second'", 2)


@pytest.mark.parametrize(
    ("type_name", "message", "expected"),
    [
        ("tensorflow.python.framework.errors_impl.UnavailableError", "anything", True),
        ("tensorflow.python.framework.errors_impl.CancelledError", "", True),
        ("tensorflow.python.framework.errors_impl.DeadlineExceededError", "", True),
        (
            "tensorflow.python.framework.errors_impl.InternalError",
            "Collective ops is aborted by: failed to connect to all addresses\n"
            "The error could be from a previous operation. Restart your program to reset.",
            True,
        ),
        ("UnknownError", "Connection reset by peer", True),
        ("InternalError", "RecvBuf failed: failed to connect to all addresses", True),
        (
            "InternalError",
            "Task /job:worker/replica:0/task:0 heartbeat timeout. This indicates that the "
            "remote task has failed, got preempted, or crashed unexpectedly.",
            True,
        ),
        ("AbortedError", "The coordination service has stopped.", True),
        ("InternalError", "The following tasks are unhealthy (stopped sending heartbeats):", True),
        ("ValueError", "loss is NaN at step 7", False),
        ("tensorflow.python.framework.errors_impl.InvalidArgumentError", "bad shape", False),
        ("OSError", "[Errno 2] No such file or directory: 'data.npz'", False),
        ("RuntimeError", "collective op failed", False),
    ],
)
def test_is_secondary(type_name: str, message: str, expected: bool) -> None:
    assert is_secondary(type_name, message) is expected


# --- the worker's one error path: recording ---------------------------------------------


def _recorded(tmp_path: Path, exc: BaseException, *, rank: int = 2, step=lambda: 11, **hooks):
    err = io.StringIO()
    with recording("resilient-train worker", err=err, clock=lambda: T0) as state:
        state.locate(tmp_path, rank)
        state.global_step = step
        for name, hook in hooks.items():
            setattr(state, name, hook)
        raise exc
    return state, err.getvalue()


def test_recording_records_and_returns_the_exit_code(tmp_path: Path) -> None:
    state, err = _recorded(tmp_path, ZeroDivisionError("division by zero"))
    assert state.exit_code == EXIT_FAILURE
    [error] = read_errors(tmp_path)
    assert (error.rank, error.type, error.message, error.global_step, error.time) == (
        2,
        "ZeroDivisionError",
        "division by zero",
        11,
        T0,
    )
    assert state.error_file == tmp_path / "error-2.json"
    assert err.startswith("Traceback (most recent call last):") and err.endswith("ZeroDivisionError: division by zero\n")


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (RecipeError("no dataset"), EXIT_FATAL, "resilient-train worker 2: fatal: no dataset"),
        (ConfigError("Received x=0"), EXIT_FATAL, "resilient-train worker 2: fatal: Received x=0"),
        (CheckpointIncompatibleError("dense/kernel"), EXIT_FATAL, "resilient-train worker 2: fatal: dense/kernel"),
        (StorageUnavailableError("s3 down"), EXIT_FAILURE, "resilient-train worker 2: storage unavailable: s3 down"),
        (StorageError("no bucket"), EXIT_FATAL, "resilient-train worker 2: fatal storage error: no bucket"),
    ],
)
def test_recording_a_known_error_is_one_line_and_the_table_code(tmp_path: Path, exc, code, line) -> None:
    state, err = _recorded(tmp_path, exc, on_failure=lambda: pytest.fail("on_failure runs for unexpected errors only"))
    assert (state.exit_code, err) == (code, line + "\n")
    [error] = read_errors(tmp_path)
    assert (error.type, error.message) == (f"resilient_train.errors.{type(exc).__name__}", str(exc))


def test_recording_records_the_diagnosed_recipe_bug_instead(tmp_path: Path) -> None:
    seen: list[BaseException] = []

    def diagnose(exc: Exception) -> Exception | None:
        seen.append(exc)
        return RecipeError("dataset() yielded 3 batches; add .repeat()")

    state, err = _recorded(tmp_path, KeyError("End of sequence"), diagnose=diagnose,
                           on_failure=lambda: pytest.fail("a recipe bug is not drained"))
    assert [type(e) for e in seen] == [KeyError]
    assert (state.exit_code, err) == (EXIT_FATAL, "resilient-train worker 2: fatal: dataset() yielded 3 batches; add .repeat()\n")
    [error] = read_errors(tmp_path)
    assert (error.type, error.message) == ("resilient_train.errors.RecipeError", "dataset() yielded 3 batches; add .repeat()")


def test_recording_an_unexpected_error_runs_on_failure_after_the_file_is_written(tmp_path: Path) -> None:
    files_at_drain: list[list[str]] = []
    state, _ = _recorded(tmp_path, ValueError("loss is NaN"), diagnose=lambda exc: None,
                         on_failure=lambda: files_at_drain.append(sorted(p.name for p in tmp_path.iterdir())))
    assert state.exit_code == EXIT_FAILURE
    assert files_at_drain == [["error-2.json"]]


def test_recording_a_broken_group_is_one_line_exit_4_drained_and_secondary(tmp_path: Path) -> None:
    drained: list[bool] = []

    def diagnose(exc: Exception) -> Exception | None:
        return GroupBrokenError("the worker group broke: UnavailableError: Socket closed")

    state, err = _recorded(tmp_path, UnavailableError("Socket closed"), diagnose=diagnose,
                           on_failure=lambda: drained.append(True))
    assert (state.exit_code, err) == (
        EXIT_GROUP_BROKEN, "resilient-train worker 2: group broke: the worker group broke: UnavailableError: Socket closed\n")
    assert drained == [True]  # the chief's in-flight checkpoint may still commit
    [error] = read_errors(tmp_path)
    assert (error.type, error.secondary) == ("resilient_train.errors.GroupBrokenError", True)


def test_a_sigkilled_peer_is_the_root_cause_not_the_survivor_that_exited_4() -> None:
    exits = {0: (1000, EXIT_GROUP_BROKEN, T0 + 0.5), 1: (1001, -9, T0 + 1.0)}
    errors = [worker_error(0, T0, type="resilient_train.errors.GroupBrokenError",
                           message="the worker group broke: UnavailableError: Socket closed", secondary=True)]
    root = choose_root_cause(exits, errors, lambda rank: [])
    assert root is not None
    assert (root.rank, root.exit_description, root.secondary_ranks) == (1, "killed by SIGKILL", [0])
    assert root.secondary_details[0] == (
        "(pid 1000) group broken (exit 4): GroupBrokenError: the worker group broke: UnavailableError: "
        "Socket closed (secondary: peer failure)")


def test_recording_survives_an_unreadable_step(tmp_path: Path) -> None:
    def broken_step() -> int:
        raise UnavailableError("step variable gone")

    state, _ = _recorded(tmp_path, KeyError("x"), rank=0, step=broken_step)
    assert state.exit_code == EXIT_FAILURE
    [error] = read_errors(tmp_path)
    assert (error.type, error.global_step) == ("KeyError", None)


def test_recording_ignores_requested_exits_and_a_clean_exit_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        with recording() as state:
            state.locate(tmp_path, 0)
            raise SystemExit(143)
    with recording() as state:
        state.locate(tmp_path, 0)
    assert state.exit_code == EXIT_OK
    assert state.error_file is None
    assert list(tmp_path.iterdir()) == []


def test_recording_before_locate_is_a_usage_error_without_a_file(tmp_path: Path) -> None:
    err = io.StringIO()
    with recording("resilient-train worker", err=err) as state:
        raise ConfigError("TF_CONFIG task index 4 is out of range")
    assert (state.exit_code, err.getvalue()) == (EXIT_USAGE, "resilient-train worker: TF_CONFIG task index 4 is out of range\n")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ZeroDivisionError):  # not a usage error: a bug, with its traceback
        with recording(err=err):
            _ = 1 / 0


def test_record_exception_leaves_no_temporary_file(tmp_path: Path) -> None:
    record_exception(tmp_path, 3, _raised(ValueError("x")), global_step=None, clock=lambda: T0)
    assert [p.name for p in tmp_path.iterdir()] == ["error-3.json"]


# --- reading ----------------------------------------------------------------------------


def test_read_errors_skips_torn_and_foreign_files_with_a_note(tmp_path: Path) -> None:
    good = record_exception(tmp_path, 1, _raised(ValueError("ok")), global_step=3)
    whole = good.read_text()
    (tmp_path / "error-0.json").write_text(whole[: len(whole) // 2])  # torn mid-write
    (tmp_path / "error-2.json").write_text('{"rank": 2}')
    (tmp_path / "error-3.json").write_text("[1, 2]")
    (tmp_path / ".error-4.json.tmp-99").write_text("{")  # a writer's temp: not an error file
    notes: list[str] = []

    errors = read_errors(tmp_path, note=notes.append)

    assert [(e.rank, e.message) for e in errors] == [(1, "ok")]
    assert len(notes) == 3
    assert notes[0].startswith(f"skipped unreadable error file {tmp_path / 'error-0.json'}: ")
    assert notes[1].startswith(f"skipped unreadable error file {tmp_path / 'error-2.json'}: ")
    assert "Missing field 'pid'" in notes[1]
    assert notes[2].endswith("Received a list; expected a JSON object")


def test_read_errors_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert read_errors(tmp_path / "nope") == []


def test_from_json_names_the_bad_field() -> None:
    data = json.loads(json.dumps(worker_error(0, T0).__dict__))
    data["global_step"] = "7"
    with pytest.raises(ValueError) as info:
        WorkerError.from_json(data)
    assert str(info.value) == "Received global_step='7'; expected int or NoneType"
    data["global_step"] = True
    with pytest.raises(ValueError, match=r"Received global_step=True"):
        WorkerError.from_json(data)


def test_from_json_round_trip() -> None:
    error = worker_error(3, T0, global_step=None, secondary=True)
    assert WorkerError.from_json(json.dumps(error.__dict__)) == error


# --- root cause -------------------------------------------------------------------------


def test_primary_sigkill_beats_an_earlier_secondary_error() -> None:
    exits = {0: (1000, -9, T0 + 1.0), 1: (1001, 1, T0 + 2.0)}
    errors = [
        worker_error(1, T0, type="tensorflow.UnavailableError", message="peer gone", secondary=True)
    ]
    asked: list[int] = []

    def log_tail(rank: int) -> list[str]:
        asked.append(rank)
        return ["step 7 loss=0.1"]

    root = choose_root_cause(exits, errors, log_tail, reached=7)  # the SIGKILLed rank recorded no step

    assert root is not None
    assert (root.rank, root.pid, root.exit_description, root.error) == (
        0,
        1000,
        "killed by SIGKILL",
        None,
    )
    assert (root.returncode, root.global_step, root.secondary_ranks) == (-9, 7, [1])
    assert root.last_log_lines == ["step 7 loss=0.1"]
    assert root.signature == "killed by SIGKILL"
    assert asked == [0]
    assert root.render() == (
        "root cause: worker 0 (pid 1000) killed by SIGKILL at global_step 7\n"
        "  log of worker 0 (last 1 lines):\n"
        "    step 7 loss=0.1\n"
        "worker 1: (pid 1001) exit code 1: UnavailableError: peer gone "
        "(secondary: peer failure)"
    )


def test_earliest_primary_error_wins_and_renders_its_traceback() -> None:
    exits = {0: (1000, 1, T0 + 5.0), 1: (1001, 1, T0 + 4.0), 2: (1002, -15, T0 + 6.0)}
    errors = [
        worker_error(0, T0 + 3.0, message="second"),
        worker_error(1, T0 + 2.0, type="KeyError", message="'first'", global_step=12),
    ]

    root = choose_root_cause(exits, errors, no_log)

    assert root is not None
    assert (root.rank, root.global_step, root.secondary_ranks) == (1, 12, [0, 2])
    assert root.error == errors[1]
    assert root.signature == "KeyError: 'first'"
    assert root.render() == (
        "root cause: worker 1 (pid 1001) exit code 1 at global_step 12\n"
        "  KeyError: 'first'\n"
        "  traceback (last 4 lines):\n"
        "    Traceback (most recent call last):\n"
        '      File "train.py", line 3, in step\n'
        "        raise thing\n"
        "    KeyError: 'first'\n"
        "worker 0: (pid 1000) exit code 1: ValueError: second (failed after the root cause)\n"
        "worker 2: (pid 1002) killed by SIGTERM (failed after the root cause)"
    )


def test_only_secondary_failures_earliest_wins() -> None:
    exits = {0: (1000, 1, T0 + 9.0), 1: (1001, 1, T0 + 9.0)}
    errors = [
        worker_error(0, T0 + 2.0, type="CancelledError", message="b", secondary=True),
        worker_error(1, T0 + 1.0, type="UnavailableError", message="a", secondary=True),
    ]
    root = choose_root_cause(exits, errors, no_log)
    assert root is not None
    assert (root.rank, root.secondary_ranks) == (1, [0])


def test_signal_death_without_file_is_primary_at_exit_time() -> None:
    # The OOM-killed worker 1 dies after worker 0 failed on its own: worker 0 came first.
    exits = {0: (1000, 1, T0 + 3.0), 1: (1001, -9, T0 + 2.5)}
    errors = [worker_error(0, T0 + 2.0)]
    root = choose_root_cause(exits, errors, no_log)
    assert root is not None
    assert (root.rank, root.secondary_ranks) == (0, [1])


def test_equal_times_break_ties_by_rank() -> None:
    exits = {2: (1002, -9, T0), 1: (1001, -9, T0)}
    root = choose_root_cause(exits, [], no_log)
    assert root is not None
    assert (root.rank, root.global_step, root.secondary_ranks) == (1, None, [2])
    assert root.render().splitlines()[0] == "root cause: worker 1 (pid 1001) killed by SIGKILL"


def test_clean_and_preempted_exits_have_no_root_cause() -> None:
    exits = {0: (1000, 0, T0), 1: (1001, 143, T0), 2: (1002, 0, T0)}
    assert choose_root_cause(exits, [], no_log) is None
    assert choose_root_cause({}, [], no_log) is None


def test_error_of_a_worker_not_yet_reaped_still_counts() -> None:
    errors = [worker_error(3, T0)]
    root = choose_root_cause({0: (1000, -15, T0 + 1.0)}, errors, no_log)
    assert root is not None
    assert (root.rank, root.exit_description, root.returncode) == (3, "still running", None)


def test_render_without_error_or_log() -> None:
    root = RootCause(0, 42, "killed by SIGKILL", None, [], [])
    assert root.render() == "root cause: worker 0 (pid 42) killed by SIGKILL"


# --- log tails --------------------------------------------------------------------------


def test_tail_lines_reads_the_end_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    expected = [f"line {i}" for i in range(95, 100)]
    assert tail_lines(log, 5, block_size=7) == expected
    assert tail_lines(log, 5) == expected
    assert tail_lines(log, 500) == [f"line {i}" for i in range(100)]
    assert tail_lines(log, 0) == []


def test_tail_lines_edge_cases(tmp_path: Path) -> None:
    assert tail_lines(tmp_path / "missing.log") == []
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert tail_lines(empty) == []
    partial = tmp_path / "partial.log"
    partial.write_bytes(b"a\nb\n\xff half a line")
    assert tail_lines(partial, 2, block_size=3) == ["b", "\ufffd half a line"]


def test_root_cause_log_tail_drops_tensorflow_startup_noise(tmp_path):
    from resilient_train.rundir.errorfile import log_tail

    log = tmp_path / "worker-0.log"
    log.write_text(
        "I0000 00:00:1732 cpu_feature_guard.cc:210] This TensorFlow binary is optimized to use available CPU instructions\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.\n"
        "2026-11-23 10:00:00 I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.\n"
        "2026-11-23 10:00:00 I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers on your machine\n"
        "E0000 00:00:1732 cuda_blas.cc:1418] Unable to register cuBLAS factory\n"
        "training step 3\n"
        "ValueError: the real problem\n"
    )
    assert log_tail(log, 15) == ["training step 3", "ValueError: the real problem"]


def test_root_cause_log_tail_drops_the_eager_strategy_advice(tmp_path):
    # Issue 36: 8 of the tail's 15 lines were this warning; the 15 kept are the run's own.
    from resilient_train.rundir.errorfile import TF_NOISE_PATTERNS, log_tail

    advice = ("WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead currently. "
              "We will be working on improving this in the future, but for now please wrap `call_for_each_replica` "
              "or `experimental_run` or `run` inside a tf.function to get the best performance.")
    own = [f"09:00:{i:02d} train_progress global_step={i}" for i in range(20)]
    log = tmp_path / "worker-0.log"
    log.write_text("\n".join(line for i, step in enumerate(own) for line in ([advice] if i % 2 else []) + [step]) + "\n")
    assert log_tail(log, 15) == own[-15:]
    assert "eager strategy advice" in TF_NOISE_PATTERNS


def test_a_rank_the_supervisor_tore_down_is_secondary_to_a_survivor_that_says_the_group_broke():
    # A partition: the chief's collective fails (group broke, recorded, exit 4); the cut
    # rank 1 never records anything and is SIGKILLed by the supervisor's teardown.
    chief = worker_error(0, 5.0, type="resilient_train.errors.GroupBrokenError", secondary=True, global_step=8,
                         message="the worker group broke: UnavailableError: stopped sending heartbeats")
    exits = {0: (1000, 4, 6.0), 1: (1001, -9, 7.0)}
    root = choose_root_cause(exits, [chief], lambda rank: [], torn_down={1})
    assert root is not None
    assert (root.rank, root.global_step, root.secondary_ranks) == (0, 8, [1])
    assert root.secondary_details[1] == "(pid 1001) killed by the supervisor's teardown (secondary: peer failure)"
    # Killed by someone else (not our teardown): the SIGKILL is the root cause, as before.
    assert choose_root_cause(exits, [chief], lambda rank: []).rank == 1


def test_a_refusal_renders_as_its_one_line() -> None:
    """A job the runner refuses (errors.py RecipeRefused) is a user error, not a crash: one line
    in the user's terms, no traceback, no log tail, no secondary failures (the log keeps them)."""
    exits = {0: (1000, 3, T0 + 5.0), 1: (1001, 4, T0 + 6.0)}
    message = "Script fit_twohead.py: its model was compiled with 2 outputs; one output with one loss is supported"
    errors = [worker_error(0, T0 + 4.0, type="resilient_train.errors.RecipeRefused", message=message)]
    root = choose_root_cause(exits, errors, lambda rank: ["a log line"])
    assert root is not None and root.rank == 0
    assert root.render() == message
