"""A standby imports TensorFlow on a demoted thread; the thread that becomes the worker is not demoted."""

import os
import sys
import threading

import pytest

from resilient_train.runner.standby import PREWARM_NICE, run_at_low_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_work_runs_at_the_prewarm_nice_and_the_caller_keeps_its_own():
    before = own_nice()
    assert run_at_low_priority(own_nice) == max(before, PREWARM_NICE)
    assert own_nice() == before


def test_an_exception_of_the_work_reaches_the_caller():
    def fail(name):
        raise ImportError(f"no module named {name}")

    with pytest.raises(ImportError, match="no module named nope"):
        run_at_low_priority(fail, "nope")
