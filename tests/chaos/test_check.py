"""resilient_train.chaos.invariants on hand-built run directories: each invariant, passing and violated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resilient_train.chaos.invariants import check_run, inner_storage_url, load_events
from resilient_train.checkpoint import CheckpointStore

DIGEST = "ab" * 32
OTHER = "cd" * 32


def _emit_nothing(*args: Any, **kwargs: Any) -> None:
    pass


class RunDir:
    """A run directory as the supervisor leaves it, written by hand."""

    def __init__(self, root: Path, *, save_every: int = 5, mode: str = "sync") -> None:
        self.path = root / "run"
        self.storage = root / "ckpts"
        self.path.mkdir()
        self.events: list[dict[str, Any]] = []
        self.job = {"recipe": "recipes/linear_regression.py", "storage": str(self.storage),
                    "save_every_steps": save_every, "steps_per_epoch": 10, "checkpoint_mode": mode}
        self.store = CheckpointStore(str(self.storage), emit=_emit_nothing)
        self.summary: dict[str, Any] = {"status": "completed", "weights_sha256": DIGEST, "storage": str(self.storage)}

    def ev(self, event: str, **fields: Any) -> "RunDir":
        self.events.append({"event": event, "ts": "2026-01-01T00:00:00.000+00:00", **fields})
        return self

    def commit(self, step: int, attempt: int, weights: str | None = None,
               extra: dict[str, Any] | None = None) -> "RunDir":
        local = self.path / "staging" / str(step)
        local.mkdir(parents=True)
        (local / "ckpt.index").write_bytes(b"i" * 10)
        (local / "ckpt.data-00000-of-00001").write_bytes(bytes([step % 256]) * 100)
        self.store.commit(local, run_id="r", epoch=step // 10, step_in_epoch=step % 10, global_step=step,
                          world_size=2, weights_sha256=DIGEST, tf_version="2.21", extra=extra)
        trajectory = {"weights_sha256": weights} if weights else {}
        return self.ev("checkpoint_committed", global_step=step, attempt=attempt, role="chief", rank=0, **trajectory)

    def attempt(self, n: int, reached: int | None) -> "RunDir":
        attempt_dir = self.path / f"attempt-{n}"
        attempt_dir.mkdir(exist_ok=True)
        (attempt_dir / "job.json").write_text(json.dumps(self.job))
        if reached is not None:
            (attempt_dir / "step-0.txt").write_text(f"{reached:<20}\n")
        return self.ev("worker_started", rank=0, pid=999_999_000 + n, attempt=n, role="supervisor")

    def write(self) -> Path:
        (self.path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
        (self.path / "summary.json").write_text(json.dumps(self.summary))
        return self.path


def _crash_then_restore(run: RunDir, *, reached: int, restored: int) -> RunDir:
    run.attempt(1, reached).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1).commit(10, 1)
    run.ev("worker_exited", rank=0, pid=999_999_001, signal="SIGKILL", role="supervisor")
    run.attempt(2, 30).ev("restored", global_step=restored, attempt=2, role="chief")
    return run


def test_a_clean_crash_and_restore_passes(tmp_path: Path) -> None:
    run = _crash_then_restore(RunDir(tmp_path), reached=13, restored=10).commit(15, 2)
    result = check_run(run.write(), DIGEST, exit_code=0)
    assert result.violations == ()
    assert result.restarts == 1
    assert result.restored_steps == (10,)
    assert result.lost_steps == 3
    assert result.checkpoints_verified == 3
    assert result.digest_match


def test_restoring_an_older_checkpoint_than_the_newest_good_one_is_a_violation(tmp_path: Path) -> None:
    run = _crash_then_restore(RunDir(tmp_path), reached=12, restored=5)
    result = check_run(run.write(), DIGEST)
    assert any("newest committed checkpoint that verifies is 10" in v for v in result.violations)


def test_restoring_a_step_never_committed_is_a_violation(tmp_path: Path) -> None:
    run = _crash_then_restore(RunDir(tmp_path), reached=12, restored=11)
    result = check_run(run.write(), DIGEST)
    assert any("restored step 11, never committed" in v for v in result.violations)


def test_a_crash_losing_more_than_the_save_interval_is_a_violation(tmp_path: Path) -> None:
    run = _crash_then_restore(RunDir(tmp_path, save_every=5), reached=16, restored=10)
    result = check_run(run.write(), DIGEST)
    assert [v for v in result.violations if v.startswith("lost_steps")] == [
        "lost_steps: attempt 1 ended by crash at step 16; 6 steps past the last commit were lost, allowed 5"
    ]


def test_async_mode_allows_one_in_flight_save(tmp_path: Path) -> None:
    run = _crash_then_restore(RunDir(tmp_path, save_every=5, mode="async"), reached=16, restored=10)
    assert check_run(run.write(), DIGEST).violations == ()


def _rescued_crash(run: RunDir, *, reached: int, rescued: int, restored: int) -> RunDir:
    """Saves at 10 only; the memory tier (every 3 steps) rescues ``rescued`` after the crash."""
    run.attempt(1, reached).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.ev("memory_tier", every_steps=3, twin_bytes=100, rank=1, attempt=1)
    run.commit(10, 1).commit(rescued, 1).ev("rescue_committed", global_step=rescued, rank=1, attempt=1,
                                            snapshot_age_s=0.1, seconds=0.2)
    run.attempt(2, 30).ev("restored", global_step=restored, attempt=2, role="chief")
    return run


def test_a_rescue_restored_within_the_snapshot_interval_passes(tmp_path: Path) -> None:
    run = _rescued_crash(RunDir(tmp_path, save_every=50), reached=17, rescued=16, restored=16)
    result = check_run(run.write(), DIGEST, exit_code=0)
    assert (result.violations, result.lost_steps) == ((), 1)


def test_a_rescue_losing_more_than_the_snapshot_interval_is_a_violation(tmp_path: Path) -> None:
    # Within the save interval (invariant 4 holds), not within the tier's 3 steps.
    run = _rescued_crash(RunDir(tmp_path, save_every=50), reached=20, rescued=16, restored=16)
    assert check_run(run.write(), DIGEST).violations == (
        "rescue: attempt 1 reached step 20; 4 steps past its rescue of step 16 were lost, allowed 3 (the snapshot interval)",)


@pytest.mark.parametrize("reached, violations", [
    (25, ()),
    (26, ("rescue: attempt 1 reached step 26; 10 steps past its rescue of step 16 were lost, allowed 9 "
          "(the snapshot interval, plus the longest call (auto))",)),
])
def test_auto_allows_the_largest_revised_interval_plus_the_longest_call(tmp_path: Path, reached, violations) -> None:
    # auto decided 3, revised to 5; its snapshots wait for the end of a call (at most 4 steps here)
    run = RunDir(tmp_path, save_every=50).attempt(1, reached).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.ev("memory_tier", setting="auto", every_steps=3, twin_bytes=100, rank=1, attempt=1)
    run.ev("snapshot_interval_revised", every_steps=5, previous_every_steps=3, attempt=1, role="chief")
    run.ev("train_progress", global_step=8, steps_per_call=4, attempt=1, role="chief")
    run.commit(10, 1).commit(16, 1).ev("rescue_committed", global_step=16, rank=1, attempt=1, snapshot_age_s=0.1,
                                       seconds=0.2)
    run.attempt(2, 30).ev("restored", global_step=16, attempt=2, role="chief")
    assert check_run(run.write(), DIGEST).violations == violations


def test_a_restore_older_than_the_rescue_is_a_violation(tmp_path: Path) -> None:
    run = _rescued_crash(RunDir(tmp_path, save_every=50), reached=17, rescued=16, restored=10)
    assert "rescue: attempt 2 restored step 10, older than the rescue of step 16 committed in attempt 1" in \
        check_run(run.write(), DIGEST).violations


def test_a_preemption_must_lose_nothing(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 12)
    run.commit(5, 1).commit(10, 1).ev("preempted", global_step=12, attempt=1, role="chief")
    run.attempt(2, 30).ev("restored", global_step=10, attempt=2, role="chief")
    result = check_run(run.write(), DIGEST)
    assert [v for v in result.violations if v.startswith("lost_steps")] == [
        "lost_steps: attempt 1 ended by preemption at step 12; 2 steps past the last commit were lost, allowed 0"
    ]


def test_a_fresh_start_after_commits_is_a_violation(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 7).commit(5, 1)
    run.attempt(2, 30).ev("fresh_start", attempt=2, role="chief", global_step=0)
    assert any("started from step 0" in v for v in check_run(run.write(), DIGEST).violations)


def test_digest_mismatch_and_failed_exit_are_violations(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 10).commit(10, 1)
    run.summary.update(status="failed", weights_sha256=OTHER)
    result = check_run(run.write(), DIGEST, exit_code=1)
    assert not result.digest_match
    assert [v.split(":")[0] for v in result.violations] == ["exit", "exit", "digest"]


def _corrupt(run: RunDir, step: int) -> None:
    path = run.storage / CheckpointStore.dir_name(step) / "ckpt.data-00000-of-00001"
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_injected_corruption_explains_the_rejection_and_the_verify_failure(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 10).commit(5, 1).commit(10, 1)
    _corrupt(run, 10)
    run.ev("chaos_fault_injected", op="corrupt_newest", global_step=10, role="chaos")
    run.attempt(2, 10).ev("checkpoint_rejected", global_step=10, reason="sha256 mismatch", attempt=2, role="chief")
    run.ev("restored", global_step=5, attempt=2, role="chief")
    result = check_run(run.write(), DIGEST)
    assert result.violations == ()
    assert result.checkpoints_bad == ("10: corrupt: sha256 mismatch in ckpt.data-00000-of-00001",)
    assert result.lost_steps == 5


def test_a_rejection_nobody_injected_is_a_violation(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 10).commit(5, 1).commit(10, 1)
    _corrupt(run, 10)
    run.attempt(2, 10).ev("checkpoint_rejected", global_step=10, reason="sha256 mismatch", attempt=2, role="chief")
    run.ev("restored", global_step=5, attempt=2, role="chief")
    violations = check_run(run.write(), DIGEST).violations
    assert any("rejected checkpoint 10" in v and "not corrupted on purpose" in v for v in violations)
    assert any(v.startswith("verify: checkpoint 10 is corrupt") and "nothing injected" in v for v in violations)


def test_a_corrupt_checkpoint_committed_again_must_verify(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 10).commit(5, 1).commit(10, 1)
    _corrupt(run, 10)
    run.ev("chaos_fault_injected", op="corrupt_newest", global_step=10, role="chaos")
    # The job re-commits step 10 but the store kept the corrupt bytes: an event claims it good.
    run.attempt(2, 10).ev("restored", global_step=5, attempt=2, role="chief")
    run.ev("checkpoint_rejected", global_step=10, reason="sha256 mismatch", attempt=2, role="chief")
    run.ev("checkpoint_committed", global_step=10, attempt=2, role="chief")
    violations = check_run(run.write(), DIGEST).violations
    assert any("committed again after the injected corruption" in v for v in violations)


def test_the_step_markers_count_when_the_supervisor_never_wrote_attempt_reached(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 14).commit(5, 1).commit(10, 1)  # supervisor SIGKILLed: no exits
    run.attempt(2, 30).ev("restored", global_step=10, attempt=2, role="chief")
    result = check_run(run.write(), DIGEST)
    assert result.restart_records[0].reached == 14
    assert result.restart_records[0].ended_by == "crash"
    assert result.lost_steps == 4


def test_inner_storage_url() -> None:
    assert inner_storage_url("faulty:///tmp/x") == "/tmp/x"
    assert inner_storage_url("faulty://s3://b/p") == "s3://b/p"
    assert inner_storage_url("/tmp/y") == "/tmp/y"
    assert inner_storage_url("faulty://runs/x/checkpoints") == "runs/x/checkpoints"  # cwd-relative, as the job saw it


def test_a_crash_before_the_first_commit_loses_what_it_reached(tmp_path: Path) -> None:
    run = RunDir(tmp_path, save_every=5).attempt(1, 8).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.attempt(2, 30).ev("fresh_start", attempt=2, role="chief", global_step=0).commit(30, 2)
    result = check_run(run.write(), DIGEST)
    assert result.lost_steps == 8
    assert [v for v in result.violations if v.startswith("lost_steps")] == [
        "lost_steps: attempt 1 ended by crash at step 8 before any commit; 8 steps were lost, allowed 5"
    ]


def test_verify_finding_nothing_where_the_run_committed_is_a_violation(tmp_path: Path) -> None:
    run = RunDir(tmp_path).attempt(1, 10).commit(10, 1)
    run.summary["storage"] = str(tmp_path / "elsewhere")
    assert any("no checkpoints at" in v for v in check_run(run.write(), DIGEST).violations)


def test_load_events_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "a"}\n{"event": "b"}\n{"event": "c", "x"')
    assert [r["event"] for r in load_events(path)] == ["a", "b"]


def test_check_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from resilient_train.chaos.__main__ import main

    run = RunDir(tmp_path).attempt(1, 10).commit(10, 1).write()
    assert main(["check", str(run), "--reference", DIGEST]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", str(run), "--reference", OTHER]) == 1
    assert "FAIL" in capsys.readouterr().out


# ----------------------------------------------------------------------------- trajectory, hangs, fencing


def _weights(step: int) -> str:
    return f"{step:064x}"


def _reference(tmp_path: Path, steps: tuple[int, ...] = (5, 10, 15, 20)) -> Path:
    """A reference run dir as the checker reads it: its events (what `resilient-train diff` reads)."""
    ref = tmp_path / "reference"
    ref.mkdir()
    events = [{"event": "checkpoint_committed", "global_step": s, "weights_sha256": _weights(s), "attempt": 1}
              for s in steps]
    events += [{"event": "input_digest", "epoch": e, "sha256": f"in{e}"} for e in (0, 1)]
    (ref / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return ref


def _hung_run(tmp_path: Path, *, named: int, blamed: int | None = None, weights=_weights) -> RunDir:
    """Attempt 1 hangs at step 12 (rank 1 stuck), is killed, attempt 2 restores 10 and finishes."""
    run = RunDir(tmp_path).attempt(1, 12).ev("generation_claimed", generation=1, attempt=1, rank=0)
    run.ev("input_digest", epoch=0, sha256="in0", attempt=1)
    run.commit(5, 1, weights(5)).commit(10, 1, weights(10)).ev("input_digest", epoch=1, sha256="in1", attempt=1)
    run.ev("hang_detected", attempt=1, rank=named, global_step=12, seconds=10.4, chosen_by="main thread not in a "
           "TensorFlow op", where="main thread in faults.py:108 _hang_forever", role="supervisor")
    run.ev("worker_exited", rank=0, pid=999_999_001, signal="SIGKILL", role="supervisor", attempt=1)
    run.ev("gang_restart", attempt=2, root_cause_rank=named if blamed is None else blamed, role="supervisor")
    run.attempt(2, 20).ev("generation_claimed", generation=2, attempt=2, rank=0)
    run.ev("restored", global_step=10, attempt=2, role="chief")
    run.commit(15, 2, weights(15)).commit(20, 2, weights(20))
    run.summary["root_cause"] = {"type": "Hang", "rank": named, "attempt": 1, "global_step": 12}
    return run


def test_a_healed_hang_naming_the_stuck_rank_with_the_reference_trajectory_passes(tmp_path: Path) -> None:
    run = _hung_run(tmp_path, named=1).write()
    result = check_run(run, DIGEST, exit_code=0, reference_run=_reference(tmp_path), expected_hangs={1: 1})
    assert result.violations == ()
    assert (result.first_divergent_step, result.last_matching_step, result.first_divergent_epoch) == (None, 20, None)
    assert [(h["attempt"], h["rank"], h["global_step"]) for h in result.hangs] == [(1, 1, 12)]
    assert result.restored_steps == (10,) and result.lost_steps == 2


def test_the_watchdog_naming_the_wrong_rank_is_a_violation(tmp_path: Path) -> None:
    run = _hung_run(tmp_path, named=0).write()
    result = check_run(run, DIGEST, expected_hangs={1: 1})
    assert [v for v in result.violations if v.startswith("hang")] == [
        ("hang: attempt 1 hung on rank 1, but the watchdog named rank 0 (main thread not in a TensorFlow op; "
         "main thread in faults.py:108 _hang_forever)"),
        "hang: the restart after attempt 1 blames rank 0, expected rank 1",
        "hang: summary.json's root cause names rank 0, expected rank 1",
    ]


def test_a_hang_nobody_injected_and_an_injected_hang_never_detected_are_violations(tmp_path: Path) -> None:
    run = _hung_run(tmp_path, named=1).write()
    assert [v for v in check_run(run, DIGEST, expected_hangs={}).violations if v.startswith("hang")] == [
        "hang: attempt 1 hung (rank 1 named, main thread in faults.py:108 _hang_forever) and nothing made it hang"]
    assert [v for v in check_run(run, DIGEST, expected_hangs={1: 1, 2: 0}).violations if v.startswith("hang")] == [
        "hang: attempt 2 was made to hang on rank 0; 0 hang_detected events, expected 1"]
    assert check_run(run, DIGEST).hangs == ()  # without a fault plan hangs are not judged


def test_the_report_names_the_first_divergent_committed_step(tmp_path: Path) -> None:
    from resilient_train.chaos.harness import ScenarioResult
    from resilient_train.chaos.report import table

    run = _hung_run(tmp_path, named=1, weights=lambda s: _weights(s) if s < 15 else OTHER).write()
    result = check_run(run, DIGEST, reference_run=_reference(tmp_path), expected_hangs={1: 1})
    assert (result.first_divergent_step, result.last_matching_step) == (15, 10)
    assert result.violations == (
        "trajectory: the weights diverge from the reference run at committed global step 15 (last matching step: 10)",)
    scenario = ScenarioResult("hang-input", 0, str(run), (), 1, 1, (0,), result, (), 1.0)
    assert "NO (from step 15; same until 10)" in table([scenario])


def test_no_committed_step_in_common_with_the_reference_is_a_violation(tmp_path: Path) -> None:
    run = _hung_run(tmp_path, named=1).write()
    result = check_run(run, DIGEST, reference_run=_reference(tmp_path, steps=(7,)), expected_hangs={1: 1})
    assert result.violations == (f"trajectory: no committed step in common with the reference run {tmp_path / 'reference'}",)


def test_a_commit_by_a_fenced_or_superseded_writer_is_a_violation(tmp_path: Path) -> None:
    run = _hung_run(tmp_path, named=1)
    run.commit(25, 1, _weights(25))  # attempt 1's chief, alive after attempt 2 claimed generation 2
    run.ev("stale_writer_fenced", attempt=1, generation=1, newer_generation=2, op="commit", path="x")
    run.commit(30, 1, _weights(30))
    result = check_run(run.write(), DIGEST, expected_hangs={1: 1})
    assert [v for v in result.violations if v.startswith("fencing")] == [
        "fencing: attempt 1 committed step 25 after attempt 2 claimed a newer generation (a stale writer's commit)",
        "fencing: attempt 1 committed step 30 after it was fenced",
    ]


def test_check_command_compares_with_a_reference_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from resilient_train.chaos.__main__ import main

    run = _hung_run(tmp_path, named=1, weights=lambda s: OTHER if s == 20 else _weights(s)).write()
    assert main(["check", str(run), "--reference", DIGEST, "--reference-run", str(_reference(tmp_path))]) == 1
    out = capsys.readouterr().out
    assert "first divergent committed step 20 (last matching 15)" in out
    assert "hang in attempt 1: rank 1 at global step 12" not in out  # no fault plan: hangs not judged


STALL_ERROR = ("StorageUnavailableError: upload faulty:///c/ckpt-000000000010/ckpt.index failed 5 times; last error: "
               "TimeoutError: upload faulty:///c/ckpt-000000000010/ckpt.index made no progress for 1 s (storage "
               "stalled) (the partial upload was removed)")


def _stalled_run(tmp_path: Path, *, error: str = STALL_ERROR, hang: bool = False, blamed: int = 0) -> RunDir:
    """Attempt 1's store goes quiet at step 10's save: the save fails, attempt 2 resumes from 5."""
    run = RunDir(tmp_path, mode="async").attempt(1, 15).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1)
    run.ev("storage_retry", attempt=1, rank=0, op="upload", try_number=1, error="upload made no progress for 1 s "
           "(storage stalled)")
    if hang:
        run.ev("hang_detected", attempt=1, rank=0, global_step=15, where="persist thread", role="supervisor")
    run.ev("checkpoint_failed", attempt=1, rank=0, global_step=10, error=error)
    run.ev("worker_exited", rank=0, pid=999_999_001, exit_code=1, role="supervisor", attempt=1)
    run.ev("gang_restart", attempt=2, root_cause_rank=blamed, role="supervisor")
    run.attempt(2, 30).ev("restored", global_step=5, attempt=2, role="chief")
    run.commit(10, 2).commit(15, 2)
    run.summary["root_cause"] = {"type": "resilient_train.errors.StorageUnavailableError", "rank": blamed,
                                 "attempt": 1, "global_step": 15, "message": error.split(": ", 1)[1]}
    return run


def test_a_stalled_save_that_fails_and_heals_passes(tmp_path: Path) -> None:
    result = check_run(_stalled_run(tmp_path).write(), DIGEST, exit_code=0, expected_hangs={}, stalled_attempts=(1,))
    assert result.violations == ()
    assert result.restored_steps == (5,) and result.lost_steps == 10  # async: one save in flight, allowed 10


def test_a_stalled_attempt_that_hung_or_failed_otherwise_is_a_violation(tmp_path: Path) -> None:
    other = "StorageUnavailableError: upload x failed 5 times; last error: ConnectionResetError: reset"
    run = _stalled_run(tmp_path, error=other, hang=True, blamed=1).write()
    assert [v for v in check_run(run, DIGEST, stalled_attempts=(1,)).violations if v.startswith("stall")] == [
        f"stall: attempt 1's store was stalled, but no checkpoint_failed names the stall (checkpoint_failed errors: {other})",
        "stall: attempt 1 was declared hung (rank 0), but its save should have failed on the storage deadline first",
        "stall: the restart after attempt 1 blames rank 1, expected the chief (rank 0), whose save failed",
        ("stall: summary.json's root cause is resilient_train.errors.StorageUnavailableError of attempt 1 "
         "(upload x failed 5 times; last error: ConnectionResetError: reset), expected the storage failure naming the stall"),
    ]
    assert not [v for v in check_run(run, DIGEST).violations if v.startswith("stall")]  # no plan: not judged


def test_a_stalled_store_with_a_hang_as_root_cause_is_a_violation(tmp_path: Path) -> None:
    run = _stalled_run(tmp_path)
    run.summary["root_cause"] = {"type": "Hang", "rank": 0, "attempt": 1, "message": "rank 0 made no progress"}
    assert [v for v in check_run(run.write(), DIGEST, stalled_attempts=(1,)).violations if v.startswith("stall")] == [
        "stall: summary.json's root cause is Hang of attempt 1 (rank 0 made no progress), expected the storage "
        "failure naming the stall"]


UNREACHABLE = ("rank 1 (127.0.0.1:4001) could not reach rank 0 (chief) at 127.0.0.1:4999 within 15 s "
               "(connection refused: nothing listens there); check the address in TF_CONFIG and that no firewall "
               "blocks the port between the two hosts")


def _never_joined_run(tmp_path: Path, *, rank: int = 1, message: str = UNREACHABLE) -> RunDir:
    run = RunDir(tmp_path).attempt(1, None)
    run.ev("worker_exited", rank=1, pid=999_999_001, exit_code=1, role="supervisor", attempt=1)
    run.ev("gang_restart", attempt=2, root_cause_rank=rank, role="supervisor")
    run.attempt(2, 30).ev("fresh_start", attempt=2, role="chief", global_step=0)
    run.commit(5, 2).commit(10, 2)
    run.summary["root_cause"] = {"type": "resilient_train.errors.PeerUnreachableError", "rank": rank, "attempt": 1,
                                 "global_step": None, "message": message}
    return run


def test_a_rank_that_never_joined_named_with_its_address_passes(tmp_path: Path) -> None:
    result = check_run(_never_joined_run(tmp_path).write(), DIGEST, exit_code=0, expected_unreachable={1: 1})
    assert result.violations == ()
    assert result.restarts == 1 and result.lost_steps == 0


def test_blaming_another_rank_or_a_message_without_the_address_is_a_violation(tmp_path: Path) -> None:
    run = _never_joined_run(tmp_path, rank=0).write()
    assert [v for v in check_run(run, DIGEST, expected_unreachable={1: 1}).violations if v.startswith("unreach")] == [
        "unreachable: the restart after attempt 1 blames rank 0, expected rank 1, which could not reach its peers",
        f"unreachable: summary.json's root cause (rank 0: {UNREACHABLE}) does not name rank 1 and the host:port it "
        "could not reach",
    ]
    (tmp_path / "b").mkdir()
    vague = "rank 1 could not reach its peers"
    run = _never_joined_run(tmp_path / "b", message=vague).write()
    assert [v for v in check_run(run, DIGEST, expected_unreachable={1: 1}).violations if v.startswith("unreach")] == [
        f"unreachable: summary.json's root cause (rank 1: {vague}) does not name rank 1 and the host:port it could "
        "not reach"]


def test_a_root_cause_that_is_not_the_unreachable_peer_is_a_violation(tmp_path: Path) -> None:
    run = _never_joined_run(tmp_path)
    run.summary["root_cause"] = {"type": "resilient_train.errors.GroupBrokenError", "rank": 0, "attempt": 1,
                                 "message": "the worker group broke: Wait_for_all_tasks_to_register"}
    assert [v for v in check_run(run.write(), DIGEST, expected_unreachable={1: 1}).violations
            if v.startswith("unreach")] == [
        "unreachable: summary.json's root cause is resilient_train.errors.GroupBrokenError of attempt 1 (the worker "
        "group broke: Wait_for_all_tasks_to_register), expected a PeerUnreachableError"]


# ----------------------------------------------------------------------------- parameter-server mode (invariant 12)

PS_RANK, WORKER_RANK = 1, 3  # 0 coordinator, 1 ps, 2..3 workers


class PsRun(RunDir):
    """A --strategy parameter-server run dir: 2 epochs x 10 steps, 1 ps, 2 workers."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, save_every=5)
        self.job.update(strategy="parameter-server", ps=1, workers=2, epochs=2)
        self.summary.update(strategy="parameter-server", global_step=20, restarts=0, worker_restarts=0,
                            weights_sha256=OTHER)  # never the reference's: asynchronous updates

    def commit(self, step: int, attempt: int, weights: str | None = None, *, applied: int | None = None) -> "PsRun":
        local = self.path / "staging" / f"{step}-{attempt}"
        local.mkdir(parents=True)
        (local / "ckpt.index").write_bytes(b"i" * 10)
        (local / "ckpt.data-00000-of-00001").write_bytes(bytes([step % 256]) * 100)
        self.store.commit(local, run_id="r", epoch=step // 10, step_in_epoch=step % 10, global_step=step,
                          world_size=2, weights_sha256=DIGEST, tf_version="2.21",
                          extra={"strategy": "parameter-server", "updates_applied": step + 1 if applied is None else applied})
        return self.ev("checkpoint_committed", global_step=step, attempt=attempt, role="chief", rank=0)


