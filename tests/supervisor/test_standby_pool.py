"""StandbyPool with fake processes: replacement of the dead, hand-over, refill hold, disabling."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from resilient_train.supervisor.standby_pool import MAX_LOST_PER_SLOT, StandbyPool, UnusableStandbyError


class FakeStandby:
    forked = False

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.status_record: dict[str, Any] | None = None
        self.assigned: dict[str, Any] | None = None
        self.released = False
        self.pipe_broken = False

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.returncode = -sig

    def status(self) -> dict[str, Any] | None:
        return self.status_record

    def assign(self, assignment: dict[str, Any]) -> bool:
        if self.returncode is not None or self.pipe_broken:
            return False
        self.assigned = assignment
        return True

    def release(self) -> None:
        self.released = True
        if self.returncode is None:
            self.returncode = -signal.SIGKILL


class Harness:
    def __init__(self, tmp_path: Path, size: int = 2, replenish_delay_s: float = 5.0) -> None:
        self.now = 100.0
        self.spawned: list[FakeStandby] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.pool = StandbyPool(
            size,
            argv=["python", "-m", "resilient_train.runner.process.warm_standby"],
            env={"A": "1"},
            log_dir=tmp_path / "standby",
            spawner=self.spawn,
            clock=lambda: self.now,
            replenish_delay_s=replenish_delay_s,
            emit=lambda event, **fields: self.events.append((event, fields)),
        )

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> FakeStandby:
        standby = FakeStandby(1000 + len(self.spawned))
        self.spawned.append(standby)
        return standby

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.events if event == name]

    def fill_ready(self) -> None:
        self.pool.maintain(refill=True)
        for standby in self.spawned:
            if standby.status_record is None:
                standby.status_record = {"ok": True, "pid": standby.pid, "prewarm_s": 3.0}
        self.pool.maintain()


def test_a_standby_that_dies_while_waiting_is_replaced_and_never_handed_over(tmp_path):
    h = Harness(tmp_path)
    h.fill_ready()
    dead = h.spawned[0]
    dead.returncode = -signal.SIGKILL  # killed while waiting
    h.pool.maintain()

    assert h.named("standby_lost") == [{"pid": dead.pid, "log": str(tmp_path / "standby" / "standby-1.log"), "signal": "SIGKILL"}]
    assert [s.pid for s in h.spawned] == [1000, 1001, 1002]  # replaced at once (the hold is over)
    assert [p.pid for p in h.pool.waiting] == [1001, 1002]
    handed = [h.pool.hand_over(["--job", "j"], {"TF_CONFIG": "x"}, tmp_path / f"w{i}.log") for i in range(3)]
    assert [p.pid if p else None for p in handed] == [1001, 1002, None]
    assert dead.assigned is None


def test_a_standby_that_dies_between_the_reap_and_the_assignment_is_skipped(tmp_path):
    h = Harness(tmp_path)
    h.fill_ready()
    h.spawned[0].pipe_broken = True
    h.spawned[0].returncode = -signal.SIGKILL  # as if it died just now
    process = h.pool.hand_over(["--job", "j"], {}, tmp_path / "w0.log")
    assert process is h.spawned[1]
    assert h.spawned[0].assigned is None and h.spawned[0].released


def test_hand_over_passes_argv_env_and_log_and_prefers_ready_standbys(tmp_path):
    h = Harness(tmp_path)
    h.pool.maintain(refill=True)
    h.spawned[1].status_record = {"ok": True, "pid": 1001}
    h.pool.maintain()
    process = h.pool.hand_over(["--job", "/r/job.json"], {"TF_CONFIG": "{}", "RT_ATTEMPT": "2"}, tmp_path / "w.log")
    assert process is h.spawned[1]
    assert process.assigned == {
        "argv": ["--job", "/r/job.json"],
        "env": {"TF_CONFIG": "{}", "RT_ATTEMPT": "2"},
        "log": str(tmp_path / "w.log"),
    }
    assert h.pool.hand_over(["--job", "j"], {}, tmp_path / "x.log") is h.spawned[0]  # still importing: still usable
    # worker_started says which it was (standby_warm): a cold-ish one pays the rest of its import on the restart
    assert h.pool.handed_over_warm == {h.spawned[1].pid: True, h.spawned[0].pid: False}


def test_refill_waits_for_the_group_to_train_or_for_the_delay(tmp_path):
    h = Harness(tmp_path, replenish_delay_s=5.0)
    h.pool.maintain()
    assert h.spawned == []  # the first attempt starts cold; no N extra imports beside it
    h.pool.maintain(refill=True)
    assert len(h.spawned) == 2
    h.fill_ready()
    h.pool.hand_over(["--job", "j"], {}, tmp_path / "w0.log")
    h.pool.hand_over(["--job", "j"], {}, tmp_path / "w1.log")
    h.now += 4.9
    h.pool.maintain()
    assert len(h.spawned) == 2  # the new group is still starting
    h.pool.maintain(refill=True)  # its chief finished a step
    assert len(h.spawned) == 4
    h.pool.hand_over(["--job", "j"], {}, tmp_path / "w2.log")
    h.now += 5.0
    h.pool.maintain()  # no training signal, but the delay passed
    assert len(h.spawned) == 5


def test_an_unusable_standby_disables_the_pool(tmp_path):
    h = Harness(tmp_path)
    h.pool.maintain(refill=True)
    h.spawned[0].status_record = {"ok": False, "reason": "eager context initialized"}
    h.pool.maintain(refill=True)
    assert h.pool.disabled is not None and "eager context initialized" in h.pool.disabled
    assert [f["reason"] for f in h.named("standby_disabled")] == [h.pool.disabled]
    assert all(s.released for s in h.spawned)
    h.pool.maintain(refill=True)
    assert len(h.spawned) == 2  # never spawns again
    assert h.pool.hand_over(["--job", "j"], {}, tmp_path / "w.log") is None


def test_standbys_that_keep_dying_before_ready_disable_the_pool(tmp_path):
    h = Harness(tmp_path, size=1)
    for _ in range(MAX_LOST_PER_SLOT):
        h.pool.maintain(refill=True)
        h.spawned[-1].returncode = 1
    h.pool.maintain(refill=True)
    assert len(h.named("standby_lost")) == MAX_LOST_PER_SLOT
    assert h.pool.disabled == f"{MAX_LOST_PER_SLOT} standbys exited before becoming ready (see {tmp_path / 'standby'})"
    assert len(h.spawned) == MAX_LOST_PER_SLOT


def test_close_kills_every_waiting_standby(tmp_path):
    h = Harness(tmp_path)
    h.fill_ready()
    h.pool.close()
    assert all(s.released for s in h.spawned) and h.pool.waiting == []


@pytest.mark.parametrize("size", [0, -1, True])
def test_size_is_validated(tmp_path, size):
    with pytest.raises(ValueError, match=f"Received size={size!r}; expected an int >= 1"):
        StandbyPool(size, argv=[], env={}, log_dir=tmp_path)


def test_a_standby_that_reports_unusable_and_exits_before_the_next_poll_disables_the_pool_with_its_reason(tmp_path):
    # The real standby writes {"ok": false} and exits at once; on a busy machine the pool's
    # next poll sees both at the same time. The reason must win over "exited before ready".
    h = Harness(tmp_path, size=1)
    h.pool.maintain(refill=True)
    standby = h.spawned[0]
    standby.status_record = {"ok": False, "pid": standby.pid, "reason": "the eager context was initialized"}
    standby.returncode = 0
    h.pool.maintain()
    assert h.pool.disabled == f"standby {standby.pid} is unusable: the eager context was initialized"
    assert [e for e, _ in h.events] == ["standby_started", "standby_disabled"]
    assert h.named("standby_lost") == []
    assert len(h.spawned) == 1


def test_a_standby_that_reports_ready_and_then_dies_is_lost_once_and_replaced(tmp_path):
    h = Harness(tmp_path, size=1, replenish_delay_s=0.0)
    h.pool.maintain(refill=True)
    standby = h.spawned[0]
    standby.status_record = {"ok": True, "pid": standby.pid, "prewarm_s": 1.0}
    standby.returncode = -signal.SIGKILL
    h.pool.maintain()
    assert [e for e, _ in h.events] == ["standby_started", "standby_ready", "standby_lost", "standby_started"]
    assert h.named("standby_lost") == [{"pid": standby.pid, "log": str(tmp_path / "standby" / "standby-1.log"), "signal": "SIGKILL"}]
    assert h.pool.disabled is None


def test_a_spawner_not_ready_yet_is_asked_again_and_one_that_says_unusable_disables_the_pool(tmp_path):
    """The fork template's two answers besides a standby (supervisor/forked_standbys.py):
    None while it imports (nothing started, no event), UnusableStandbyError once it found an op."""
    h = Harness(tmp_path)
    template = {"state": "importing"}
    asked: list[str] = []

    def spawn(argv, env, log_path):
        asked.append(template["state"])
        if template["state"] == "unusable":
            raise UnusableStandbyError("the standby template 7 is unusable: an op ran")
        return h.spawn(argv, env, log_path) if template["state"] == "ready" else None

    h.pool.spawner = spawn
    h.pool.maintain(refill=True)
    h.pool.maintain()
    assert (asked, h.spawned, h.events) == (["importing", "importing"], [], [])  # once per maintain
    template["state"] = "ready"
    h.pool.maintain()
    assert [f["log"] for f in h.named("standby_started")] == [
        str(tmp_path / "standby" / "standby-1.log"), str(tmp_path / "standby" / "standby-2.log")]
    h.pool.hand_over(["--job", "j"], {}, tmp_path / "w0.log")
    template["state"] = "unusable"
    h.pool.maintain(refill=True)
    assert h.pool.disabled == "the standby template 7 is unusable: an op ran"
    assert [e for e, _ in h.events] == ["standby_started", "standby_started", "standby_disabled"]
    assert h.spawned[1].released and h.pool.waiting == []
