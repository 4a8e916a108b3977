"""An elastic run's resizes through the supervisor's seams: fake processes, clock, capacity.

The launcher's capacity is scripted (a function of the fake clock); everything else is the
real loop. The real-process versions are tests/integration/test_elastic.py.
"""

from __future__ import annotations

import json

from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_PREEMPTED
from tests.supervisor.test_supervisor_loop import events, make, run_states


def summary(tmp_path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def resizes(tmp_path) -> list[tuple[int, int, int, str]]:
    return [(e["attempt"], e["from"], e["to"], e["reason"]) for e in events(tmp_path, "world_size_changed")]


def test_a_lost_worker_with_capacity_below_the_group_restarts_smaller_without_spending_a_restart(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": None, "on_sigterm": 1}, {"exit_at": 1.0, "exit_code": -9},  # attempt 1: rank 1's node dies
         {"exit_at": 1.0}],                                                       # attempt 2: one worker finishes
        workers="1:2", max_restarts=0,
    )
    supervisor.launcher.capacity = lambda: 2 if clock.now < 1001.0 else 1
    assert supervisor.run() == EXIT_OK
    assert resizes(tmp_path) == [(2, 2, 1, "capacity fell: the launcher can place 1 of 2 workers")]
    assert len(spawner.calls) == 3
    result = summary(tmp_path)
    assert result["world_sizes"] == {"1": 2, "2": 1}
    assert (result["restarts"], result["membership_changes"], result["preemptions"]) == (0, 1, 0)


def test_returning_capacity_stops_the_group_at_an_agreed_save_and_restarts_it_larger(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED},  # attempt 1: one worker, saves on SIGTERM
         {"exit_at": 1.0}, {"exit_at": 1.0}],              # attempt 2: two workers finish
        workers="1:2",
    )
    supervisor.launcher.capacity = lambda: 1 if clock.now < 1002.0 else 2
    supervisor.group.training = lambda: True  # the chief's step marker, which no fake writes
    assert supervisor.run() == EXIT_OK
    assert resizes(tmp_path) == [
        (1, 2, 1, "the launcher can place 1 workers"),  # started below MAX
        (2, 1, 2, "capacity returned: the launcher can place 2 workers"),
    ]
    assert [name for name, _ in spawner.processes[0].signals] == ["SIGTERM"]
    assert ("running", "resizing", 1) in run_states(tmp_path)
    assert ("resizing", "stopping", 1) in run_states(tmp_path)
    result = summary(tmp_path)
    assert result["world_sizes"] == {"1": 1, "2": 2}
    assert (result["restarts"], result["membership_changes"], result["preemptions"]) == (0, 1, 0)


def test_capacity_below_min_fails_the_run_before_any_worker_starts(tmp_path):
    supervisor, spawner, _, out = make(tmp_path, [], workers="2:3", global_batch_size=6)
    supervisor.launcher.capacity = lambda: 1
    assert supervisor.run() == EXIT_FAILURE
    assert spawner.calls == []
    assert [e["reason"] for e in events(tmp_path, "launch_failed")] == [
        "the launcher can place 1 workers; --workers 2:3 needs at least 2"]


def test_a_run_that_is_not_elastic_ignores_capacity_and_spends_its_budget(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": None, "on_sigterm": 1}, {"exit_at": 1.0, "exit_code": -9},
         {"exit_at": 1.0}, {"exit_at": 1.0}],
        workers=2,
    )
    supervisor.launcher.capacity = lambda: 1
    assert supervisor.run() == EXIT_OK
    assert events(tmp_path, "world_size_changed") == []
    result = summary(tmp_path)
    assert result["world_sizes"] == {"1": 2, "2": 2}
    assert (result["restarts"], result["membership_changes"]) == (1, 0)


def test_the_local_launchers_capacity_is_the_run_dirs_local_slots_file(tmp_path):
    from resilient_train.job.config import JobConfig
    from resilient_train.rundir.layout import RunDir
    from resilient_train.supervisor.launchers.local import LocalLauncher

    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path / "run"), workers="1:2")
    launcher = LocalLauncher(job)
    slots = RunDir(job.run_dir).local_slots
    assert launcher.capacity() is None  # no file: no limit
    slots.parent.mkdir(parents=True)
    slots.write_text("1\n")
    assert launcher.capacity() == 1
    slots.write_text("many")
    assert launcher.capacity() is None  # unreadable: as if absent


class PlacesAtMost(object):
    """Wraps a launcher: starting more than ``most`` workers raises RestartNotPlacedError,
    while its capacity still claims ``claims`` (another job holds what the totals show)."""

    def __init__(self, launcher, most: int, claims: int) -> None:
        self._launcher, self.most, self.claims = launcher, most, claims

    def __getattr__(self, name):
        return getattr(self._launcher, name)

    def capacity(self):
        return self.claims

    def start(self, specs):
        from resilient_train.errors import RestartNotPlacedError

        if len(specs) > self.most:
            raise RestartNotPlacedError(f"could not place {len(specs)} workers")
        return self._launcher.start(specs)


def test_a_size_that_cannot_be_placed_after_all_is_tried_smaller_down_to_min(tmp_path):
    supervisor, spawner, _, _ = make(tmp_path, [{"exit_at": 1.0}, {"exit_at": 1.0}], workers="1:3", global_batch_size=6,
                                     launcher_from=lambda launcher, **_: PlacesAtMost(launcher, most=2, claims=3))
    assert supervisor.run() == EXIT_OK
    assert resizes(tmp_path) == [(1, 3, 2, "no placement for 3 workers")]
    assert summary(tmp_path)["world_sizes"] == {"1": 2}


