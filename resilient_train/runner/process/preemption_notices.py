"""A worker's own node's preemption notices, turned into the worker's stop request.

Each worker watches the node it runs on (cluster/notices/: GCE, AWS, Azure), whatever
launched it. A notice that the machine does not survive sets the same stop request as
SIGTERM (:attr:`WorkerProcess.stop`, runner/process/bootstrap.py): the group agrees on a step in the
next call's all-reduce, saves it, and every worker exits 143. A notice the machine survives
(GCE's live migration, Azure's Freeze, AWS's rebalance recommendation) asks for one agreed
save without stopping (:meth:`NoticeStop.save_requested`, this worker's vote in the call's
save column, runner/training/loop.py): a checkpoint taken before the risk, and training goes on.

What it writes: a ``preemption_notice`` event per notice; for a stopping one also
``attempt-<n>/notice-<rank>.json`` with the notice and the node's name (``host``: Slurm's
SLURMD_NODENAME, else the hostname). The supervisor reads it: a local run's node is going, so
the run stops with 143 rather than restart there; on Ray and Slurm the launcher avoids that
node from then on, and an elastic run shrinks without it (supervisor/supervisor.py); once the worker's part of the
agreed save is done, ``preemption_notice_saved`` with the seconds since the notice, and
the provider's acknowledgement where it wants one (Azure).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Callable, Mapping

from resilient_train.cluster.notices import notice_sources
from resilient_train.cluster.notices.notice_watch import EVENT_ERROR, Notice, NoticeWatch
from resilient_train.rundir import events
from resilient_train.rundir.atomic import write_atomic
from resilient_train.rundir.layout import AttemptDir

__all__ = ["NoticeStop", "EVENT_NOTICE", "EVENT_SAVED"]

EVENT_NOTICE = "preemption_notice"
EVENT_SAVED = "preemption_notice_saved"


class NoticeStop:
    """One worker's watch: ``stop()`` is called on a notice the machine does not survive.

    ``clock``: monotonic seconds (the time from notice to save). ``sources``: provider ->
    source (default: from ``environ``'s endpoint overrides).
    """

    def __init__(self, setting: str, environ: Mapping[str, str], *, attempt_dir: AttemptDir, rank: int,
                 stop: Callable[[], None], clock: Callable[[], float] = time.monotonic,
                 emit: Callable[..., None] = events.emit, sources=None) -> None:
        self.attempt_dir, self.rank, self.stop, self.clock, self.emit = attempt_dir, rank, stop, clock, emit
        self.host = environ.get("SLURMD_NODENAME") or socket.gethostname()  # the marker names the node
        self.noticed_at: float | None = None  # the first stopping notice, on ``clock``
        self.first: Notice | None = None
        self._saves_asked = 0  # surviving notices not yet voted for (runner/training/loop.py asks once per call)
        self._asked_at: float | None = None  # when the newest of them came, on ``clock``
        self._group_saved_at: float | None = None  # the group's newest agreed save, on ``clock``
        self._lock = threading.Lock()
        if sources is None:  # built on the watch's thread (imports, endpoints): nothing on this one
            sources = lambda: notice_sources(environ)  # noqa: E731
        self.watch = NoticeWatch(setting, sources, on_notice=self._on_notice, on_event=emit)

    def start(self) -> "NoticeStop":
        self.watch.start()
        return self

    def close(self) -> None:
        self.watch.close()

    def save_requested(self) -> bool:
        """True once per notice the machine survives: the training thread's vote for a save;
        not for a notice an agreed save of the group already covers (one taken after it came:
        workers on one node see the same notice, each on its own watch thread, and under load
        one of them saw it a call after its peer's vote and the group saved twice,
        tests/integration/test_preemption_notices.py, steps 11 and 12)."""
        with self._lock:
            asked, self._saves_asked = self._saves_asked > 0, 0
            asked_at = self._asked_at
        saved_at = self._group_saved_at
        if asked and saved_at is not None and asked_at is not None and saved_at >= asked_at:
            return False  # the group saved after this notice came: that save covers it
        return asked

    def group_saved(self) -> None:
        """The training thread took part in an agreed save (any kind)."""
        self._group_saved_at = self.clock()

    def _on_notice(self, notice: Notice) -> None:
        self.emit(EVENT_NOTICE, **notice.fields(), action="stop" if notice.stops else "save")
        if not notice.stops:
            with self._lock:
                self._saves_asked += 1
                self._asked_at = self.clock()
            return
        if self.noticed_at is not None:
            return
        self.noticed_at, self.first = self.clock(), notice
        try:  # the supervisor's hint; the stop request does not depend on it
            write_atomic(self.attempt_dir.notice(self.rank), json.dumps({**notice.fields(), "host": self.host}))
        except OSError as exc:
            self.emit(EVENT_ERROR, provider=notice.provider, feed="marker", error=f"{type(exc).__name__}: {exc}")
        self.stop()

    def saved(self, global_step: int | None) -> None:
        """The agreed save this worker took part in is done (on the chief: committed): report
        the time since the notice, and acknowledge it where the provider wants that."""
        if self.noticed_at is None or self.first is None:
            return
        self.emit(EVENT_SAVED, provider=self.first.provider, kind=self.first.kind, global_step=global_step,
                  seconds=round(self.clock() - self.noticed_at, 3))
        self.watch.acknowledge()
