"""A real run's report page, opened in a real browser (headless Chromium).

The run: recipes/linear_regression.py on 2 workers, stopped by a SIGTERM to the supervisor
once a checkpoint is committed (a preemption: exit 143), then run again in the same run dir,
where an RT_FAULTS fault SIGKILLs rank 1 after global step 17 of that invocation's first
attempt; the supervisor restarts the group and the run completes. ``resilient-train report``
writes the page; Chromium loads it from a file:// URL (no network), and the DOM it
*rendered* (``--dump-dom``) must hold exactly the lanes, fault markers, checkpoint ticks,
restart bands, the gap between the two invocations and curve points the events call for. The screenshot is left in the test's tmp
dir (``report.png``).

Skipped where no Chromium is installed (``make browser-deps`` installs Debian's), except with
RT_REQUIRE_CHROMIUM=1 (``make test-all``), where its absence fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from resilient_train.commands.report_page import load_run
from tests.integration.harness import read_events, run_job, run_job_until
from tests.support.page_dom import PageDom

RECIPE = "recipes/linear_regression.py"
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str:
    found = next((path for path in map(shutil.which, _BROWSERS) if path), None)
    if found is None:
        if os.environ.get("RT_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"RT_REQUIRE_CHROMIUM=1 but none of {', '.join(_BROWSERS)} is on PATH (make browser-deps)")
        pytest.skip(f"no headless browser ({', '.join(_BROWSERS)}) on PATH; make browser-deps installs Chromium")
    return found


def _headless(browser: str, *flags: str, profile: Path) -> subprocess.CompletedProcess:
    # --no-sandbox: tests run as root in containers, where Chromium's sandbox cannot start.
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", *flags], capture_output=True, text=True, timeout=120)


def test_a_real_runs_page_renders_in_chromium(tmp_path):
    browser = _browser()
    run_dir = tmp_path / "run"
    first = run_job_until(
        RECIPE, run_dir, "--workers", "2",
        when=lambda events: any(e["event"] == "checkpoint_committed" for e in events),
        action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert first.returncode == 143, first.output
    resumed_attempt = 1 + max(e["attempt"] for e in read_events(run_dir) if e["event"] == "worker_started")
    second = run_job(RECIPE, run_dir, "--workers", "2", faults=[
        {"point": "after_step", "global_step": 17, "rank": 1, "attempt": resumed_attempt, "signal": "SIGKILL"}])
    assert second.returncode == 0, second.output
    events = read_events(run_dir)
    counts = Counter(e["event"] for e in events)
    assert (counts["preempted"], counts["gang_restart"]) == (1, 1)

    page = tmp_path / "report.html"
    report = subprocess.run([sys.executable, "-m", "resilient_train", "report", str(run_dir),
                             "--out", str(page)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert (report.returncode, report.stdout) == (0, f"Report: {page}\n"), report.stderr

    dumped = _headless(browser, "--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert dumped.returncode == 0, dumped.stderr
    dom = PageDom()
    dom.feed(dumped.stdout)
    view = load_run(run_dir)
    assert [lane["data-lane"] for lane in dom.of_class("lane")] == ["supervisor", "rank 0", "rank 1"]
    assert [m["data-event"] for m in dom.of_class("marker")] == [e["event"] for _, e, _ in view.faults()]
    marked = {m["data-event"] for m in dom.of_class("marker")}
    assert {"worker_exited", "gang_restart", "preemption_requested", "preempted"} <= marked
    assert [int(t["data-step"]) for t in dom.of_class("ckpt")] == [
        e["global_step"] for e in events if e["event"] == "checkpoint_committed"]
    # the SIGTERM stop: a gap between the invocations, not downtime; the kill: a restart band
    assert [b["data-kind"] for b in dom.of_class("band")] == ["restart"]
    assert [g["data-seconds"] for g in dom.of_class("gap")] == [f"{g.seconds:.3f}" for g in view.gaps()]
    assert len(view.gaps()) == 1
    rows = dict(zip(dom.cells[0::2], dom.cells[1::2]))
    assert (rows["invocations"], rows["restarts"], rows["preemptions"]) == ("2", "1", "1")
    assert len(dom.of_class("pt")) == sum(len(points) for points in view.curves().values())
    assert len(dom.of_class("pt")) >= counts["train_progress"] + counts["epoch_finished"]
    restored = sorted({str(e["global_step"]) for e in events if e["event"] == "restored"})
    assert sorted({r["data-step"] for r in dom.of_class("restore")}) == restored

    shot = tmp_path / "report.png"
    taken = _headless(browser, "--hide-scrollbars", "--window-size=1200,1500", f"--screenshot={shot}",
                      page.as_uri(), profile=tmp_path / "profile")
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
