"""RT_FAULTS: a SIGSTOP fault freezes the calling process once; a thawed process goes on; a HANG
fault blocks its thread forever with the process alive; the input gate numbers batches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from resilient_train.runner.failures.faults import FaultPlan, input_gate
from tests.integration.harness import wait_until_stopped

HIT_TWICE = textwrap.dedent(
    """
    import os
    from resilient_train.runner.failures.faults import FaultPlan, input_gate
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


HANG_AFTER_3 = textwrap.dedent(
    """
    import os
    from resilient_train.runner.failures.faults import input_gate
    read_batch = input_gate(os.environ, rank=1)
    for batch in range(1, 10):
        read_batch()
        print(batch, flush=True)
    """
)


def test_a_hang_fault_blocks_the_input_at_its_batch_and_the_process_stays_alive():
    fault = [{"point": "input", "global_step": 3, "rank": 1, "attempt": 2, "signal": "HANG"}]
    child = subprocess.Popen([sys.executable, "-c", HANG_AFTER_3], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "RT_FAULTS": json.dumps(fault), "RT_ATTEMPT": "2"})
    try:
        assert child.stdout is not None
        assert [child.stdout.readline() for _ in range(2)] == ["1\n", "2\n"]
        # Batch 3 never comes back: the process is alive and sleeping, not dead or stopped.
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=2)
        assert child.poll() is None
    finally:
        child.kill()
        rest, _ = child.communicate()
    assert (child.returncode, rest) == (-signal.SIGKILL, "")  # batch 3 never returned


def test_an_input_gate_outside_the_faults_attempt_or_rank_reads_every_batch():
    fault = [{"point": "input", "global_step": 1, "rank": 1, "attempt": 1, "signal": "HANG"}]
    for environ, rank in (({"RT_ATTEMPT": "2"}, 1), ({"RT_ATTEMPT": "1"}, 0), ({}, 1)):
        read_batch = input_gate({**environ, "RT_FAULTS": json.dumps(fault)}, rank=rank)
        for _ in range(3):
            read_batch()  # returns: no fault of this attempt and rank


def test_hang_is_accepted_as_a_pseudo_signal_and_named_in_the_refusal():
    fault = [{"point": "after_step", "global_step": 8, "signal": "HANG"}]
    FaultPlan.from_env({"RT_FAULTS": json.dumps(fault)}, rank=0, attempt=1)
    with pytest.raises(ValueError, match="or 'HANG'"):
        FaultPlan.from_env({"RT_FAULTS": json.dumps([{**fault[0], "signal": "HUNG"}])}, rank=0, attempt=1)


def test_a_before_join_fault_makes_its_rank_probe_closed_ports_and_fail_naming_the_address(monkeypatch):
    # The probe itself and its PeerUnreachableError: tests/integration/test_group_broken.py.
    from resilient_train.cluster.tf_config import build_tf_config, parse_tf_config
    from resilient_train.runner.process import worker_main

    fault = [{"point": "before_join", "global_step": 0, "rank": 1, "attempt": 1}]
    environ = {"RT_FAULTS": json.dumps(fault)}
    assert FaultPlan.from_env(environ, rank=1, attempt=2).take("before_join", 0) is False  # attempt 1 only
    assert FaultPlan.from_env(environ, rank=0, attempt=1).take("before_join", 0) is False  # rank 1 only
    plan = FaultPlan.from_env(environ, rank=1, attempt=1)
    assert (plan.take("before_join", 0), plan.take("before_join", 0)) == (True, False)  # once

    monkeypatch.setattr(worker_main, "free_ports", lambda n: [4999, 5999][:n])
    probed = []
    monkeypatch.setattr(worker_main, "wait_for_peers",
                        lambda addresses, rank, timeout_s: probed.append((list(addresses), rank, timeout_s)))
    cluster = parse_tf_config(json.dumps(build_tf_config(["10.0.0.1:2222", "10.0.0.2:2222"], 1)))
    worker_main._reach_peers(cluster, 30, unreachable=True).close()
    worker_main._reach_peers(cluster, 30).close()
    assert probed == [(["127.0.0.1:4999", "10.0.0.2:2222"], 1, 15.0), (["10.0.0.1:2222", "10.0.0.2:2222"], 1, 15.0)]


def test_a_fault_of_every_attempt_is_armed_in_each_attempt_and_never_outside_a_worker():
    faults = json.dumps([{"point": "nan_loss", "global_step": 6, "rank": 1, "attempt": "all"},
                         {"point": "nan_loss", "global_step": 9, "rank": 1, "attempt": 2}])
    armed = {attempt: FaultPlan.from_env({"RT_FAULTS": faults}, rank=1, attempt=attempt).armed_steps("nan_loss")
             for attempt in (0, 1, 2, 3)}
    assert armed == {0: [], 1: [6], 2: [6, 9], 3: [6]}  # attempt 0: input_gate outside a worker
    assert FaultPlan.from_env({"RT_FAULTS": faults}, rank=0, attempt=2).armed_steps("nan_loss") == []


@pytest.mark.parametrize("item, message", [
    ({"point": "nan_loss", "global_step": 6, "attempt": 0}, "RT_FAULTS fault 1: received attempt=0; expected an integer >= 1 or 'all'"),
    ({"point": "nan_loss", "global_step": -1}, "RT_FAULTS fault 1: received global_step=-1; expected an integer >= 0"),
    ({"point": "nan_loss", "global_step": 6, "rank": "1"}, "RT_FAULTS fault 1: received rank='1'; expected an integer >= 0"),
    ({"point": "nan_loss"}, "RT_FAULTS fault 1: missing 'global_step'"),
    ({"point": "slow", "global_step": 0, "factor": 0.5}, "RT_FAULTS fault 1: received factor=0.5; expected a number >= 1"),
])
def test_a_bad_fault_is_refused_naming_the_value_and_what_is_accepted(item, message):
    with pytest.raises(ValueError) as raised:
        FaultPlan.from_env({"RT_FAULTS": json.dumps([item])}, rank=0, attempt=1)
    assert str(raised.value).startswith(message)


def test_no_fault_plan_arms_nothing():
    assert FaultPlan.from_env({}, rank=0, attempt=1).armed_steps("nan_loss") == []
    assert FaultPlan.from_env({"RT_FAULTS": " "}, rank=0, attempt=1).armed_steps("nan_loss") == []
