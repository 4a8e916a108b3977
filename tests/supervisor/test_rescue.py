"""Who the supervisor asks to rescue, and how it recognises the answer (supervisor/rescue.py)."""

from pathlib import Path

from resilient_train.supervisor.attempt import Worker
from resilient_train.supervisor.rescue import (RescueWait, choose_hang_rescuer, choose_rescuer, failed_ranks,
                                               nothing_left_to_commit)


def workers(*codes):
    return [Worker(rank=rank, attempt=1, process=None, log_path=Path("x"), returncode=code)
            for rank, code in enumerate(codes)]


def test_the_lowest_ranked_survivor_rescues_after_a_failure():
    assert choose_rescuer(workers(None, -9, None)).rank == 0
    assert choose_rescuer(workers(-9, None, None)).rank == 1
    assert choose_rescuer(workers(1, None, 4, None)).rank == 1
    assert failed_ranks(workers(1, None, 4, None)) == [0, 2]


def test_no_rescue_without_a_failure_a_survivor_or_with_a_preemption():
    assert choose_rescuer(workers(None, None)) is None  # nobody failed
    assert choose_rescuer(workers(0, None)) is None  # a clean exit is no failure
    assert choose_rescuer(workers(-9, -9)) is None  # nobody alive
    assert choose_rescuer(workers(143, None)) is None  # a preemption: the peers save at the agreed step
    assert choose_rescuer(workers(-9, 143, None)) is None


def test_no_rescue_after_a_fatal_error():
    # a bug in the job or a refusal (exit 3): the run stops, no restart follows to restore a rescue
    assert choose_rescuer(workers(3, None)) is None
    assert choose_rescuer(workers(None, 3, None)) is None
    assert choose_rescuer(workers(-9, 3, None)) is None


def test_on_a_hang_the_lowest_ranked_worker_but_the_stuck_one_rescues():
    assert choose_hang_rescuer(workers(None, None, None), stuck=1).rank == 0
    assert choose_hang_rescuer(workers(None, None, None), stuck=0).rank == 1  # a frozen chief cannot answer
    assert choose_hang_rescuer(workers(-9, None, None), stuck=1).rank == 2
    assert choose_hang_rescuer(workers(None, -9), stuck=0) is None


def test_the_wait_takes_only_the_asked_ranks_answer_in_this_attempt():
    wait = RescueWait(rank=1, attempt=2)
    wait.observe([{"event": "rescue_committed", "rank": 1, "attempt": 1},
                  {"event": "rescue_skipped", "rank": 0, "attempt": 2},
                  {"event": "checkpoint_committed", "rank": 1, "attempt": 2}])
    assert wait.answer is None
    wait.observe([{"event": "rescue_skipped", "rank": 1, "attempt": 2, "reason": "no snapshot yet"}])
    assert wait.answer["reason"] == "no snapshot yet"


# ------------------------------------------------------------ the supervisor's loop, through its seams

import json  # noqa: E402
import signal  # noqa: E402

import pytest  # noqa: E402

from resilient_train.errors import EXIT_FAILURE  # noqa: E402
from tests.supervisor.test_supervisor_loop import FakeProcess, events, make  # noqa: E402


@pytest.fixture
def answering(monkeypatch, tmp_path):
    """Fake workers that answer a rescue request the way a real one does: an event line."""
    answers: dict[int, dict] = {}
    plain = FakeProcess.send_signal

    def send_signal(self, sig):
        plain(self, sig)
        rank = self.pid - 4000  # FakeSpawner hands out pids 4000 + spawn order: rank in attempt 1
        if sig == signal.SIGUSR2 and self.returncode is None and rank in answers:
            with open(tmp_path / "run" / "events.jsonl", "a") as handle:
                handle.write(json.dumps({"event": answers[rank].pop("event"), "rank": rank, "attempt": 1,
                                         **answers[rank]}) + "\n")

    monkeypatch.setattr(FakeProcess, "send_signal", send_signal)
    return answers


def test_a_failure_asks_the_lowest_survivor_to_rescue_before_stopping(tmp_path, answering):
    answering[0] = {"event": "rescue_committed", "global_step": 16, "snapshot_age_s": 0.1, "seconds": 0.2}
    scripts = [{"exit_at": None}, {"exit_at": 0.5, "exit_code": -signal.SIGKILL}, {"exit_at": None}]
    supervisor, spawner, _, out = make(tmp_path, scripts, workers=3, global_batch_size=30, max_restarts=0,
                                       snapshot_every=5)
    assert supervisor.run() == EXIT_FAILURE
    asked = events(tmp_path, "rescue_requested")
    assert [(e["rank"], e["dead_ranks"], e["attempt"], e["deadline_s"]) for e in asked] == [(0, [1], 1, 80.0)]
    chief, _, third = spawner.processes
    assert [name for name, _ in chief.signals] == ["SIGUSR2", "SIGTERM", "SIGKILL"]
    assert 0.5 <= chief.signals[0][1] <= 0.55  # within one poll of the death
    assert chief.signals[1][1] - chief.signals[0][1] <= 0.1  # the answer came at once: no waiting
    # Committed: nothing is left in flight, so no teardown grace (3 s) before the SIGKILL.
    assert chief.signals[2][1] - chief.signals[1][1] <= 0.06
    assert [name for name, _ in third.signals] == ["SIGTERM", "SIGKILL"]  # only the rescuer is asked
    assert events(tmp_path, "rescue_abandoned") == []
    assert "rescue: rank 0 committed its in-memory snapshot of global step 16" in out.getvalue()


