"""Cloud preemption notices: what a notice is, what a provider's watcher offers, and the
watch that runs them off the training thread.

A spot or preemptible machine is told of its end before it comes: GCE sets
``instance/preempted`` (about 30 s ahead) and ``instance/maintenance-event``; AWS posts
``spot/instance-action`` (two minutes ahead); Azure's Scheduled Events list a ``Preempt``.
Each provider is one small module (gce_notices.py, aws_notices.py, azure_notices.py) with a
:class:`NoticeSource`: a probe (does this provider's metadata server answer here?) and its
feeds (each a call that returns the notices it sees now, blocking at most one long poll).

Everything that touches the outside is an argument: the environment (endpoints), the
sources, ``on_notice`` / ``on_event`` (the worker binds them to its stop request and to
events.jsonl; this layer writes nothing itself), and the waits (a ``threading.Event``).
"""

from __future__ import annotations

import abc
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

from resilient_train.cluster.notices import AUTO, OFF, PROVIDERS, SETTINGS
from resilient_train.cluster.notices.metadata_http import MetadataError

# Implementation:
# NoticeWatch.start() starts one daemon thread, "notice-watch", and returns at once: the
# training thread never waits for a probe or a poll. That thread resolves the setting
# (``auto``: every provider's probe at once, each on its own thread with a short timeout;
# of those that answer, the first in PROVIDERS order is watched; none: the thread ends and
# nothing else happens), then runs each of the source's feeds on its own daemon thread. A
# feed's new notices go to ``on_notice`` (once while they stand); what goes wrong
# (MetadataError: unreachable, slow, garbled) goes to ``on_event`` as
# ``preemption_notice_error`` once per distinct message, and the feed backs off (1 s
# doubling to 60 s) and tries again. Nothing a server does can raise into the caller. A
# long poll that returns at once without news waits out a 1 s floor. close() stops the
# loops at their next wait. Every thread runs in a copy of start()'s context, so callbacks
# see what the caller bound (structlog contextvars).

__all__ = ["Notice", "Feed", "NoticeSource", "NoticeWatch", "PROBE_TIMEOUT_S", "EVENT_WATCH", "EVENT_ERROR"]

PROBE_TIMEOUT_S = 0.5  # a metadata server is one hop away: it answers in milliseconds or is not there
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
# A long poll (``every_s`` 0) that came back sooner than this without a notice waits out the
# rest: a server that ignores wait_for_change is asked once a second, not in a tight loop.
LONG_POLL_FLOOR_S = 1.0

EVENT_WATCH = "preemption_notice_watch"
EVENT_ERROR = "preemption_notice_error"


@dataclass(frozen=True)
class Notice:
    """One announcement from a provider.

    ``kind``: the provider's own word for it (``preempted``, ``TERMINATE_ON_HOST_MAINTENANCE``,
    ``spot_terminate``, ``Preempt``, ...). ``stops``: the machine goes (save and stop); False:
    it survives (a live migration, a rebalance recommendation). ``deadline``:
    the end the provider gave, ISO 8601 UTC, None when it gives none (GCE). ``ref``: what the
    provider wants acknowledged (Azure's EventId), else None.
    """

    provider: str
    kind: str
    stops: bool
    deadline: str | None = None
    ref: str | None = None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"Received provider={self.provider!r}; expected one of {PROVIDERS}")
        if not self.kind:
            raise ValueError("Received an empty notice kind; expected the provider's name for it")

    def fields(self) -> dict[str, Any]:
        """What an event says of it."""
        return {"provider": self.provider, "kind": self.kind, "deadline": self.deadline,
                **({"ref": self.ref} if self.ref else {})}


@dataclass(frozen=True)
class Feed:
    """One thing a source watches. ``poll()`` returns the notices it sees now (an empty list:
    none), blocking at most one request or long poll, raising MetadataError when the server
    misbehaves; the watch waits ``every_s`` between polls (0: the poll itself waits, a
    long poll)."""

    name: str
    poll: Callable[[], list[Notice]]
    every_s: float


class NoticeSource(abc.ABC):
    """One provider's notices, as its metadata server gives them."""

    provider: ClassVar[str]

    @abc.abstractmethod
    def probe(self, timeout_s: float) -> bool:
        """Does this provider's metadata server answer here (its own protocol, within ``timeout_s``)?
        False for no answer or a wrong one; never raises."""

    @abc.abstractmethod
    def feeds(self) -> list[Feed]:
        """What to watch once the probe answered."""

    def acknowledge(self, notices: Sequence[Notice]) -> None:
        """Tell the provider these notices were acted on (the save committed). Most need
        nothing; Azure lets the event start early. Raises MetadataError."""

    def where(self) -> str:
        """The endpoint, for events (``host:port``)."""
        return ""


def _answers(source: NoticeSource, timeout_s: float) -> bool:
    try:
        return bool(source.probe(timeout_s))
    except Exception:  # a probe must never end the watch; a broken one is a provider not found
        return False


