"""A run as one HTML page: timeline, training curves and summary, from ``events.jsonl`` alone.

The page is rendered from the event contract (docs/events.md) and nothing else, so any run
dir renders, an old one included (fields it lacks are left out, never guessed), and the page
shows what the console and the tools read. ``summary.json`` is used when present, for the
numbers it owns (status, digest, lost steps, wall time); without it they come from the events.

**Why hand-written SVG, no plotting library.** The page must open with no network, so
anything it uses is inlined into the file. The plotting libraries that draw a zoomable
timeline (Plotly ~3.5 MB minified, Vega + Vega-Lite ~800 KB, ECharts ~1 MB) are all far
over the few hundred KB that are worth inlining into every run dir; uPlot (~50 KB) draws
curves but no lanes or bands. What the page draws is small: lanes, rectangles, ticks,
markers, polylines. Plain SVG needs no script at all (a marker's root cause is its
``<title>``, which every browser shows as a tooltip), no dependency to pin or audit, and its
output is a document a test can parse and count (``html.parser``): the lanes, markers, ticks
and curve points are elements with a class and ``data-`` attributes naming the event they
stand for.

Pure functions: :func:`load_run` reads a run dir into a :class:`RunView`; :func:`render_page`
turns one into the HTML text. Nothing here writes a file (``commands/run_report.py`` does).

Definitions (also stated on the page):

* *wall time*: summary.json's ``wall_time_s``, else first to last event (see below);
* *invocation*: one ``resilient-train run`` of the run dir. It opens with its ``run_started``
  (``run_already_complete`` for a run that found nothing to do), together with the events its
  supervisor writes just before it (``storage_claimed``, ``job_changed``, ``storage_retry``,
  the ``run_state`` out of ``preparing``), and holds every event up to the next invocation's
  first; it ends at its last event (its ``run_finished``, or whatever its supervisor wrote
  last when it was killed);
* *stopped between runs*: from the end of one invocation to the start of the next, whatever
  ended the first (a SIGTERM or Ctrl-C stop, a preemption, a failure, a completion, a killed
  supervisor): no ``run`` was under way, so nothing was supposed to train and the time is
  nobody's downtime; shown as a gap, never a fault band;
* *where the time went*: every second of the wall time in one category (productive training,
  start-up by phase, tracing, restore, replayed steps, standstill, save blocking, evaluation,
  epoch ends, waiting for a slow rank, stopping, finish, between runs, other), each defined in
  rundir/time_account.py, which summary.json's ``time_account`` uses too; one bar per attempt
  and a table;
* *goodput*: the account's productive training / (wall time - stopped between runs);
* *downtime* of a restart or resize: from the moment the run left ``running`` (a
  ``run_state`` to ``stopping``, ``hung``, ``restarting`` or ``resizing``) to the next
  attempt's ``first_step`` (after a hang, from the last progress: ``hang_detected``'s
  ``seconds`` before it), cut at the end of its invocation when its supervisor was killed
  mid-restart. A later invocation's own start-up (its start to its first step) is start-up,
  as the first invocation's is, after a stop by a signal to the supervisor, a failure or a
  completion; it is downtime only when the invocation before was stopped by a preemption
  notice or its launcher (a ``preemption`` band) or ended without ``run_finished`` (its
  supervisor was killed: a ``restart`` band). *Time lost*: the sum of downtimes.
* summary.json and ``run_finished`` describe the last ``resilient-train run`` invocation
  only: where several wrote the run dir (a preempted run resumed), restarts, preemptions and
  lost steps are summed over their ``run_finished`` events and wall time is first to last event.

Words: a marker's tooltip is the line the console prints for its event
(supervisor/console.py ``event_line``: the same sentences, epochs counted from 1).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from resilient_train.errors import ConfigError
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.time_account import (CATEGORIES, DEFINITIONS, TimeAccount, account_time,
                                                 invocation_bounds, timestamp)
from resilient_train.supervisor.console import checkpoint_position, event_line, inexact_text

__all__ = ["RunView", "Band", "Gap", "Invocation", "load_run", "parse_events", "render_page", "FAULT_EVENTS",
           "SUPERVISOR_LANE"]

SUPERVISOR_LANE = "supervisor"

# Events drawn as a fault marker, and what its tooltip says when the console has no line for it
# (the console's line comes first: event_line). A worker's exit is a fault only when it was not
# a clean exit 0 (handled in _fault_text).
FAULT_EVENTS: Mapping[str, str] = {
    "worker_exited": "worker exited",
    "hang_detected": "hang",
    "preemption_requested": "preemption requested",
    "preempted": "preempted",
    "rescue_requested": "rescue requested",
    "rescue_committed": "rescue committed",
    "rescue_skipped": "rescue skipped",
    "rescue_abandoned": "rescue abandoned",
    "gang_restart": "restart",
    "worker_restarted": "worker restarted in place",
    "restart_budget_exhausted": "restart budget exhausted",
    "crash_loop_detected": "crash loop",
    "fatal_error": "fatal error",
    "launch_failed": "launch failed",
    "node_lost": "node lost",
    "placement_lost": "placement lost",
    "checkpoint_failed": "checkpoint failed",
    "checkpoint_rejected": "checkpoint rejected",
    "input_mismatch": "input mismatch",
    "stale_writer_fenced": "stale writer fenced",
    "chaos_fault_injected": "chaos fault injected",
    "attempt_incomplete": "attempt incomplete",
    # numerical health (runner/health/): the anomaly, the rollback, the replay's verdict, a skip
    "anomaly_detected": "anomaly detected",
    "rolled_back": "rolled back",
    "replay_verdict": "replay verdict",
    "batch_skipped": "batch skipped",
    "host_suspected": "host suspected",
}
_LEFT_RUNNING = frozenset({"stopping", "hung", "restarting", "resizing"})

# Layout of the timeline (px).
_WIDTH = 1100
_LABEL_W = 110
_LANE_H = 34
_TOP = 26
_CHART_W, _CHART_H, _PAD = 520, 220, 44
_ATTEMPT_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


@dataclass(frozen=True)
class Band:
    """A restart or resize: the run was not training from ``start`` to ``end`` (seconds)."""

    kind: str  # "restart", "resize" or "preemption" (until a later invocation's first step)
    attempt: int  # the attempt that started after it
    start: float
    end: float
    reason: str

    @property
    def downtime_s(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class Invocation:
    """One ``resilient-train run`` of the run dir: its events ``first`` to ``stop`` (exclusive,
    file order), their times (seconds since the first event), and how it ended."""

    first: int
    stop: int
    start: float
    end: float
    status: str | None  # run_finished's; None: none written (its supervisor was killed, or still runs)
    stopped_by: str | None  # what stopped it: "SIGTERM", "SIGINT", "notice:gce", "launcher:slurm", ...
    reason: str = ""  # the reason of its last run_state (a failure's)

    def ended(self) -> str:
        """How it ended, in the console's words."""
        if self.status is None:
            return "its supervisor ended without finishing (killed?)"
        if self.status == "preempted" and self.stopped_by:
            if self.stopped_by.startswith("SIG"):
                return f"Run preempted: stopped by {self.stopped_by} (exit 143)"
            return f"Run preempted: stopped for a preemption ({self.stopped_by}, exit 143)"
        return f"Run {self.status}" + (f": {self.reason}" if self.status == "failed" and self.reason else "")


