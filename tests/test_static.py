"""The linter and the type checker are part of the suite: a new finding fails `make test`.

Both run from this interpreter's environment (the `test` extra pins them) at the checkout's
root, with the settings in pyproject.toml ([tool.ruff], [tool.mypy]); the failure message is
their own report. mypy keeps its cache in .mypy_cache, so a second run takes seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_in_the_tree():
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, f"ruff check . exited {done.returncode}:\n{done.stdout}{done.stderr}"


def test_mypy_finds_nothing_in_the_checked_packages():
    done = _run("mypy")  # files, cache and strictness: [tool.mypy] in pyproject.toml
    assert done.returncode == 0, f"mypy exited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert done.stdout.startswith("Success: no issues found in "), done.stdout
