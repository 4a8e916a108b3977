"""Imports run one way: each package imports only from the layers below it (and itself).

    __main__                         python -m resilient_train
    cli, package root                dispatch and the public API
    chaos                            fault injection and its checker (test machinery)
    commands                         one module per subcommand
    runner | supervisor              worker side | process side: never each other
    job                              config, recipe, preflight, fingerprint
    checkpoint                       the commit protocol over fsspec
    rundir | cluster                 the run-dir contract | TF_CONFIG, Slurm, ports
    errors                           exception types and exit codes

Lazy imports inside functions count: a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "resilient_train"
LAYERS = [
    {"errors"},
    {"rundir", "cluster"},
    {"checkpoint"},
    {"job"},
    {"runner", "supervisor"},
    {"commands"},
    {"chaos"},
    {"cli", "__init__"},
    {"__main__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _part(module: str) -> str:
    """``resilient_train.job.config`` -> ``job``; ``resilient_train`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "resilient_train":  # from resilient_train import x: x is the part
                found += [(node.lineno, f"resilient_train.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "resilient_train" or name.startswith("resilient_train.")]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_site" not in p.parts)


def test_every_module_belongs_to_a_layer():
    parts = {_part(".".join(("resilient_train", *p.relative_to(PACKAGE).with_suffix("").parts))) for p in _modules()}
    assert parts - set(RANK) == set()


def _violations(path: Path, own: str) -> list[str]:
    wrong = []
    for line, name in _imports(path):
        other = _part(name)
        if other != own and RANK[other] >= RANK[own]:
            wrong.append(f"{path.name}:{line} imports {name} ({own} may not import {other})")
    return wrong


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path):
    own = _part(".".join(("resilient_train", *path.relative_to(PACKAGE).with_suffix("").parts)))
    assert _violations(path, own) == []


def test_the_check_catches_a_lazy_import_across_peers_and_upwards(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from resilient_train.supervisor.supervisor import Supervisor\n"
                   "    from resilient_train import commands\n")
    assert _violations(bad, "runner") == [
        "bad.py:2 imports resilient_train.supervisor.supervisor (runner may not import supervisor)",
        "bad.py:3 imports resilient_train.commands (runner may not import commands)",
    ]
    assert _violations(bad, "chaos") == []


def _m_literals(path: Path) -> list[str]:
    """``"-m", "resilient_train..."`` spelled out in an argv: the module string the layers cannot see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else node.args if isinstance(node, ast.Call) else []
        for flag, module in zip(items, items[1:]):
            if (isinstance(flag, ast.Constant) and flag.value == "-m"
                    and isinstance(module, ast.Constant) and isinstance(module.value, str)):
                found.append(f"{path.name}:{module.lineno} runs -m {module.value}")
    return found


def test_launched_modules_are_named_once_in_entry_points():
    from resilient_train.cluster import entry_points

    assert [found for path in _modules() for found in _m_literals(path)] == []
    modules = {name: value for name, value in vars(entry_points).items() if name.isupper()}
    assert set(modules) == {"CLI", "WORKER", "WARM_STANDBY", "STANDBY_TEMPLATE", "PS_ROLE", "INPUT_PROBE", "SLURM_TASK"}
    for name, module in modules.items():
        target = PACKAGE.parent.joinpath(*module.split("."))
        runnable = (target / "__main__.py") if target.is_dir() else target.with_suffix(".py")
        assert runnable.is_file(), f"{name} = {module!r} names no runnable module"
        if runnable.name != "__main__.py":
            assert 'if __name__ == "__main__":' in runnable.read_text(), f"{name} = {module!r} has no __main__ block"


def test_module_names_are_unique_across_the_package():
    names = [p.name for p in _modules() if p.name not in {"__init__.py", "__main__.py"}]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []


def test_the_m_check_catches_a_spelled_out_module(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text('argv = [sys.executable, "-m", "resilient_train.runner", "--job", path]\n')
    assert _m_literals(bad) == ["bad.py:1 runs -m resilient_train.runner"]