@pytest.mark.parametrize("drained, grace_s", [(True, 0.0), (False, 3.0)])
def test_a_skipped_rescue_keeps_the_teardown_grace_only_while_a_persist_is_in_flight(tmp_path, answering, drained,
                                                                                     grace_s):
    answering[0] = {"event": "rescue_skipped", "reason": "x", "drained": drained}
    scripts = [{"exit_at": None}, {"exit_at": 0.5, "exit_code": -signal.SIGKILL}]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=0, snapshot_every=5)
    assert supervisor.run() == EXIT_FAILURE
    (usr2, _), (term, term_at), (kill, kill_at) = spawner.processes[0].signals
    assert (usr2, term, kill) == ("SIGUSR2", "SIGTERM", "SIGKILL")
    assert grace_s <= kill_at - term_at <= grace_s + 0.06


def test_nothing_left_to_commit_reads_the_answer():
    assert nothing_left_to_commit({"event": "rescue_committed", "rank": 0})
    assert nothing_left_to_commit({"event": "rescue_skipped", "rank": 0, "drained": True})
    assert not nothing_left_to_commit({"event": "rescue_skipped", "rank": 0, "drained": False})
    assert not nothing_left_to_commit({"event": "rescue_skipped", "rank": 0})  # an older worker's answer
    assert not nothing_left_to_commit(None)  # abandoned: no answer


def test_a_rescuer_that_does_not_answer_is_abandoned_at_the_deadline(tmp_path, answering):
    scripts = [{"exit_at": 0.5, "exit_code": -signal.SIGKILL}, {"exit_at": None}]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=0, snapshot_every=5, storage_timeout=5.0)
    assert supervisor.run() == EXIT_FAILURE
    assert [(e["rank"], e["dead_ranks"], e["deadline_s"]) for e in events(tmp_path, "rescue_requested")] == [
        (1, [0], 20.0)]  # min(10, 5) + 5 + 10
    abandoned = events(tmp_path, "rescue_abandoned")
    assert [(e["rank"], e["reason"]) for e in abandoned] == [(1, "no answer within 20 s")]
    assert 20.0 <= abandoned[0]["waited_s"] <= 20.06
    (usr2, asked_at), (term, term_at), (kill, _) = spawner.processes[1].signals
    assert (usr2, term, kill) == ("SIGUSR2", "SIGTERM", "SIGKILL") and 20.0 <= term_at - asked_at <= 20.06


def test_no_rescue_request_when_the_tier_is_off(tmp_path, answering):
    scripts = [{"exit_at": None}, {"exit_at": 0.5, "exit_code": -signal.SIGKILL}]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=0, snapshot_every="off")
    assert supervisor.run() == EXIT_FAILURE
    assert [name for name, _ in spawner.processes[0].signals] == ["SIGTERM", "SIGKILL"]
    assert events(tmp_path, "rescue_requested") == []


def test_a_hang_asks_the_lowest_rank_but_the_stuck_one_before_the_kill(tmp_path, answering):
    from resilient_train.errors import EXIT_OK
    from tests.supervisor.test_supervisor_loop import hanging_spawner

    answering[0] = {"event": "rescue_committed", "global_step": 3, "snapshot_age_s": 0.1, "seconds": 0.2}
    scripts = [{"exit_at": None}, {"exit_at": None}, {"exit_at": 2.0}, {"exit_at": 2.0}]
    supervisor, spawner, _, _ = make(tmp_path, scripts, max_restarts=1, hang_timeout=5)  # the tier on: auto
    supervisor.launcher.spawner = hanging_spawner(spawner, {1})  # both alive, no progress; rank 1 in recipe code
    assert supervisor.run() == EXIT_OK
    [hang] = events(tmp_path, "hang_detected")
    asked = events(tmp_path, "rescue_requested")
    assert [(e["rank"], e["stuck_rank"], e["dead_ranks"], e["attempt"]) for e in asked] == [(0, hang["rank"], [], 1)]
    chief, stuck = spawner.processes[:2]
    # Stacks, then the rescue request to rank 0 only, then (its answer came at once) the kill.
    assert [name for name, _ in chief.signals] == ["SIGUSR1", "SIGUSR2", "SIGKILL"]
    assert [name for name, _ in stuck.signals] == ["SIGUSR1", "SIGKILL"]
    assert chief.signals[2][1] - chief.signals[1][1] <= 0.1
    assert events(tmp_path, "rescue_abandoned") == []
