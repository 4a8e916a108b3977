"""Chaos tests: pure logic (fast) and a CI subset of real scenarios.

Tests marked ``@pytest.mark.slow`` run real multi-worker jobs for longer than CI should
wait; they are skipped unless ``RT_SLOW=1`` (or selected explicitly with ``-m slow``).
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("RT_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow chaos scenario; set RT_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(os.path.dirname(__file__)):
            item.add_marker(skip)
