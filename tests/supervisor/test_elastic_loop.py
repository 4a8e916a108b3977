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
    supervisor._training = lambda: True  # the chief's step marker, which no fake writes
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
    supervisor, spawner, _, _ = make(tmp_path, [{"exit_at": 1.0}, {"exit_at": 1.0}], workers="1:3", global_batch_size=6)
    supervisor.launcher = PlacesAtMost(supervisor.launcher, most=2, claims=3)
    assert supervisor.run() == EXIT_OK
    assert resizes(tmp_path) == [(1, 3, 2, "no placement for 3 workers")]
    assert summary(tmp_path)["world_sizes"] == {"1": 2}