def _ps_kill_run(tmp_path: Path, *, blamed: int = PS_RANK, restored: int = 10, reached: int = 13) -> PsRun:
    run = PsRun(tmp_path)
    run.attempt(1, reached).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1).commit(10, 1)
    run.ev("chaos_fault_injected", op="sigkill_worker", rank=PS_RANK, attempt=1, role="chaos")
    run.ev("gang_restart", attempt=2, root_cause_rank=blamed, role="supervisor")
    run.attempt(2, 20).ev("restored", global_step=restored, attempt=2, role="chief")
    run.commit(15, 2).commit(20, 2)
    run.summary.update(restarts=1, root_cause={"rank": blamed, "attempt": 1, "type": "Signal"})
    return run


def test_a_ps_kill_run_passes_without_a_digest_and_names_the_ps(tmp_path: Path) -> None:
    run = _ps_kill_run(tmp_path)
    result = check_run(run.write(), DIGEST, exit_code=0, check_orphans=False, expected_ps_kills={1: PS_RANK})
    assert result.violations == ()  # the reference digest is not compared in this mode
    assert (result.restored_steps, result.lost_steps, result.digest_match) == ((10,), 3, False)


def test_a_ps_run_may_lose_one_save_interval_even_when_the_job_says_async(tmp_path: Path) -> None:
    run = _ps_kill_run(tmp_path, reached=16)
    run.job["checkpoint_mode"] = "async"  # the coordinator saves synchronously regardless
    result = check_run(run.write(), None, check_orphans=False, expected_ps_kills={1: PS_RANK})
    assert result.violations == (
        "lost_steps: attempt 1 ended by crash at step 16; 6 steps past the last commit were lost, allowed 5",)


