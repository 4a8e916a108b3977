"""runner/process/preemption_notices.py: a notice the machine does not survive sets the worker's stop
request (once) and leaves the supervisor's marker; one it survives is only recorded; the
agreed save reports the time since the notice and acknowledges it."""

from __future__ import annotations

import json
import socket
import threading

from resilient_train.cluster.notices.notice_watch import Feed, Notice, NoticeSource
from resilient_train.rundir.layout import RunDir
from resilient_train.runner.process.preemption_notices import NoticeStop

WAIT = 30.0  # an upper bound for the watch's thread, never a measured time


class FakeSource(NoticeSource):
    provider = "gce"

    def __init__(self, notices: list[Notice]) -> None:
        self.pending = list(notices)
        self.acknowledged: list[list[Notice]] = []
        self.drained = threading.Event()

    def probe(self, timeout_s: float) -> bool:
        return True

    def feeds(self) -> list[Feed]:
        return [Feed("fake", self._poll, every_s=0.01)]

    def _poll(self) -> list[Notice]:
        found, self.pending = self.pending, []
        if not found:
            self.drained.set()
        return found + found  # twice: handed over once all the same

    def acknowledge(self, notices) -> None:
        self.acknowledged.append(list(notices))


def _stop_watch(tmp_path, notices, clock_values=(100.0, 107.25), environ=None):
    attempt_dir = RunDir(tmp_path).attempt(1)
    attempt_dir.path.mkdir(parents=True)
    events, stops, clock = [], [], iter(clock_values)
    source = FakeSource(notices)
    watch = NoticeStop("gce", environ or {"SLURMD_NODENAME": "node-7"}, attempt_dir=attempt_dir, rank=1, stop=lambda: stops.append(True),
                       clock=lambda: next(clock), emit=lambda name, **fields: events.append((name, fields)),
                       sources={"gce": source})
    watch.start()
    assert source.drained.wait(WAIT)
    watch.close()
    return watch, source, attempt_dir, events, stops


def test_a_stopping_notice_sets_the_stop_request_once_and_leaves_the_marker(tmp_path):
    preempted = Notice("gce", "preempted", stops=True)
    terminate = Notice("gce", "TERMINATE_ON_HOST_MAINTENANCE", stops=True)
    watch, source, attempt_dir, events, stops = _stop_watch(tmp_path, [preempted, terminate])
    assert stops == [True]
    assert [name for name, _ in events] == ["preemption_notice_watch", "preemption_notice", "preemption_notice"]
    assert events[1][1] == {"provider": "gce", "kind": "preempted", "deadline": None, "action": "stop"}
    assert json.loads(attempt_dir.notice(1).read_text()) == {"provider": "gce", "kind": "preempted", "deadline": None,
                                                               "host": "node-7"}  # the node the launcher avoids
    assert watch.save_requested() is False  # a stop, not a save

    watch.saved(12)
    assert events[-1] == ("preemption_notice_saved",
                          {"provider": "gce", "kind": "preempted", "global_step": 12, "seconds": 7.25})
    assert source.acknowledged == [[preempted, terminate]]


def test_a_notice_the_machine_survives_asks_for_one_save_and_no_stop(tmp_path):
    migrate = Notice("gce", "MIGRATE_ON_HOST_MAINTENANCE", stops=False)
    watch, source, attempt_dir, events, stops = _stop_watch(tmp_path, [migrate])
    assert stops == [] and not attempt_dir.notice(1).exists()
    assert events[1] == ("preemption_notice", {"provider": "gce", "kind": "MIGRATE_ON_HOST_MAINTENANCE",
                                               "action": "save", "deadline": None})
    assert [watch.save_requested(), watch.save_requested()] == [True, False]  # one vote, once
    watch.saved(3)  # preempted by something else (SIGTERM): no notice to report
    assert [name for name, _ in events] == ["preemption_notice_watch", "preemption_notice"]
    assert source.acknowledged == []


def test_a_malformed_endpoint_override_is_reported_and_nothing_is_watched(tmp_path):
    events = []
    watch = NoticeStop("auto", {"GCE_METADATA_HOST": "https://metadata"}, attempt_dir=RunDir(tmp_path).attempt(1),
                       rank=0, stop=lambda: None, emit=lambda name, **fields: events.append((name, fields))).start()
    assert watch.watch.resolved.wait(WAIT) and watch.watch.source is None
    assert events == [("preemption_notice_error", {
        "provider": None, "feed": "endpoint",
        "error": "Received metadata endpoint 'https://metadata'; expected host[:port] or http://host[:port]"})]


def test_the_marker_names_this_host_outside_slurm(tmp_path):
    _, _, attempt_dir, _, _ = _stop_watch(tmp_path, [Notice("gce", "preempted", stops=True)], environ={"HOME": "/"})
    assert json.loads(attempt_dir.notice(1).read_text())["host"] == socket.gethostname()


def test_a_surviving_notice_the_groups_last_save_covers_asks_for_none(tmp_path):
    """Workers on one node see the same notice on their own watches; one whose vote comes a call
    after its peer's must not make the group save again (found: saves at 11 and 12). A save
    taken after the notice came covers it; one taken before it does not."""
    migrate = Notice("gce", "MIGRATE_ON_HOST_MAINTENANCE", stops=False)
    for saved_at, asked in ((100.5, False), (100.0, False), (99.5, True)):  # the notice came at 100.0
        watch, *_ = _stop_watch(tmp_path / str(saved_at), [], clock_values=())
        watch.clock = lambda: 100.0
        watch._on_notice(migrate)
        watch.clock = lambda at=saved_at: at
        watch.group_saved()
        assert watch.save_requested() is asked
