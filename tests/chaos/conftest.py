"""Chaos tests: pure logic (fast) and a CI subset of real scenarios.

Tests marked ``@pytest.mark.slow`` run real multi-worker jobs for longer than CI should
wait; they are skipped unless ``RT_SLOW=1`` (or selected explicitly with ``-m slow``): the
hook is tests/conftest.py's, for every package.
"""

from __future__ import annotations

