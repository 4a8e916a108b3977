"""Who the supervisor asks to rescue, and how it recognises the answer (supervisor/rescue.py)."""

from pathlib import Path

from resilient_train.supervisor.attempt import Worker
from resilient_train.supervisor.rescue import RescueWait, choose_rescuer, failed_ranks


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


def test_the_wait_takes_only_the_asked_ranks_answer_in_this_attempt():
    wait = RescueWait(rank=1, attempt=2)
    wait.observe([{"event": "rescue_committed", "rank": 1, "attempt": 1},
                  {"event": "rescue_skipped", "rank": 0, "attempt": 2},
                  {"event": "checkpoint_committed", "rank": 1, "attempt": 2}])
    assert wait.answer is None
    wait.observe([{"event": "rescue_skipped", "rank": 1, "attempt": 2, "reason": "no snapshot yet"}])
    assert wait.answer["reason"] == "no snapshot yet"
