"""The standby template's protocol with real processes: fork, status, assignment, exit codes,
signals, the pool on top, and what happens when the template dies or is unusable.

One template per module imports TensorFlow (seconds, more on a loaded machine); every
standby after that is a fork.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from resilient_train.cluster import entry_points
from resilient_train.supervisor.forked_standbys import ForkServerSpawner, ForkedStandby, TemplateState
from resilient_train.supervisor.standby_pool import PopenStandby, StandbyPool

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _wait(predicate, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _spawner(log_dir: Path, events: list, recipe: Path | None = None) -> ForkServerSpawner:
    argv = [sys.executable, "-m", entry_points.STANDBY_TEMPLATE, *(["--recipe", str(recipe)] if recipe else [])]
    return ForkServerSpawner(argv, _env(), log_dir / "template.log", emit=lambda e, **f: events.append((e, f)))


def _ready(spawner: ForkServerSpawner):
    """The first standby once the template is ready (None before: the pool would ask again)."""
    spawner.start()
    found: list = []
    _wait(lambda: found.append(spawner([], {}, spawner.log_path.parent / "standby-1.log")) or found[-1] is not None)
    return found[-1]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    events: list = []
    spawner = _spawner(tmp_path_factory.mktemp("template"), events)
    first = _ready(spawner)
    yield spawner, events, first
    spawner.close()


def test_a_forked_standby_says_ready_becomes_the_worker_and_its_exit_code_comes_back(template, tmp_path):
    spawner, events, first = template
    assert [e for e, _ in events] == ["standby_template_started", "standby_template_ready"]
    assert isinstance(first, ForkedStandby) and first.forked
    assert first.pid != spawner.template.pid
    _wait(lambda: first.status() is not None)
    assert first.status()["ok"] is True and first.status()["pid"] == first.pid
    log = tmp_path / "attempt-1" / "worker-0.log"
    # A job file that does not exist: the worker main exits 2 (usage) and says why in the log.
    assert first.assign({"argv": ["--job", str(tmp_path / "missing.json")], "env": _env(RT_ATTEMPT="1"),
                         "log": str(log)})
    _wait(lambda: first.poll() is not None)
    assert first.poll() == 2
    assert "resilient-train worker:" in log.read_text() and "missing.json" in log.read_text()


def test_a_forked_standby_is_signalled_by_the_supervisor_and_reports_the_signal(template, tmp_path):
    spawner, _, _ = template
    standby = spawner([], {}, tmp_path / "standby-2.log")
    _wait(lambda: standby.status() is not None)
    assert standby.poll() is None
    standby.send_signal(signal.SIGTERM)
    _wait(lambda: standby.poll() is not None)
    assert standby.poll() == -signal.SIGTERM
    standby.send_signal(signal.SIGKILL)  # gone: a no-op, never another process
    released = spawner([], {}, tmp_path / "standby-3.log")
    released.release()
    assert released.poll() == -signal.SIGKILL


def test_the_pool_forks_its_standbys_and_refills_after_a_loss(template, tmp_path):
    spawner, _, _ = template
    events: list = []
    pool = StandbyPool(2, argv=["unused"], env={}, log_dir=tmp_path / "standby", spawner=spawner,
                       emit=lambda e, **f: events.append((e, f)))
    try:
        pool.maintain(refill=True)
        _wait(lambda: pool.maintain() or pool.ready_count() == 2)
        victim = pool.waiting[0].pid
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: pool.maintain() or pool.ready_count() == 2 and victim not in [p.pid for p in pool.waiting])
    finally:
        pool.close()
    started = [f for e, f in events if e == "standby_started"]
    assert [f["forked"] for f in started] == [True, True, True]
    assert [(f["pid"], f["signal"]) for e, f in events if e == "standby_lost"] == [(victim, "SIGKILL")]


def test_a_dead_template_takes_its_standbys_with_it_and_spawning_takes_over(tmp_path):
    events: list = []
    spawner = _spawner(tmp_path, events)
    try:
        standby = _ready(spawner)
        _wait(lambda: standby.status() is not None)
        os.kill(spawner.template.pid, signal.SIGKILL)
        _wait(lambda: standby.poll() is not None, timeout=30)
        assert standby.poll() == -signal.SIGKILL  # its parent-death signal
        assert spawner.template.state is TemplateState.LOST
        fallback = spawner([sys.executable, "-c", "import time; time.sleep(60)"], _env(), tmp_path / "s.log")
        assert isinstance(fallback, PopenStandby)
        fallback.release()
    finally:
        spawner.close()
    lost = [f for e, f in events if e == "standby_template_lost"]
    assert [(f["pid"], f["signal"]) for f in lost] == [(spawner.template.pid, "SIGKILL")]


def test_an_unusable_template_disables_the_pool(tmp_path):
    recipe = tmp_path / "eager_recipe.py"
    recipe.write_text(
        (REPO / "recipes" / "linear_regression.py").read_text() + "\nSCALE = tf.constant(2.0)  # an op at import\n"
    )
    events: list = []
    spawner = _spawner(tmp_path, events, recipe)
    spawner.start()
    pool = StandbyPool(1, argv=["unused"], env={}, log_dir=tmp_path / "standby", spawner=spawner,
                       emit=lambda e, **f: events.append((e, f)))
    try:
        _wait(lambda: pool.maintain(refill=True) or pool.disabled is not None)
    finally:
        pool.close()
        spawner.close()
    assert "the eager context was initialized during pre-warm" in pool.disabled
    assert [e for e, _ in events] == ["standby_template_started", "standby_disabled"]