def test_a_ps_kill_blamed_on_another_rank_is_named(tmp_path: Path) -> None:
    run = _ps_kill_run(tmp_path, blamed=WORKER_RANK)
    result = check_run(run.write(), None, check_orphans=False, expected_ps_kills={1: PS_RANK})
    assert result.violations == (
        "ps: the restart after attempt 1 blames rank 3, expected the killed ps, rank 1",
        "ps: summary.json's root cause is rank 3 of attempt 1, expected the killed ps, rank 1 of attempt 1",
    )


def test_a_ps_restore_of_an_older_commit_counts_steps_twice(tmp_path: Path) -> None:
    run = PsRun(tmp_path)
    run.attempt(1, 13).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1).commit(10, 1)
    run.ev("gang_restart", attempt=2, root_cause_rank=PS_RANK, role="supervisor")
    run.attempt(2, 20).ev("restored", global_step=5, attempt=2, role="chief")
    run.commit(10, 2).commit(15, 2).commit(20, 2)
    run.summary.update(restarts=1, root_cause={"rank": PS_RANK, "attempt": 1})
    result = check_run(run.write(), None, check_orphans=False, expected_ps_kills={1: PS_RANK})
    assert result.violations == (
        "restore: attempt 2 restored step 5, but the newest committed checkpoint that verifies is 10",
        "ps: attempt 2 committed global_step 10 after 10 was committed (a step counted twice)",
    )


