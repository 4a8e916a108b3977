"""Real standby processes: what is safe to pre-warm, and the pool's protocol end to end.

Each test imports TensorFlow in a subprocess (seconds, more on a loaded machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from resilient_train.supervisor.standby_pool import StandbyPool

REPO = Path(__file__).resolve().parents[2]

_FINDING = r"""
import json, os, socket
import tensorflow as tf, keras
import resilient_train.runner.training.loop
tf.config.list_physical_devices()
if os.environ["OP_FIRST"] == "1":
    tf.constant(1.0)  # any op initializes the eager context
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}})
try:
    tf.distribute.MultiWorkerMirroredStrategy()
    print("RESULT ok")
except RuntimeError as exc:
    print("RESULT", exc)
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO), **extra}


def _result(op_first: bool) -> str:
    out = subprocess.run([sys.executable, "-c", _FINDING], env=_env(OP_FIRST="1" if op_first else "0"),
                         capture_output=True, text=True, timeout=300, cwd=REPO).stdout
    return [line for line in out.splitlines() if line.startswith("RESULT")][-1]


def test_imports_are_safe_before_the_strategy_but_an_op_is_not():
    assert _result(op_first=False) == "RESULT ok"
    assert _result(op_first=True) == "RESULT Collective ops must be configured at program startup"


def _wait(predicate, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_recipe_that_runs_an_op_at_import_makes_the_standby_unusable(tmp_path):
    recipe = tmp_path / "eager_recipe.py"
    recipe.write_text(
        (REPO / "recipes" / "linear_regression.py").read_text() + "\nSCALE = tf.constant(2.0)  # an op at import\n"
    )
    events: list[tuple[str, dict]] = []
    pool = StandbyPool(1, argv=[sys.executable, "-m", "resilient_train.runner.process.warm_standby", "--recipe", str(recipe)],
                       env=_env(), log_dir=tmp_path / "standby", emit=lambda e, **f: events.append((e, f)))
    try:
        pool.maintain(refill=True)
        _wait(lambda: pool.maintain() or pool.disabled is not None)
    finally:
        pool.close()
    assert "the eager context was initialized during pre-warm" in pool.disabled
    assert [e for e, _ in events] == ["standby_started", "standby_disabled"]
    assert pool.hand_over(["--job", "x"], {}, tmp_path / "w.log") is None


def test_a_standby_that_preconverted_a_recipes_loss_and_metrics_is_still_usable(tmp_path):
    """prewarm converts the recipe's loss and metrics with AutoGraph ahead of a restart
    (runner/input/batches.py preconvert): pure Python, so the eager context stays
    uninitialized and the standby reports itself ready."""
    events: list[tuple[str, dict]] = []
    recipe = REPO / "recipes" / "digits_cnn.py"  # defines loss and metrics
    pool = StandbyPool(1, argv=[sys.executable, "-m", "resilient_train.runner.process.warm_standby", "--recipe", str(recipe)],
                       env=_env(), log_dir=tmp_path / "standby", emit=lambda e, **f: events.append((e, f)))
    try:
        pool.maintain(refill=True)
        _wait(lambda: pool.maintain() or pool.ready_count() == 1 or pool.disabled is not None)
    finally:
        pool.close()
    assert pool.disabled is None
    assert [e for e, _ in events] == ["standby_started", "standby_ready"]


def test_a_real_standby_killed_while_waiting_is_replaced_and_the_replacement_becomes_the_worker(tmp_path):
    events: list[tuple[str, dict]] = []
    pool = StandbyPool(1, argv=[sys.executable, "-m", "resilient_train.runner.process.warm_standby"], env=_env(),
                       log_dir=tmp_path / "standby", emit=lambda e, **f: events.append((e, f)))
    try:
        pool.maintain(refill=True)
        _wait(lambda: pool.maintain() or pool.ready_count() == 1)
        victim = pool.waiting[0].pid
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: pool.maintain() or len([e for e, _ in events if e == "standby_started"]) == 2)
        replacement = pool.waiting[0]
        assert replacement.pid != victim
        log = tmp_path / "attempt-1" / "worker-0.log"
        # A job file that does not exist: the worker main exits 2 (usage) and says why in the log.
        process = pool.hand_over(["--job", str(tmp_path / "missing.json")], _env(RT_ATTEMPT="1"), log)
        assert process is replacement
        _wait(lambda: process.poll() is not None)
    finally:
        pool.close()
    assert process.poll() == 2
    assert "resilient-train worker:" in log.read_text() and "missing.json" in log.read_text()
    lost = [f for e, f in events if e == "standby_lost"]
    assert [(f["pid"], f["signal"]) for f in lost] == [(victim, "SIGKILL")]
