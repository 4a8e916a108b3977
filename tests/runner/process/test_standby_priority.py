"""A standby imports TensorFlow on a demoted thread; the thread that becomes the worker is not demoted."""

import os
import sys
import threading

import pytest

from resilient_train.runner.process.warm_standby import PREWARM_NICE, run_at_low_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def own_policy() -> int:
    return os.sched_getscheduler(0)  # 0: the calling thread


def test_the_work_runs_at_idle_priority_and_the_caller_keeps_its_own():
    before = own_policy(), own_nice()
    assert run_at_low_priority(own_policy) == os.SCHED_IDLE
    assert (own_policy(), own_nice()) == before


def test_threads_the_work_starts_are_idle_too():
    def start_a_thread():
        seen = []
        thread = threading.Thread(target=lambda: seen.append(own_policy()))
        thread.start()
        thread.join()
        return seen[0]

    assert run_at_low_priority(start_a_thread) == os.SCHED_IDLE


def test_without_sched_idle_the_work_runs_at_the_prewarm_nice(monkeypatch):
    def refused(*args):
        raise PermissionError("not allowed")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    before = own_nice()
    assert run_at_low_priority(own_nice) == max(before, PREWARM_NICE)
    assert own_nice() == before


def test_an_exception_of_the_work_reaches_the_caller():
    def fail(name):
        raise ImportError(f"no module named {name}")

    with pytest.raises(ImportError, match="no module named nope"):
        run_at_low_priority(fail, "nope")


def test_threads_the_work_leaves_running_are_promoted_back():
    """TensorFlow's import leaves threads running; the worker must not inherit idle ones."""
    release = threading.Event()
    policies = []

    def start_a_lingering_thread():
        def linger():
            release.wait()
            policies.append(own_policy())

        thread = threading.Thread(target=linger)
        thread.start()
        return thread

    thread = run_at_low_priority(start_a_lingering_thread)
    release.set()
    thread.join()
    assert policies == [os.SCHED_OTHER]


def test_work_that_is_needed_before_it_finishes_is_promoted_for_the_rest():
    """A standby handed over while still importing: the rest of the import runs at normal
    priority (at idle priority it got no CPU on a busy machine, on the restart's path)."""
    started, asked = threading.Event(), []

    def needed(timeout_s):
        asked.append(timeout_s)
        return started.is_set()  # wanted once the work is under way

    def policies_until_promoted():
        seen = [own_policy()]
        started.set()
        for _ in range(400):  # (the caller polls every 50 ms)
            if own_policy() != os.SCHED_IDLE:
                break
            threading.Event().wait(0.01)
        return seen + [own_policy()]

    assert run_at_low_priority(policies_until_promoted, needed=needed) == [os.SCHED_IDLE, os.SCHED_OTHER]
    assert asked and own_policy() == os.SCHED_OTHER


def test_work_never_needed_early_stays_idle_to_the_end():
    assert run_at_low_priority(own_policy, needed=lambda timeout_s: False) == os.SCHED_IDLE