def test_a_ps_run_short_of_its_steps_or_updates_is_named(tmp_path: Path) -> None:
    run = PsRun(tmp_path)
    run.attempt(1, 15).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1).commit(10, 1, applied=9).commit(15, 1)
    run.summary.update(global_step=15)
    result = check_run(run.write(), None, check_orphans=False)
    assert result.violations == (
        "ps: final global_step is 15, expected epochs * steps_per_epoch = 20",
        "ps: checkpoint 10's manifest has updates_applied=9, expected an int >= its global_step 10 "
        "(each step's closure ran at least once)",
    )


def test_the_completed_step_committed_again_after_restoring_it_is_no_double_count(tmp_path: Path) -> None:
    run = PsRun(tmp_path)
    run.attempt(1, 20).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(10, 1).commit(20, 1)
    run.attempt(2, 20).ev("restored", global_step=20, attempt=2, role="chief")
    run.ev("checkpoint_committed", global_step=20, attempt=2, role="chief", rank=0)
    assert check_run(run.write(), None, check_orphans=False).violations == ()


def test_a_killed_ps_worker_must_be_restarted_in_place(tmp_path: Path) -> None:
    run = PsRun(tmp_path)
    run.attempt(1, 20).ev("fresh_start", attempt=1, role="chief", global_step=0)
    run.commit(5, 1).commit(10, 1)
    run.ev("worker_restarted", rank=WORKER_RANK, attempt=1, pid=999_999_100, role="supervisor")
    run.commit(15, 1).commit(20, 1)
    run.summary.update(worker_restarts=1)
    path = run.write()
    assert check_run(path, None, check_orphans=False, expected_ps_kills={1: WORKER_RANK}).violations == ()

    (tmp_path / "gang").mkdir()
    gang = _ps_kill_run(tmp_path / "gang")
    result = check_run(gang.write(), None, check_orphans=False, expected_ps_kills={1: WORKER_RANK})
    assert result.violations == (
        "ps: killing worker rank 3 in attempt 1 cost a gang restart (gang_restart into attempts [2], restored [10], "
        "summary restarts 1); expected a restart in place",
        "ps: worker rank 3 killed in attempt 1: 0 worker_restarted events for it, summary worker_restarts 0; "
        "expected >= 1",
    )