@dataclass(frozen=True)
class Gap:
    """From the end of one invocation to the start of the next: no ``run`` was under way."""

    start: float
    end: float
    after: str  # how the invocation before it ended (Invocation.ended)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class RunView:
    """What the page shows: the parsed events (file order) and summary.json (or None)."""

    events: tuple[dict[str, Any], ...]
    skipped_lines: int = 0
    summary: Mapping[str, Any] | None = None
    source: str = ""
    _times: tuple[float, ...] = field(default=(), init=False, repr=False)
    t0: float = field(default=0.0, init=False)  # the first event's time (epoch seconds)
    t_end: float = field(default=0.0, init=False)  # the last event's
    _invocations: tuple[Invocation, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        times = tuple(timestamp(e) for e in self.events)
        known = [t for t in times if not math.isnan(t)]
        object.__setattr__(self, "_times", times)
        object.__setattr__(self, "t0", min(known) if known else 0.0)
        object.__setattr__(self, "t_end", max(known) if known else 0.0)
        object.__setattr__(self, "_invocations", tuple(self._split_invocations()))

    # -- time ---------------------------------------------------------------------------

    def at(self, index: int) -> float:
        """Seconds since the first event of event ``index`` (NaN when its ts is missing)."""
        return self._times[index] - self.t0

    # -- structure ----------------------------------------------------------------------
    def ranks(self) -> list[int]:
        found = {e["rank"] for e in self.events if isinstance(e.get("rank"), int)}
        for e in self.events:
            if e.get("event") == "run_started" and isinstance(e.get("workers"), int):
                found |= set(range(e["workers"]))
        return sorted(found)

    def lanes(self) -> list[str]:
        return [SUPERVISOR_LANE, *(f"rank {r}" for r in self.ranks())]

    def attempts(self) -> dict[int, tuple[float, float]]:
        """attempt -> (first, last) second of the events that name it."""
        spans: dict[int, list[float]] = {}
        for i, e in enumerate(self.events):
            a = e.get("attempt")
            if isinstance(a, int) and not math.isnan(self.at(i)):
                span = spans.setdefault(a, [self.at(i), self.at(i)])
                span[0], span[1] = min(span[0], self.at(i)), max(span[1], self.at(i))
        return {a: (s[0], s[1]) for a, s in sorted(spans.items())}

    def worker_spans(self) -> list[tuple[int, int, float, float]]:
        """(rank, attempt, started, exited) per worker process; a worker with no exit ends at the last event."""
        started: dict[tuple[Any, Any], float] = {}  # (rank, attempt) as the events give them
        spans = []
        for i, e in enumerate(self.events):
            key = (e.get("rank"), e.get("attempt"))
            if e.get("event") in ("worker_started", "worker_restarted") and isinstance(key[0], int):
                started[key] = self.at(i)
            elif e.get("event") == "worker_exited" and key in started:
                spans.append((key[0], key[1], started.pop(key), self.at(i)))
        spans += [(r, a, t, self.t_end - self.t0) for (r, a), t in started.items()]
        return sorted(spans, key=lambda s: (s[0], s[2]))

    def faults(self) -> list[tuple[int, dict[str, Any], str]]:
        """(index, event, tooltip) of every fault marker, in file order."""
        found = []
        for i, e in enumerate(self.events):
            text = _fault_text(e, self.events)
            if text is not None:
                found.append((i, e, text))
        return found

    def commits(self) -> list[tuple[int, dict[str, Any]]]:
        return [(i, e) for i, e in enumerate(self.events) if e.get("event") == "checkpoint_committed"]

    def restores(self) -> list[tuple[int, dict[str, Any]]]:
        return [(i, e) for i, e in enumerate(self.events) if e.get("event") == "restored"]

    def invocation_spans(self) -> list[Invocation]:
        """Every ``resilient-train run`` that wrote this run dir, in order (module docstring)."""
        return list(self._invocations)

    def invocations(self) -> int:
        """How many ``resilient-train run`` invocations wrote this run dir (a stopped run is resumed by another)."""
        return len(self._invocations)

    def _split_invocations(self) -> list[Invocation]:
        bounds = [*invocation_bounds(self.events), len(self.events)]
        return [self._invocation(first, stop) for first, stop in zip(bounds, bounds[1:]) if stop > first] \
            or [Invocation(0, 0, 0.0, 0.0, None, None)]

    def _invocation(self, first: int, stop: int) -> Invocation:
        times = [t for t in (self.at(i) for i in range(first, stop)) if not math.isnan(t)]
        mine = self.events[first:stop]
        finished = [e for e in mine if e.get("event") == "run_finished"]
        states = [e for e in mine if e.get("event") == "run_state"]
        sources = [str(e.get("source")) for e in mine if e.get("event") == "preemption_requested"
                   and not str(e.get("source")).startswith("worker:")]
        stopped_by = sources[0].removeprefix("supervisor:") if sources else None
        return Invocation(first, stop, min(times, default=0.0), max(times, default=0.0),
                          str(finished[-1].get("status")) if finished else None, stopped_by,
                          str(states[-1].get("reason") or "") if states else "")

    def gaps(self) -> list[Gap]:
        """The time between invocations: the run was stopped, nothing was supposed to train."""
        runs = self.invocation_spans()
        return [Gap(before.end, after.start, before.ended()) for before, after in zip(runs, runs[1:])
                if after.start > before.end]

    def bands(self) -> list[Band]:
        """Downtime: restarts, resizes, hangs; a later invocation's start-up only after a
        preemption or a killed supervisor (module docstring). Never the time between invocations."""
        bands: list[Band] = []
        runs = self.invocation_spans()
        for n, run in enumerate(runs):
            open_at: float | None = None
            open_reason, open_kind, open_attempt = "", "restart", 0
            resume = _resume_band(runs[n - 1]) if n else None
            if resume is not None:
                open_at, (open_kind, open_reason) = run.start, resume
            for i in range(run.first, run.stop):
                e, t = self.events[i], self.at(i)
                name = e.get("event")
                if name == "run_state" and e.get("from") == "running" and e.get("to") in _LEFT_RUNNING:
                    if open_at is None:
                        open_at, open_reason = t, str(e.get("reason", ""))
                    open_kind = "resize" if e.get("to") == "resizing" else open_kind
                    open_attempt = int(e.get("attempt") or 0) + 1
                elif name == "run_state" and e.get("to") in ("restarting", "resizing") and open_at is not None:
                    open_kind = "resize" if e.get("to") == "resizing" else "restart"
                    open_reason = str(e.get("reason") or open_reason)
                elif name == "hang_detected" and open_at is not None and isinstance(e.get("seconds"), (int, float)):
                    open_at = min(open_at, t - float(e["seconds"]))  # the stall was lost time too
                elif name == "run_state" and e.get("to") in ("succeeded", "failed", "preempted"):
                    open_at = None  # this invocation ends: no restart followed in it
                elif name == "first_step" and open_at is not None:
                    bands.append(Band(open_kind, int(e.get("attempt", 0) or 0), open_at, t, open_reason))
                    open_at, open_kind = None, "restart"
            if open_at is not None and n + 1 < len(runs):  # its supervisor was killed inside a restart
                bands.append(Band(open_kind, open_attempt, open_at, run.end, open_reason))
        return bands

    def time_account(self) -> TimeAccount:
        """Where the wall time went (rundir/time_account.py): the gaps between invocations are
        ``between_runs``; summary.json's wall time when it covers the run, else first to last event."""
        return account_time(self.events, wall_s=self.wall_seconds(), gaps=[(g.start, g.end) for g in self.gaps()])

    def wall_seconds(self) -> float:
        # summary.json describes the last invocation only; several are measured by their events
        if self.invocations() == 1 and self.summary and isinstance(self.summary.get("wall_time_s"), (int, float)):
            return float(self.summary["wall_time_s"])
        return self.t_end - self.t0

    def goodput(self) -> float | None:
        """Productive training / the wall time the run was under way (wall time - stopped between
        runs): the time account's (rundir/time_account.py), summary.json's definition too."""
        return self.time_account().goodput

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) of the summary table, from summary.json where present, else events."""
        s = dict(self.summary or {})
        finished = [e for e in self.events if e.get("event") == "run_finished"]
        last = finished[-1] if finished else {}
        if self.invocations() > 1:  # summary.json and run_finished count the last invocation only
            for key in ("restarts", "preemptions", "lost_steps"):
                if all(isinstance(f.get(key), int) for f in finished) and finished:
                    s[key] = sum(f[key] for f in finished)
            preempted = sum(e.get("event") == "preempted" for e in self.events)
            s["preemptions"] = max(int(s.get("preemptions") or 0), preempted)

        def pick(key: str) -> Any:
            return s.get(key, last.get(key))

        steps = pick("global_step")
        if steps is None:
            steps = max((e["global_step"] for e in self.events if isinstance(e.get("global_step"), int)), default=None)
        restarts = pick("restarts")
        if restarts is None:
            restarts = sum(e.get("event") == "gang_restart" for e in self.events)
        preemptions = pick("preemptions")
        if preemptions is None:
            preemptions = sum(e.get("event") == "preempted" for e in self.events)
        account = self.time_account()
        wall, training, goodput = self.wall_seconds(), account.seconds["productive"], account.goodput
        lost_time = sum(b.downtime_s for b in self.bands())
        between = sum(g.seconds for g in self.gaps())
        root = s.get("root_cause") or {}
        rows = [
            ("status", str(pick("status") or "unfinished (no run_finished event)")),
            ("global step", _text(steps)),
            ("weights sha256", _text(pick("weights_sha256"))),
            *_exact_row(pick("exact"), pick("inexact")),
            ("invocations", str(self.invocations())),
            ("attempts", _text(s.get("attempts", len(self.attempts()) or None))),
            ("restarts", _text(restarts)),
            ("preemptions", _text(preemptions)),
            ("lost steps", _text(pick("lost_steps"))),
            ("wall time", f"{wall:.1f} s"),
            ("stopped between runs", f"{between:.1f} s"),
            ("productive training", f"{training:.1f} s"),
            ("time lost (downtime)", f"{lost_time:.1f} s"),
            ("goodput", f"{goodput:.1%}" if goodput is not None else "-"),
        ]
        if root:
            rows.append(("root cause", _root_cause_text(root)))
        if "val_loss" in s:
            rows.append(("last val_loss", _text(s["val_loss"])))
        return rows

    def curves(self) -> dict[str, list[tuple[int, int, float]]]:
        """series name -> (attempt, global_step, value) points, in file order.

        ``loss`` and each metric from ``train_progress``; ``epoch loss``, each metric's
        ``epoch <name>``, ``val_loss`` and ``val_<name>`` from ``epoch_finished``.
        """
        series: dict[str, list[tuple[int, int, float]]] = {}

        def add(name: str, e: Mapping[str, Any], value: Any) -> None:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                    and isinstance(e.get("global_step"), int):
                series.setdefault(name, []).append((int(e.get("attempt") or 0), e["global_step"], float(value)))

        for e in self.events:
            if e.get("event") == "train_progress":
                add("loss", e, e.get("loss"))
                for key, value in sorted((e.get("metrics") or {}).items()):
                    add(key, e, value)
            elif e.get("event") == "epoch_finished":
                add("epoch loss", e, e.get("loss"))
                for key, value in sorted((e.get("metrics") or {}).items()):
                    add(f"epoch {key}", e, value)
                add("val_loss", e, e.get("val_loss"))
                for key, value in sorted((e.get("val_metrics") or {}).items()):
                    add(f"val_{key}", e, value)
        return series


def _exact_row(exact: Any, inexact: Any) -> list[tuple[str, str]]:
    """``exact``: summary.json's (else run_finished's) word on whether the weights are an
    uninterrupted run's; no row for a run dir older than the field."""
    if not isinstance(exact, bool):
        return []
    if exact:
        return [("exact", "yes")]
    return [("exact", "NO: not an uninterrupted run's weights: " + inexact_text(inexact or []))]


