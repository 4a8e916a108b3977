"""The elastic decisions as a policy object: each one a typed value, from sizes and capacity alone."""

from __future__ import annotations

import json

from resilient_train.job.config import JobConfig
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor.attempt import Resize, Stop, StopCause
from resilient_train.supervisor.elastic import CAPACITY_EVERY_S, ElasticPolicy, NodeAvoided
from resilient_train.supervisor.policy import AttemptOutcome, ExitClass


class FakeLauncher:
    def __init__(self, capacity: int | None, avoid: list[str] | None = None) -> None:
        self.capacity_now, self.avoid, self.asked = capacity, avoid or [], 0

    def capacity(self) -> int | None:
        self.asked += 1
        return self.capacity_now

    def host_doomed(self, attempt_dir) -> str | None:
        return None

    def avoid_noticed(self, attempt_dir) -> list[str]:
        return list(self.avoid)


def policy(tmp_path, workers: str, capacity: int | None, **kwargs) -> tuple[ElasticPolicy, FakeLauncher, list[float]]:
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers=workers,
                    global_batch_size=12)
    launcher, now = FakeLauncher(capacity, **kwargs), [100.0]
    return ElasticPolicy(job, launcher, lambda: now[0]), launcher, now


def test_room_to_grow_asks_at_most_every_capacity_interval_and_only_while_training(tmp_path):
    elastic, launcher, now = policy(tmp_path, "2:4", capacity=3)
    assert elastic.room_to_grow(2, training=lambda: False) is None and launcher.asked == 0
    assert elastic.room_to_grow(2, training=lambda: True) == Resize(3, "capacity returned: the launcher can place 3 workers")
    now[0] += CAPACITY_EVERY_S / 2
    assert elastic.room_to_grow(2, training=lambda: True) is None and launcher.asked == 1  # too soon: not asked
    now[0] += CAPACITY_EVERY_S
    launcher.capacity_now = 2
    assert elastic.room_to_grow(2, training=lambda: True) is None and launcher.asked == 2  # asked: no room
    assert elastic.room_to_grow(4, training=lambda: True) is None and launcher.asked == 2  # at MAX: never asked


def notice(tmp_path) -> object:
    attempt_dir = RunDir(tmp_path / "run").attempt(1)
    attempt_dir.path.mkdir(parents=True)
    attempt_dir.notice(1).write_text(json.dumps({"provider": "gce", "kind": "preempted", "deadline": None}))
    return attempt_dir


def test_a_notice_elsewhere_shrinks_an_elastic_run_and_stops_one_below_min(tmp_path):
    elastic, launcher, _ = policy(tmp_path, "2:4", capacity=3, avoid=["host-1"])
    attempt_dir = notice(tmp_path)
    assert elastic.notice_elsewhere(attempt_dir, 4) == NodeAvoided(
        ["host-1"], ["gce"], 3, "shrink",
        Resize(3, "preemption notice (gce) on node host-1: the group continues without it at 3 workers"))
    launcher.capacity_now = 1
    stop = elastic.notice_elsewhere(attempt_dir, 4)
    assert stop is not None and (stop.action, stop.resize, stop.stop_source) == ("stop", None, "notice:gce")


def test_only_a_clean_stop_for_a_resize_or_lost_capacity_is_a_membership_change(tmp_path):
    elastic, launcher, _ = policy(tmp_path, "2:4", capacity=3)
    grow = Resize(4, "capacity returned")
    resized = Stop(StopCause.RESIZE, "resize", resize=grow)
    failed = Stop(StopCause.FAILURE, "worker 1 exited abnormally")
    clean = AttemptOutcome(1, ExitClass.PREEMPTED, "preempted", 8, preempted=True)
    crash = AttemptOutcome(1, ExitClass.FAILED, "rank 1 killed by SIGKILL", 8)
    assert elastic.membership_change(clean, resized, 3) == grow
    assert elastic.membership_change(crash, resized, 3) is None  # the resize stop went wrong
    assert elastic.membership_change(crash, failed, 4) == Resize(3, "capacity fell: the launcher can place 3 of 4 workers")
    assert elastic.membership_change(crash, failed, 3) is None  # the same size is placeable: a failure
    fatal = AttemptOutcome(1, ExitClass.FATAL, "bad recipe", None)
    assert elastic.membership_change(fatal, failed, 4) is None