def test_check_command_needs_a_reference_only_for_an_mwms_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from resilient_train.chaos.__main__ import main

    (tmp_path / "mwms").mkdir()
    mwms = RunDir(tmp_path / "mwms").attempt(1, 10).commit(10, 1).write()
    assert main(["check", str(mwms), "--no-orphans"]) == 2
    assert capsys.readouterr().err == (
        f"chaos: error: --reference DIGEST is required for {mwms} (a MultiWorkerMirroredStrategy run); "
        "only a --strategy parameter-server run is checked without one\n")
    (tmp_path / "ps").mkdir()
    ps = PsRun(tmp_path / "ps")
    ps.attempt(1, 20).ev("fresh_start", attempt=1, role="chief", global_step=0)
    ps.commit(10, 1).commit(20, 1)
    assert main(["check", str(ps.write()), "--no-orphans"]) == 0
    out = capsys.readouterr().out
    assert f"digest: {OTHER} (not compared: a parameter-server run is bit-identical to no other)" in out
    assert out.splitlines()[-1] == "PASS"


def _skipping_run(tmp_path: Path, *, listed: tuple[list[int], list[int]] = ([12], [12]),
                  weights_10: str = _weights(10), skipped_event: bool = True) -> RunDir:
    """A NaN at step 12 in every attempt: attempt 1 detects it, attempt 2's replay meets it again
    (deterministic, skip), attempt 3 skips the batch of 12 and commits 15 and 20 (``listed``: their
    manifests' skipped_steps), whose weights differ from the reference's from there on."""
    run = RunDir(tmp_path).attempt(1, 12).ev("input_digest", epoch=0, sha256="in0", attempt=1)
    run.commit(5, 1, _weights(5)).commit(10, 1, weights_10).ev("input_digest", epoch=1, sha256="in1", attempt=1)
    run.ev("anomaly_detected", kind="nonfinite", global_step=12, action="rollback", attempt=1, role="chief")
    run.ev("worker_exited", rank=0, pid=999_999_001, exit_code=1, role="supervisor", attempt=1)
    run.attempt(2, 11).ev("restored", global_step=10, attempt=2, role="chief")
    run.ev("rolled_back", global_step=10, anomaly_step=12, attempt=2, role="chief")
    run.ev("replay_verdict", global_step=12, verdict="deterministic", action="skip", attempt=2, role="chief")
    run.attempt(3, 20).ev("restored", global_step=10, attempt=3, role="chief")
    if skipped_event:
        run.ev("batch_skipped", global_step=12, epoch=1, step_in_epoch=1, attempt=3, role="chief")
    run.commit(15, 3, OTHER, extra={"skipped_steps": listed[0]}).commit(20, 3, OTHER, extra={"skipped_steps": listed[1]})
    return run


