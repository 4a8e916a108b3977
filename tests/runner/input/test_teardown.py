"""IteratorReaper: a retired iterator's teardown runs on the reaper thread, bounded."""

import threading

import pytest

from resilient_train.runner.input.teardown import IteratorReaper


class SlowTeardown:
    """Stands in for a tf.data iterator whose teardown blocks until ``release`` is set."""

    def __init__(self, name: str, release: threading.Event, log: list) -> None:
        self.name, self.release, self.log = name, release, log

    def __del__(self) -> None:
        self.release.wait(10)
        self.log.append((self.name, threading.current_thread().name))


def test_retire_returns_at_once_and_the_teardown_runs_on_the_reaper_thread():
    release, log = threading.Event(), []
    reaper = IteratorReaper(max_pending=2)
    iterator = SlowTeardown("epoch-0", release, log)
    assert reaper.retire(iterator) == 0.0
    del iterator
    assert log == []  # still blocked in its teardown, and the caller went on
    release.set()
    assert reaper.wait_idle(10)
    assert log == [("epoch-0", "iterator-reaper")]
    assert (reaper.retired, reaper.torn_down) == (1, 1)


def test_at_most_max_pending_retired_iterators_exist_and_a_wait_is_reported():
    release, log, waits = threading.Event(), [], []
    reaper = IteratorReaper(max_pending=2, on_wait=waits.append)
    for epoch in range(2):
        iterator = SlowTeardown(f"epoch-{epoch}", release, log)
        assert reaper.retire(iterator) == 0.0
        del iterator
    third = SlowTeardown("epoch-2", release, log)
    threading.Timer(0.3, release.set).start()
    waited = reaper.retire(third)  # blocks until epoch-0 is gone
    del third
    assert waited >= 0.2
    assert waits == [waited]
    assert reaper.wait_idle(10)
    assert [name for name, _ in log] == ["epoch-0", "epoch-1", "epoch-2"]
    assert {thread for _, thread in log} == {"iterator-reaper"}


def test_each_teardown_is_reported_with_its_label_and_duration_in_the_retiring_context():
    import contextvars

    rank = contextvars.ContextVar("rank", default=None)
    rank.set(1)
    release, log, reports = threading.Event(), [], []
    reaper = IteratorReaper(on_teardown=lambda label, seconds: reports.append((label, seconds, rank.get())))
    reaper.retire(SlowTeardown("epoch-3", release, log), 3)
    threading.Timer(0.3, release.set).start()
    assert reaper.wait_idle(10)
    [(label, seconds, in_context)] = reports
    assert (label, in_context) == (3, 1) and seconds >= 0.25


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError, match="Received max_pending=0; expected >= 1"):
        IteratorReaper(max_pending=0)