def _resume_band(before: Invocation) -> tuple[str, str] | None:
    """(kind, reason) of the band from a later invocation's start to its first step, or None
    when that start-up is plain start-up (module docstring, *downtime*)."""
    if before.status is None:
        return "restart", f"resumed after the invocation before: {before.ended()}"
    if before.status == "preempted" and before.stopped_by and not before.stopped_by.startswith("SIG"):
        return "preemption", f"resumed after a preemption ({before.stopped_by})"
    return None


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _root_cause_text(root: Mapping[str, Any]) -> str:
    if root.get("message"):
        return str(root["message"])
    parts = [f"rank {root['rank']}" if "rank" in root else "", str(root.get("exit") or ""),
             str(root.get("type") or ""), f"at global_step {root['global_step']}" if "global_step" in root else "",
             f"(attempt {root['attempt']})" if "attempt" in root else ""]
    return " ".join(p for p in parts if p)


def _exit_cause(e: Mapping[str, Any]) -> str:
    if e.get("signal"):
        return f"killed by {e['signal']}"
    return f"exit code {e.get('exit_code')}"


def _fault_text(e: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str | None:
    """The tooltip of a fault marker (the console's line for its event), or None when ``e`` is no fault."""
    name = e.get("event")
    if not isinstance(name, str) or name not in FAULT_EVENTS:
        return None
    if name == "worker_exited":  # the console prints a root-cause block, not a line per exit
        if e.get("exit_code") == 0 and not e.get("signal"):
            return None
        rank, attempt = e.get("rank"), e.get("attempt")
        head = f"rank {rank} (pid {e.get('pid')}) {_exit_cause(e)}, attempt {attempt}"
        restart = next((r for r in events if r.get("event") == "gang_restart" and isinstance(attempt, int)
                        and r.get("attempt") == attempt + 1), None)
        failed = next((r for r in events if r.get("event") == "worker_failed" and r.get("rank") == rank
                       and r.get("attempt") == attempt), {})
        if restart is not None and restart.get("root_cause_rank") == rank:
            cause = f"root cause: {restart.get('reason')}"
        elif e.get("state") == "killed":
            cause = "secondary: killed by the supervisor's teardown after a peer's failure"
        elif e.get("exit_code") == 143:
            cause = "stopped after the preemption's checkpoint (exit 143)"
        elif e.get("exit_code") == 4:
            cause = "the group broke under it (exit 4)"
        else:
            cause = f"classification: {failed.get('classification', 'unknown')}"
        return f"{str(e.get('ts', ''))[11:19]}  {head}\n{cause}"
    return event_line(e) or FAULT_EVENTS[name]


def parse_events(lines: Iterable[bytes | str]) -> tuple[list[dict[str, Any]], int]:
    """(events, skipped): every JSON object line with an ``event``; a torn or garbled line is
    counted, not fatal (an empty line is neither)."""
    events, skipped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(record, dict) and "event" in record:
            events.append(record)
        else:
            skipped += 1
    return events, skipped


def load_run(run_dir: str | Path) -> RunView:
    """The run dir's events and summary; ConfigError (one line, exit 2) when it is not a run dir."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"{run_dir} is not a directory (expected a run dir, with events.jsonl)")
    layout = RunDir(path)
    if not layout.events.is_file():
        raise ConfigError(f"{run_dir} is not a run dir: it has no {layout.events.name}")
    events, skipped = parse_events(layout.events.read_bytes().splitlines())
    summary = None
    if layout.summary.is_file():
        try:
            loaded = json.loads(layout.summary.read_text())
            summary = loaded if isinstance(loaded, dict) else None
        except ValueError:
            summary = None  # a torn summary: the events still say it
    return RunView(tuple(events), skipped, summary, str(path))


# -- rendering -----------------------------------------------------------------------------

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _lane_of(e: Mapping[str, Any], lanes: Sequence[str]) -> int:
    rank = e.get("rank")
    if isinstance(rank, int) and e.get("event") not in ("gang_restart",) and f"rank {rank}" in lanes:
        return lanes.index(f"rank {rank}")
    return 0


def _timeline(view: RunView) -> str:
    lanes = view.lanes()
    span = max(view.t_end - view.t0, 1e-6)
    plot_w = _WIDTH - _LABEL_W - 20
    height = _TOP + _LANE_H * len(lanes) + 30

    def x(t: float) -> float:
        return round(_LABEL_W + plot_w * (0.0 if math.isnan(t) else t) / span, 1)

    def y(lane: int) -> int:
        return _TOP + lane * _LANE_H

    out = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
           f'viewBox="0 0 {_WIDTH} {height}">']
    for gap in view.gaps():
        out.append(f'<g class="gap" data-seconds="{gap.seconds:.3f}"><rect x="{x(gap.start)}" y="{_TOP - 14}" '
                   f'width="{max(1.0, x(gap.end) - x(gap.start)):.1f}" height="{_LANE_H * len(lanes) + 14}" '
                   f'fill="#e4e4e4" opacity="0.8"/><text x="{x(gap.start) + 2}" y="{_TOP - 4}" font-size="10">'
                   f'between runs {gap.seconds:.1f} s</text><title>between runs: {gap.seconds:.1f} s with no '
                   f'run under way (not downtime, not in goodput)\nbefore it: {_e(gap.after)}</title></g>')
    for band in view.bands():
        out.append(f'<g class="band" data-kind="{band.kind}" data-attempt="{band.attempt}" '
                   f'data-downtime="{band.downtime_s:.3f}"><rect x="{x(band.start)}" y="{_TOP - 14}" '
                   f'width="{max(1.0, x(band.end) - x(band.start)):.1f}" height="{_LANE_H * len(lanes) + 14}" '
                   f'fill="#f4c7c3" opacity="0.55"/><text x="{x(band.start) + 2}" y="{_TOP - 4}" font-size="10">'
                   f'{_e(band.kind)} {band.downtime_s:.1f} s</text><title>{_e(band.kind)} before attempt '
                   f'{band.attempt}: down {band.downtime_s:.1f} s\n{_e(band.reason)}</title></g>')
    for n, name in enumerate(lanes):
        out.append(f'<g class="lane" data-lane="{_e(name)}"><line x1="{_LABEL_W}" x2="{_WIDTH - 20}" '
                   f'y1="{y(n) + _LANE_H / 2}" y2="{y(n) + _LANE_H / 2}" stroke="#ddd"/>'
                   f'<text x="6" y="{y(n) + _LANE_H / 2 + 4}" font-size="12">{_e(name)}</text></g>')
    for attempt, (start, end) in view.attempts().items():
        colour = _ATTEMPT_COLOURS[(attempt - 1) % len(_ATTEMPT_COLOURS)]
        out.append(f'<g class="attempt" data-attempt="{attempt}"><rect x="{x(start)}" y="{y(0) + 8}" '
                   f'width="{max(1.0, x(end) - x(start)):.1f}" height="{_LANE_H - 16}" fill="{colour}" '
                   f'opacity="0.35"/><text x="{x(start) + 3}" y="{y(0) + _LANE_H / 2 + 4}" font-size="10">'
                   f'attempt {attempt}</text><title>attempt {attempt}: {start:.1f} s to {end:.1f} s</title></g>')
    for rank, attempt, start, end in view.worker_spans():
        lane = lanes.index(f"rank {rank}") if f"rank {rank}" in lanes else 0
        colour = _ATTEMPT_COLOURS[((attempt or 1) - 1) % len(_ATTEMPT_COLOURS)]
        out.append(f'<rect class="worker-span" data-rank="{rank}" data-attempt="{attempt}" x="{x(start)}" '
                   f'y="{y(lane) + 10}" width="{max(1.0, x(end) - x(start)):.1f}" height="{_LANE_H - 20}" '
                   f'fill="{colour}" opacity="0.6"><title>rank {rank}, attempt {attempt}: '
                   f'{start:.1f} s to {end:.1f} s</title></rect>')
    for i, e in view.commits():
        lane, cx = _lane_of(e, lanes), x(view.at(i))
        out.append(f'<line class="ckpt" data-step="{_e(e.get("global_step"))}" x1="{cx}" x2="{cx}" '
                   f'y1="{y(lane) + 4}" y2="{y(lane) + _LANE_H - 4}" stroke="#2a7" stroke-width="2">'
                   f'<title>{_e(_commit_text(e))}</title></line>')
    for i, e, text in view.faults():
        lane, cx = _lane_of(e, lanes), x(view.at(i))
        cy = y(lane) + _LANE_H / 2
        out.append(f'<g class="marker" data-event="{_e(e["event"])}" data-lane="{_e(lanes[lane])}">'
                   f'<path d="M{cx} {cy - 7} L{cx + 7} {cy} L{cx} {cy + 7} L{cx - 7} {cy} Z" fill="#c22" '
                   f'stroke="#fff"/><title>{_e(text)}</title></g>')
    for tick in _time_ticks(span):
        out.append(f'<text class="axis" x="{x(tick)}" y="{height - 8}" font-size="10" text-anchor="middle">'
                   f'{tick:g} s</text>')
    out.append("</svg>")
    return "\n".join(out)


_CATEGORY_COLOURS: Mapping[str, str] = {
    "productive": "#2ca02c", "startup": "#9ecae1", "tracing": "#6baed6", "restore": "#3182bd", "replayed": "#d62728",
    "standstill": "#ff9896", "save_blocking": "#ffbb78", "evaluation": "#c5b0d5", "epoch_ends": "#9467bd",
    "slow_rank_wait": "#e377c2", "stopping": "#c49c94", "finish": "#8c564b", "between_runs": "#d9d9d9",
    "other": "#7f7f7f",
}
_BAR_W, _BAR_H, _BAR_LABEL_W = 860, 18, 110


def _time_bars(account: TimeAccount) -> str:
    """One stacked bar for the run and one per attempt, each its own span at full width; a
    segment per category with seconds (class ``time-seg``, ``data-category``, ``data-seconds``)."""
    rows: list[tuple[str, str, Mapping[str, float], float]] = [("run", "run", account.seconds, account.wall_s)]
    rows += [(f"attempt {a.attempt}", str(a.attempt), a.seconds, a.span_s) for a in account.attempts]
    height = len(rows) * (_BAR_H + 8) + 4
    out = [f'<svg id="time-bars" xmlns="http://www.w3.org/2000/svg" width="{_BAR_LABEL_W + _BAR_W + 10}" '
           f'height="{height}" viewBox="0 0 {_BAR_LABEL_W + _BAR_W + 10} {height}">']
    for n, (label, key, seconds, total) in enumerate(rows):
        y = 2 + n * (_BAR_H + 8)
        out.append(f'<g class="time-bar" data-attempt="{_e(key)}" data-seconds="{total:.3f}">'
                   f'<text x="4" y="{y + _BAR_H - 5}" font-size="12">{_e(label)}</text>')
        x = float(_BAR_LABEL_W)
        for category in CATEGORIES:
            value = seconds.get(category, 0.0)
            if value <= 0:
                continue
            width = _BAR_W * value / total if total > 0 else 0.0
            share = value / total if total > 0 else 0.0
            out.append(f'<rect class="time-seg" data-category="{category}" data-seconds="{value:.3f}" x="{x:.1f}" '
                       f'y="{y}" width="{width:.1f}" height="{_BAR_H}" fill="{_CATEGORY_COLOURS[category]}">'
                       f'<title>{_e(label)}: {category} {value:.1f} s ({share:.1%})</title></rect>')
            x += width
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _time_table(account: TimeAccount) -> str:
    """The run's seconds and share per category, with each one's definition; start-up by phase."""
    wall = account.wall_s
    rows = []
    for category in CATEGORIES:
        value = account.seconds[category]
        share = f"{value / wall:.1%}" if wall > 0 else "-"
        rows.append(f'<tr class="time-row" data-category="{category}" data-seconds="{value:.3f}"><td>'
                    f'<span style="color:{_CATEGORY_COLOURS[category]}">&#9632;</span> {category}</td>'
                    f'<td>{value:.1f} s</td><td>{share}</td><td class="note">{_e(DEFINITIONS[category])}</td></tr>')
        if category == "startup":
            rows += [f'<tr class="time-phase" data-phase="{_e(phase)}" data-seconds="{seconds:.3f}"><td>'
                     f'&nbsp;&nbsp;{_e(phase)}</td><td>{seconds:.1f} s</td><td></td><td></td></tr>'
                     for phase, seconds in account.phases.items() if seconds > 0]
    total = sum(account.seconds.values())
    rows.append(f'<tr class="time-total" data-seconds="{total:.3f}"><td>wall time</td><td>{wall:.1f} s</td>'
                f'<td>100%</td><td class="note">the categories add up to it: other is what no event explains</td></tr>')
    notes = "".join(f'<p class="note time-note">{_e(n)}</p>' for n in account.notes)
    goodput = f"{account.goodput:.1%}" if account.goodput is not None else "-"
    return ('<table class="time-account">\n' + "\n".join(rows) + "\n</table>\n" + notes +
            f'<p class="note" id="goodput-definition" data-goodput="{_e(goodput)}">goodput = productive / (wall time '
            f'- between_runs) = {goodput}. <code>benchmarks/goodput.py</code> measures another window: from a kill '
            f'to the next, with what a failure costs (standstill, the restart\'s start-up, tracing and restore, '
            f'replayed steps: here {account.failure_cost_s:.1f} s) as the only loss, so its figure leaves out the '
            f'first start-up, saves, epoch ends and the finish, and is higher.</p>')


def _commit_text(e: Mapping[str, Any]) -> str:
    """A commit tick's tooltip, in the console's words (1-based epochs: checkpoint_position)."""
    where = f" ({checkpoint_position(e)})" if isinstance(e.get("epoch"), int) and \
        isinstance(e.get("step_in_epoch"), int) else ""
    return f"checkpoint committed at global step {e.get('global_step')}{where}{' (async)' if 'blocked_ms' in e else ''}"


def _time_ticks(span: float) -> list[float]:
    step = 10 ** math.floor(math.log10(max(span, 1e-3)))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= 8:
            step *= factor
            break
    return [round(k * step, 6) for k in range(int(span / step) + 1)]


def _chart(name: str, points: list[tuple[int, int, float]], restores: list[int]) -> str:
    steps = [p[1] for p in points] + restores
    values = [p[2] for p in points]
    x_lo, x_hi = min(steps), max(steps)
    y_lo, y_hi = min(values), max(values)
    x_hi, y_hi = (x_hi if x_hi > x_lo else x_lo + 1), (y_hi if y_hi > y_lo else y_lo + 1)

    def x(step: float) -> float:
        return round(_PAD + (_CHART_W - 2 * _PAD + 10) * (step - x_lo) / (x_hi - x_lo), 1)

    def y(value: float) -> float:
        return round(_CHART_H - _PAD + 10 - (_CHART_H - _PAD - 10) * (value - y_lo) / (y_hi - y_lo), 1)

    out = [f'<svg class="chart" data-series="{_e(name)}" xmlns="http://www.w3.org/2000/svg" width="{_CHART_W}" '
           f'height="{_CHART_H}" viewBox="0 0 {_CHART_W} {_CHART_H}">',
           f'<text x="{_PAD}" y="14" font-size="13" font-weight="bold">{_e(name)}</text>',
           f'<text x="4" y="{y(y_hi) + 4}" font-size="10">{y_hi:.4g}</text>',
           f'<text x="4" y="{y(y_lo) + 4}" font-size="10">{y_lo:.4g}</text>',
           f'<text x="{x(x_lo)}" y="{_CHART_H - 8}" font-size="10">step {x_lo}</text>',
           f'<text x="{x(x_hi)}" y="{_CHART_H - 8}" font-size="10" text-anchor="end">step {x_hi}</text>']
    for step in restores:
        out.append(f'<line class="restore" data-step="{step}" x1="{x(step)}" x2="{x(step)}" y1="20" '
                   f'y2="{_CHART_H - _PAD + 10}" stroke="#888" stroke-dasharray="4 3">'
                   f'<title>restored global step {step}</title></line>')
    for attempt in sorted({p[0] for p in points}):
        mine = [p for p in points if p[0] == attempt]
        colour = _ATTEMPT_COLOURS[(attempt - 1) % len(_ATTEMPT_COLOURS)]
        coords = " ".join(f"{x(s)},{y(v)}" for _, s, v in mine)
        out.append(f'<g class="curve" data-attempt="{attempt}"><polyline points="{coords}" fill="none" '
                   f'stroke="{colour}" stroke-width="1.5"/>')
        out += [f'<circle class="pt" cx="{x(s)}" cy="{y(v)}" r="2.5" fill="{colour}"><title>attempt {attempt}, '
                f'step {s}: {v:.6g}</title></circle>' for _, s, v in mine]
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


_STYLE = """body{font-family:system-ui,sans-serif;margin:20px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:26px}
table.summary td{padding:2px 12px 2px 0;font-family:monospace}
.charts{display:flex;flex-wrap:wrap;gap:12px}.note{color:#666;font-size:12px}
.marker{cursor:help}.legend span{display:inline-block;margin-right:14px;font-size:12px}"""


def render_page(view: RunView, *, title: str | None = None) -> str:
    """The whole page: self-contained HTML (inline style, inline SVG, no script, no link)."""
    title = title or f"resilient-train run {view.source}"
    restores = sorted({e["global_step"] for _, e in view.restores() if isinstance(e.get("global_step"), int)})
    curves = view.curves()
    summary = "\n".join(f'<tr data-key="{_e(k)}"><td>{_e(k)}</td><td>{_e(v)}</td></tr>'
                        for k, v in view.summary_rows())
    plural = "s" if view.skipped_lines != 1 else ""
    skipped = (f'<p class="skipped" data-skipped="{view.skipped_lines}">{view.skipped_lines} torn or garbled '
               f'line{plural} of events.jsonl skipped</p>') if view.skipped_lines else ""
    legend = ('<p class="legend"><span>&#9670; fault (hover: root cause)</span><span>| checkpoint commit</span>'
              '<span>red: restart / resize / preemption downtime</span><span>grey: between runs (no run under '
              'way)</span><span>bars: attempts and worker processes</span></p>')
    account = view.time_account()
    charts = "\n".join(_chart(name, points, restores) for name, points in curves.items()) \
        or '<p class="note">no train_progress or epoch_finished events</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{_e(title)}</h1>
{skipped}
<h2>Summary</h2>
<table class="summary">
{summary}
</table>
<p class="note">goodput = productive training / (wall time - stopped between runs) (where the time went,
below); downtime: from leaving <code>running</code> to the next attempt's first step; stopped between runs: from
the end of one <code>resilient-train run</code> to the start of the next (a stop, a failure, a killed
supervisor), when nothing was supposed to train.</p>
<h2>Where the time went</h2>
<p class="note">Every second of the wall time in one category; one bar for the run and one per attempt (each
its own span), from events.jsonl (<code>resilient_train/rundir/time_account.py</code>).</p>
{_time_bars(account)}
{_time_table(account)}
<h2>Timeline</h2>
{legend}
{_timeline(view)}
<h2>Training curves</h2>
<p class="note">x: global step; one colour per attempt; dashed: a restore (the next attempt continues from there).</p>
<div class="charts">
{charts}
</div>
</body></html>
"""