def test_a_run_that_skipped_a_batch_may_diverge_from_the_reference_from_that_step_on(tmp_path: Path) -> None:
    result = check_run(_skipping_run(tmp_path).write(), DIGEST, exit_code=0, reference_run=_reference(tmp_path),
                       check_finite=False)
    assert result.violations == ()
    assert (result.skipped_steps, result.first_divergent_step, result.last_matching_step) == ((12,), 15, 10)
    from resilient_train.chaos.harness import ScenarioResult
    from resilient_train.chaos.report import table

    row = table([ScenarioResult("nan-batch", 0, str(tmp_path / "run"), (), 1, 1, (0,), result, (), 1.0)])
    assert "yes, the re-run's (skipped 12)" in row  # its digest is compared with a re-run's (harness.py)


def test_a_divergence_before_the_skipped_step_or_a_manifest_without_the_skip_is_a_violation(tmp_path: Path) -> None:
    run = _skipping_run(tmp_path, listed=([12], []), weights_10=OTHER, skipped_event=False).write()
    result = check_run(run, DIGEST, exit_code=0, reference_run=_reference(tmp_path), check_finite=False)
    assert result.violations == (
        "skips: the batch of global step 12 was to be skipped (replay_verdict action skip), but no batch_skipped of "
        "that step followed",
        "skips: checkpoint 20's manifest lists skipped_steps [], expected [12] (the run's skipped steps up to its step)",
        "trajectory: the weights diverge from the reference run at committed global step 10 (last matching step: 5)",
    )