class _Hosts:
    """Rank i runs on host-i (as on Ray or Slurm, not the supervisor's host): a noticed
    rank's host is avoided, and capacity is ``nodes`` minus the avoided ones."""

    def __init__(self, supervisor, clock, *, nodes: int, notice_at: float, rank: int = 1) -> None:
        self.avoided: list[str] = []
        self.clock, self.nodes, self.notice_at, self.rank = clock, nodes, notice_at, rank
        launcher = supervisor.launcher
        launcher.host_doomed = lambda attempt_dir: None
        launcher.avoid_noticed = self.avoid_noticed
        launcher.capacity = lambda: self.nodes - len(self.avoided)
        self.supervisor, self._maintain = supervisor, launcher.maintain
        launcher.maintain = self.maintain

    def maintain(self, *, training):
        self._maintain(training=training)
        attempt = self.supervisor.run_dir.attempt(1)
        if self.supervisor.attempt == 1 and self.clock.now >= self.notice_at and not attempt.notice(self.rank).exists():
            attempt.notice(self.rank).write_text(json.dumps({"provider": "gce", "kind": "preempted", "deadline": None}))

    def avoid_noticed(self, attempt_dir):
        noticed = [f"host-{p.stem.split('-')[1]}" for p in attempt_dir.notices()]
        new = [h for h in noticed if h not in self.avoided]
        self.avoided += new
        return new


def avoided(tmp_path) -> list[tuple[int, list[str], int, str]]:
    return [(e["attempt"], e["nodes"], e["placeable"], e["action"]) for e in events(tmp_path, "node_avoided")]


def test_a_notice_on_another_host_shrinks_an_elastic_run_without_spending_a_restart(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED},
         {"exit_at": 1.0}],  # attempt 2: the worker left finishes
        workers="1:2", max_restarts=0, max_preemptions=0,
    )
    _Hosts(supervisor, clock, nodes=2, notice_at=1001.0)
    assert supervisor.run() == EXIT_OK
    reason = "preemption notice (gce) on node host-1: the group continues without it at 1 workers"
    assert avoided(tmp_path) == [(1, ["host-1"], 1, "shrink")]
    assert ("running", "resizing", 1) in run_states(tmp_path)
    assert [(e["attempt"], e["reason"]) for e in events(tmp_path, "run_state") if e["to"] == "resizing"] == [(1, reason)]
    assert resizes(tmp_path) == [(2, 2, 1, reason)]
    assert [[name for name, _ in p.signals] for p in spawner.processes[:2]] == [["SIGTERM"], ["SIGTERM"]]
    assert events(tmp_path, "preemption_requested") == []
    result = summary(tmp_path)
    assert result["world_sizes"] == {"1": 2, "2": 1}
    assert (result["restarts"], result["membership_changes"], result["preemptions"]) == (0, 1, 0)


def test_a_notice_that_leaves_fewer_than_min_stops_the_run_with_143(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path, [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED}],
        workers="2:2",
    )
    _Hosts(supervisor, clock, nodes=2, notice_at=1001.0)
    assert supervisor.run() == EXIT_PREEMPTED
    assert avoided(tmp_path) == [(1, ["host-1"], 1, "stop")]
    assert [e["source"] for e in events(tmp_path, "preemption_requested")] == ["notice:gce"]
    assert len(spawner.calls) == 2 and summary(tmp_path)["status"] == "preempted"


def test_a_fixed_size_run_with_a_spare_restarts_away_from_the_noticed_host_as_a_preemption(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": 2.0, "exit_code": EXIT_PREEMPTED}, {"exit_at": 2.0, "exit_code": EXIT_PREEMPTED},  # the agreed save
         {"exit_at": 1.0}, {"exit_at": 1.0}],
        workers=2,
    )
    hosts = _Hosts(supervisor, clock, nodes=3, notice_at=1001.0)
    assert supervisor.run() == EXIT_OK
    assert avoided(tmp_path) == [(1, ["host-1"], 2, "restart")]
    assert hosts.avoided == ["host-1"]
    assert [name for name, _ in spawner.processes[0].signals] == []  # the group stopped on its own vote
    result = summary(tmp_path)
    assert (result["restarts"], result["membership_changes"], result["preemptions"]) == (0, 0, 1)


def test_a_notice_on_another_host_with_a_spare_moves_an_elastic_run_at_its_size(tmp_path):
    supervisor, spawner, clock, _ = make(
        tmp_path,
        [{"exit_at": None, "on_sigterm": EXIT_PREEMPTED}, {"exit_at": None, "on_sigterm": EXIT_PREEMPTED},
         {"exit_at": 1.0}, {"exit_at": 1.0}],  # attempt 2: two workers, on the spare and the host left
        workers="1:2", max_restarts=0, max_preemptions=0,
    )
    _Hosts(supervisor, clock, nodes=3, notice_at=1001.0)
    assert supervisor.run() == EXIT_OK
    assert avoided(tmp_path) == [(1, ["host-1"], 2, "move")]
    assert resizes(tmp_path) == []  # the same size: no world_size_changed
    result = summary(tmp_path)
    assert result["world_sizes"] == {"1": 2, "2": 2}
    assert (result["restarts"], result["membership_changes"], result["preemptions"]) == (0, 1, 0)
