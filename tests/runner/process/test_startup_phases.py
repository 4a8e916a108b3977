"""runner/process/startup_phases.py: marks in, durations out (pure; the event itself is checked in
tests/integration through benchmarks/recovery.py's smoke run)."""

import pytest

from resilient_train.runner.process import startup_phases


@pytest.fixture(autouse=True)
def clean():
    startup_phases.reset()
    yield
    startup_phases.reset()


def test_durations_between_marks_in_order():
    startup_phases.mark("assigned", at=100.0)
    startup_phases.mark("handover", at=100.25)
    startup_phases.mark("strategy", at=101.0)
    startup_phases.mark("first_call", at=102.5)
    assert startup_phases.report() == {
        "start": "assigned", "phases": {"handover": 0.25, "strategy": 0.75, "first_call": 1.5},
        "total_s": 2.5, "traces": 0,
    }


def test_a_second_mark_keeps_the_first_time_and_traces_are_counted():
    startup_phases.mark("assigned", at=10.0)
    startup_phases.mark("trace", at=11.0)
    startup_phases.mark("trace", at=15.0)  # a retrace
    startup_phases.count_trace()
    startup_phases.count_trace()
    assert startup_phases.report() == {"start": "assigned", "phases": {"trace": 1.0}, "total_s": 1.0, "traces": 2}


def test_main_entered_after_a_standby_assignment_is_the_handover():
    startup_phases.mark("assigned", at=50.0)
    startup_phases.main_entered()
    assert list(startup_phases.report()["phases"]) == ["handover"]


def test_main_entered_in_a_cold_process_counts_the_imports_from_its_creation():
    import psutil

    startup_phases.main_entered()
    report = startup_phases.report()
    assert report["start"] == "created"
    assert list(report["phases"]) == ["imports"]
    assert report["total_s"] == round(startup_phases._marks["imports"] - psutil.Process().create_time(), 3)


def test_no_marks_report_nothing():
    assert startup_phases.report() == {"start": None, "phases": {}, "total_s": 0.0, "traces": 0}