class NoticeWatch:
    """The watch of one process: resolve the provider, run its feeds, hand notices over.

    ``setting``: one of :data:`SETTINGS`. ``sources``: provider -> its NoticeSource (the
    endpoints are theirs), or a callable that builds that mapping on the watch's thread. ``on_notice(notice)`` is called once per new notice, on a feed's
    thread; ``on_event(name, **fields)`` records what the watch does and what went wrong.
    """

    def __init__(self, setting: str, sources: Mapping[str, NoticeSource] | Callable[[], Mapping[str, NoticeSource]], *,
                 on_notice: Callable[[Notice], None], on_event: Callable[..., None],
                 probe_timeout_s: float = PROBE_TIMEOUT_S, backoff_max_s: float = BACKOFF_MAX_S,
                 clock: Callable[[], float] = time.monotonic, wait: Callable[[float], object] | None = None) -> None:
        if setting not in SETTINGS:
            raise ValueError(f"Received preemption_notice={setting!r}; expected one of {', '.join(SETTINGS)}")
        self.setting = setting
        # A callable is called on the watch's thread: building the sources (imports, endpoint
        # parsing) costs the caller nothing, and a malformed endpoint is an event there.
        self._make_sources = sources if callable(sources) else (lambda: sources)
        self.sources: dict[str, NoticeSource] = {} if callable(sources) else dict(sources)
        self.on_notice = on_notice
        self.on_event = on_event
        self.probe_timeout_s = probe_timeout_s
        self.backoff_max_s = backoff_max_s
        self.source: NoticeSource | None = None  # the one watched, once resolved
        self.notices: list[Notice] = []  # every notice handed over, in order
        self.resolved = threading.Event()  # set once the provider is known (or none is)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.clock = clock
        self.wait = wait or self._closed.wait  # returns early once closed

    # ------------------------------------------------------------ life
    def start(self) -> None:
        """Start watching in the background; returns at once. ``off``: nothing starts."""
        if self.setting == OFF:
            self.resolved.set()
            return
        _thread(self._run, "notice-watch")

    def close(self) -> None:
        self._closed.set()

    def acknowledge(self) -> None:
        """Tell the watched provider that every stopping notice was acted on (never raises:
        a failure is an event)."""
        source, stopping = self.source, [n for n in self.notices if n.stops]
        if source is None or not stopping:
            return
        try:
            source.acknowledge(stopping)
        except Exception as exc:  # logged and ignored: the notice has done its work
            self.on_event(EVENT_ERROR, provider=source.provider, feed="acknowledge", error=_describe(exc))

    # ------------------------------------------------------------ the threads
    def _run(self) -> None:
        try:
            self.sources = dict(self._make_sources())
        except ValueError as exc:  # a malformed endpoint override: said, and nothing watched
            self.on_event(EVENT_ERROR, provider=None, feed="endpoint", error=str(exc))
            self.resolved.set()
            return
        try:
            self.source = self._resolve()
        except Exception as exc:  # never into the caller; a watch that cannot resolve watches nothing
            self.on_event(EVENT_ERROR, provider=None, feed="probe", error=_describe(exc))
            self.source = None
        finally:
            self.resolved.set()
        source = self.source
        if source is None or self._closed.is_set():
            return
        feeds = source.feeds()
        self.on_event(EVENT_WATCH, provider=source.provider, setting=self.setting, endpoint=source.where(),
                      feeds=[feed.name for feed in feeds])
        for feed in feeds:
            _thread(self._follow, f"notice-{feed.name}", source, feed)

    def _resolve(self) -> NoticeSource | None:
        if self.setting != AUTO:
            source = self.sources[self.setting]
            if not _answers(source, self.probe_timeout_s):  # asked for by name: say it is not there
                self.on_event(EVENT_ERROR, provider=source.provider, feed="probe",
                              error=f"no {source.provider} metadata server answered at {source.where()}")
                return None
            return source
        # Every provider's probe at once: the slowest "not here" bounds the wait, not their sum.
        with ThreadPoolExecutor(max_workers=len(self.sources), thread_name_prefix="notice-probe") as pool:
            futures = {pool.submit(_answers, source, self.probe_timeout_s): name
                       for name, source in self.sources.items()}
            answered = [futures[f] for f in as_completed(futures) if f.result()]
        for name in self.sources:  # a stable choice should two answer (a test double, say): table order
            if name in answered:
                return self.sources[name]
        return None

    def _follow(self, source: NoticeSource, feed: Feed) -> None:
        """Poll ``feed`` until closed. A notice is handed over when it appears: one that the
        previous poll returned too is the same announcement still standing (AWS's
        instance-action stays until the end), one that went away and came back is new (a
        second GCE maintenance event)."""
        backoff, last_error, standing = 0.0, None, []
        while not self._closed.is_set():
            started = self.clock()
            try:
                found = feed.poll()
            except Exception as exc:  # MetadataError above all; anything else is a bug here, still not the run's
                error = _describe(exc)
                if error != last_error:
                    self.on_event(EVENT_ERROR, provider=source.provider, feed=feed.name, error=error)
                    last_error = error
                backoff = min(self.backoff_max_s, backoff * 2 if backoff else BACKOFF_FIRST_S)
                self.wait(backoff)
                continue
            backoff, last_error = 0.0, None
            for notice in dict.fromkeys(found):  # in order, each once
                if notice not in standing:
                    self._hand_over(notice)
            standing = found
            pause = feed.every_s or (0.0 if found else LONG_POLL_FLOOR_S - (self.clock() - started))
            if pause > 0 and not self._closed.is_set():
                self.wait(pause)

    def _hand_over(self, notice: Notice) -> None:
        with self._lock:
            self.notices.append(notice)
        self.on_notice(notice)


def _thread(target: Callable[..., None], name: str, *args: Any) -> None:
    """A daemon thread that runs ``target`` in a copy of the caller's context: the callbacks
    see what the caller bound (a worker's run_id, attempt and rank for its events)."""
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(target, *args), name=name, daemon=True).start()


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, MetadataError) else f"{type(exc).__name__}: {exc}"