def test_every_committed_checkpoints_tensors_are_read_and_a_non_finite_one_is_named(tmp_path: Path) -> None:
    import tensorflow as tf

    from resilient_train.chaos.invariants import finite_checks

    store = CheckpointStore(str(tmp_path / "ckpts"), emit=_emit_nothing)
    for step, value in ((5, 1.0), (10, float("nan"))):
        local = tmp_path / "staging" / str(step)
        tf.train.Checkpoint(kernel=tf.Variable([value, 2.0]), step=tf.Variable(step, dtype=tf.int64)).write(
            str(local / "ckpt"))
        store.commit(local, run_id="r", epoch=0, step_in_epoch=step, global_step=step, world_size=1,
                     weights_sha256=DIGEST, tf_version="2.21")
    violations: list[str] = []
    assert finite_checks(str(tmp_path / "ckpts"), None, violations) == (5, 10)
    assert violations == ["finite: committed checkpoint 10 holds non-finite values in kernel/.ATTRIBUTES/VARIABLE_VALUE"]


def test_expected_events_must_be_exactly_as_many_in_order_with_their_fields() -> None:
    from resilient_train.chaos.harness import expectation_problems
    from resilient_train.chaos.scenarios import Scenario, WorkerFault

    scenario = Scenario("nan-batch", "x", (WorkerFault("nan_loss", 12, rank=1, attempt="all"),), expect_events=(
        {"event": "anomaly_detected", "global_step": 12, "values": {"loss": "nan"}, "attempt": 1},
        {"event": "replay_verdict", "global_step": 12, "verdict": "deterministic", "attempt": 2}))
    detected = {"event": "anomaly_detected", "global_step": 12, "values": {"loss": "nan", "accuracy": 0.1},
                "attempt": 1, "rank": 0}
    verdict = {"event": "replay_verdict", "global_step": 12, "verdict": "deterministic", "attempt": 2}
    assert expectation_problems(scenario, [detected, {"event": "restored"}, verdict]) == []
    assert expectation_problems(scenario, [detected, {**verdict, "verdict": "transient"}]) == [
        "expected 1 replay_verdict event(s) [{'global_step': 12, 'verdict': 'deterministic', 'attempt': 2}], got 1: "
        "[{'global_step': 12, 'verdict': 'transient', 'attempt': 2}]"]
    assert expectation_problems(scenario, [detected, detected, verdict]) == [
        "expected 1 anomaly_detected event(s) [{'global_step': 12, 'values': {'loss': 'nan'}, 'attempt': 1}], got 2: "
        "[{'global_step': 12, 'values': {'loss': 'nan', 'accuracy': 0.1}, 'attempt': 1}, "
        "{'global_step': 12, 'values': {'loss': 'nan', 'accuracy': 0.1}, 'attempt': 1}]"]
    assert len(expectation_problems(scenario, [{**detected, "values": {"loss": 1.0}}, verdict])) == 1
