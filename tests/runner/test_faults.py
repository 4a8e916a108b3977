"""RT_FAULTS: a SIGSTOP fault freezes the calling process once; a thawed process goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from resilient_train.runner.faults import FaultPlan
from tests.integration.harness import wait_until_stopped

HIT_TWICE = textwrap.dedent(
    """
    import os
    from resilient_train.runner.faults import FaultPlan
    plan = FaultPlan.from_env(os.environ, rank=0, attempt=1)
    print("before", flush=True)
    plan.hit("mid_upload", 8)   # stops here until SIGCONT
    plan.hit("mid_upload", 8)   # fired already: a no-op
    print("after", flush=True)
    """
)


def test_a_sigstop_fault_freezes_the_process_once_until_sigcont():
    fault = [{"point": "mid_upload", "global_step": 8, "rank": 0, "signal": "SIGSTOP"}]
    child = subprocess.Popen([sys.executable, "-c", HIT_TWICE], env={**os.environ, "RT_FAULTS": json.dumps(fault)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "before\n"
        wait_until_stopped(child.pid, timeout=60)
        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert (child.returncode, out) == (0, "after\n")


def test_an_unknown_signal_name_is_refused():
    fault = [{"point": "mid_upload", "global_step": 8, "signal": "SIGNOPE"}]
    with pytest.raises(ValueError, match="RT_FAULTS signal 'SIGNOPE'; expected a signal name"):
        FaultPlan.from_env({"RT_FAULTS": json.dumps(fault)}, rank=0, attempt=1)
