"""The documents say what the code does: links resolve, commands parse, the quickstart is the Makefile's.

* every relative link in README.md, docs/*.md, benchmarks/README.md and chaos/README.md names a file or
  directory of the repository;
* every ``resilient-train ...``, ``python -m resilient_train...`` and ``python -m chaos ...`` line
  in a fenced bash block is accepted by the real argument parser of the module it runs (no exit 2);
* the README's quickstart block states exactly the commands ``make run`` and ``make test`` run;
* every ``runner/x.py``-style path in the documents and in the code's docstrings and comments
  names a file of the repository (a module moved without its references fails here);
* so does every dotted module reference there (``resilient_train.runner.process.worker_main``,
  ``runner.process.worker_main.run``): its modules exist and the name after them is defined in the last one.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import io
import re
import shlex
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md", ROOT / "chaos" / "README.md"]

# What the documents hold today. Adding a command line to a bash block changes these on purpose.
EXPECTED_PARSED = 49  # 57 until the README was cut to a newcomer's page (issue 45 item 5): README 13 -> 2,
# docs/elastic.md +1 (the README's local indexed elastic run); the README's others were already in docs/;
# +2 for issue 46 items 5-6 (keras.md: the VAE example; commands.md: export of a fit script)
EXPECTED_WITH_PLACEHOLDER = 2  # `chaos check --reference "$DIGEST"` (twice): $DIGEST parsed as a stand-in value

# ``python -m chaos`` at the checkout's root is chaos/__main__.py, which hands its command line to this
# module's main: its lines are checked by that module's parser (the identity is tested below).
_SAME_COMMAND = {"chaos": "resilient_train.chaos"}

_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_PLACEHOLDER = re.compile(r"<[^>]+>")


def _blocks(path: Path, language: str) -> list[str]:
    """The bodies of the fenced blocks tagged ``language`` (```bash ... ```)."""
    blocks, current, in_block = [], [], None
    for line in path.read_text().splitlines():
        fence = _FENCE.match(line)
        if fence and in_block is None:
            in_block, current = fence.group(1), []
        elif line.strip() == "```" and in_block is not None:
            if in_block == language:
                blocks.append("\n".join(current))
            in_block = None
        elif in_block is not None:
            current.append(line)
    assert in_block is None, f"{path.name}: unclosed code fence"
    return blocks


def _outside_code(path: Path) -> str:
    """The document without fenced blocks and inline code, where links live."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _commands(block: str) -> list[str]:
    """One string per command line: continuations joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [shlex.join(shlex.split(line, comments=True)) for line in joined.splitlines() if shlex.split(line, comments=True)]


def _argument_parser(module_name: str) -> argparse.ArgumentParser:
    """The parser a command line module builds, found by what it returns, not by its name.

    The one function of ``module_name`` that takes no arguments and is annotated to
    return an ``argparse.ArgumentParser`` (``resilient_train.cli._parser`` today).
    """
    module = importlib.import_module(module_name)

    def builds_a_parser(function) -> bool:
        signature = inspect.signature(function)
        returns = signature.return_annotation  # a string under `from __future__ import annotations`
        name = returns if isinstance(returns, str) else getattr(returns, "__name__", "")
        return name.endswith("ArgumentParser") and all(p.default is not p.empty for p in signature.parameters.values())

    factories = [function for _, function in inspect.getmembers(module, inspect.isfunction)
                 if function.__module__ == module.__name__ and builds_a_parser(function)]
    assert len(factories) == 1, f"{module_name}: expected one ArgumentParser factory, found {[f.__name__ for f in factories]}"
    parser = factories[0]()
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def _parser_module(argv: list[str]) -> tuple[str, list[str]]:
    """``resilient-train run X`` -> (``resilient_train.cli``, [run, X]); ``python -m M ...`` -> M's parser module."""
    if argv[0] == "resilient-train":
        return "resilient_train.cli", argv[1:]
    assert argv[:2] == ["python", "-m"], argv
    module = _SAME_COMMAND.get(argv[2], argv[2])
    if module == "resilient_train":
        return "resilient_train.cli", argv[3:]
    return f"{module}.__main__", argv[3:]


def _documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCUMENTS:
        for block in _blocks(path, "bash"):
            for command in _commands(block):
                if command.startswith(("resilient-train ", "python -m resilient_train", "python -m chaos ")):
                    found.append((path.relative_to(ROOT).as_posix(), command))
    return found


def test_every_relative_link_names_an_existing_path():
    checked, broken = 0, []
    for path in DOCUMENTS:
        for target in _LINK.findall(_outside_code(path)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s)://, mailto:, an anchor in the same document
            checked += 1
            if not (path.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
    assert checked > 0


def test_every_documented_command_line_parses(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    parsed, with_placeholder, rejected = 0, 0, []
    for document, command in _documented_commands():
        assert not _PLACEHOLDER.search(command), f"{document}: write a real value, not a <placeholder>: {command}"
        text, substitutions = _VARIABLE.subn("STAND_IN", command)
        with_placeholder += substitutions > 0
        module, argv = _parser_module(shlex.split(text))
        try:
            _argument_parser(module).parse_args(argv)
        except SystemExit as exc:
            if exc.code == 2:
                rejected.append(f"{document}: {command}")
                continue
        parsed += 1
    assert rejected == []
    assert (parsed, with_placeholder) == (EXPECTED_PARSED, EXPECTED_WITH_PLACEHOLDER)


def test_python_m_chaos_is_the_chaos_packages_command():
    checkout = importlib.import_module("chaos.__main__")
    assert Path(checkout.__file__) == ROOT / "chaos" / "__main__.py"
    assert checkout.main is importlib.import_module("resilient_train.chaos.__main__").main
    assert _parser_module(["python", "-m", "chaos", "list"]) == ("resilient_train.chaos.__main__", ["list"])


def test_a_wrong_command_line_is_caught():
    """The check above can fail: the parser it finds rejects an unknown flag with exit 2."""
    with pytest.raises(SystemExit) as exc:
        _argument_parser("resilient_train.cli").parse_args(["run", "recipes/digits_cnn.py", "--no-such-flag"])
    assert exc.value.code == 2


def test_every_job_flag_and_every_config_key_without_a_flag_is_in_commands_md():
    from resilient_train.job.config import JOB_OPTIONS

    text = (ROOT / "docs" / "commands.md").read_text()
    names = [option.flag or f"`{name}`" for name, option in JOB_OPTIONS.items()]
    assert [name for name in names if not re.search(re.escape(name) + r"(?![\w-])", text)] == []


def _makefile_recipes() -> dict[str, list[str]]:
    """Each target's recipe lines, with ``$(BIN)`` spelled as the path it stands for."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= (.+)$", text, flags=re.M))
    bin_dir = re.search(r"^BIN := (.+)$", text, flags=re.M).group(1).replace("$(VENV)", variables["VENV"])
    recipes, target = {}, None
    for line in text.splitlines():
        header = re.match(r"^([\w-]+):", line)
        if header:
            target = header.group(1)
            recipes[target] = []
        elif line.startswith("\t") and target is not None:
            recipes[target].append(line.strip().replace("$(BIN)", bin_dir))
        elif not line.strip():
            target = None
    return recipes


def test_the_quickstart_states_what_the_makefile_runs():
    recipes = _makefile_recipes()
    assert recipes["run"] == [".venv/bin/resilient-train run recipes/digits_cnn.py --workers 2"]
    assert recipes["test"] == [".venv/bin/python -m pytest -q --durations=25"]
    quickstart = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    first_block = _blocks_in(quickstart)[0]
    stated = dict(re.fullmatch(r"make (\w+)\s+# (.+)", line).groups() for line in first_block.splitlines())
    assert stated == {"run": recipes["run"][0], "test": recipes["test"][0]}


def _blocks_in(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)\n```", text, flags=re.M | re.S)


# ``runner/input/data.py``, ``launchers/local.py``, ``benchmarks/recovery.py``: a path of this
# repository, named from any directory down (a reference may start at the package, a layer
# or a sub-package). Placeholders (``benchmarks/NAME.py``) and other projects' files
# (``keras/src/...``) start elsewhere or are capitals, and are not references.
_PATH = re.compile(r"(?<![\w/.\-<>{}*$])((?:[A-Za-z_][\w.\-]*/)+[a-z_][\w\-]*\.py)(?![\w])")
_REFERRING = [*DOCUMENTS, *sorted((ROOT / "resilient_train").rglob("*.py")),
              *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "recipes").glob("*.py")),
              *sorted((ROOT / "examples").rglob("*.py"))]


def _repository_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if not {".venv", ".git", "runs"} & set(p.relative_to(ROOT).parts)}


def _own_directories() -> set[str]:
    return {part for path in _repository_files() for part in path.split("/")[:-1]}


def _path_references(text: str, own: set[str]) -> list[str]:
    return [m.group(1) for m in _PATH.finditer(text) if m.group(1).split("/")[0] in own]


def _dangling(text: str, files: set[str], own: set[str]) -> list[str]:
    return [ref for ref in _path_references(text, own) if not any(f == ref or f.endswith("/" + ref) for f in files)]


def test_every_path_reference_names_a_file():
    files, own = _repository_files(), _own_directories()
    found = {path.relative_to(ROOT).as_posix(): _dangling(path.read_text(), files, own)
             for path in _REFERRING if path.exists()}
    assert sum(len(_path_references(p.read_text(), own)) for p in _REFERRING if p.exists()) > 300
    assert {name: refs for name, refs in found.items() if refs} == {}


def test_the_path_check_catches_a_moved_module():
    files, own = _repository_files(), _own_directories()
    text = "positioned at step_in_epoch (runner/data.py), see launchers/local.py and keras/src/losses/loss.py"
    assert _dangling(text, files, own) == ["runner/data.py"]


# ``resilient_train.runner.process.worker_main``, ``runner.process.worker_main.run``: a module of the package, named from
# the package or from one of its sub-packages, maybe followed by a name it defines. Read in the documents
# and in the comments and strings (docstrings) of the code and the tests. A bare reference needs three
# parts and never starts at ``job`` (``cluster.rank``, ``job.workers``, ``supervisor.lock``: a variable's
# attribute or a file name, not a module path).
_PACKAGE = ROOT / "resilient_train"
_SUBPACKAGES = sorted(p.name for p in _PACKAGE.iterdir() if (p / "__init__.py").exists())
_DOTTED = re.compile(r"(?<![\w./\-])((?:resilient_train|" + "|".join(_SUBPACKAGES) + r")(?:\.[A-Za-z_]\w*)+)")
_DOTTED_REFERRING = [*_REFERRING, *sorted((ROOT / "tests").rglob("*.py"))]


def _prose(path: Path) -> str:
    """A document whole; of a Python file, its comments and strings."""
    if path.suffix != ".py":
        return path.read_text()
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING))


def _dotted_references(text: str) -> list[str]:
    refs = [m.group(1) for m in _DOTTED.finditer(text)]
    return [ref for ref in refs if ref.startswith("resilient_train.")
            or (len(ref.split(".")) >= 3 and not ref.startswith("job."))]


def _module_file(parts: list[str]) -> Path | None:
    path = _PACKAGE.joinpath(*parts)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _defined_names(path: Path) -> set[str]:
    """What a module defines at its top (imports included; under if/try too)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(inner.name)
            elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in inner.names)
            elif isinstance(inner, (ast.Assign, ast.AnnAssign)):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _dotted_dangling(ref: str) -> bool:
    parts = ref.split(".")[1:] if ref.startswith("resilient_train.") else ref.split(".")
    found, module = 0, None
    while found < len(parts) and _module_file(parts[:found + 1]) is not None:
        found += 1
        module = _module_file(parts[:found])
    if found == len(parts):
        return False
    return module is None or parts[found] not in _defined_names(module)


def test_every_dotted_module_reference_names_a_module():
    found = {path.relative_to(ROOT).as_posix(): [r for r in _dotted_references(_prose(path)) if _dotted_dangling(r)]
             for path in _DOTTED_REFERRING if path.exists()}
    assert sum(len(_dotted_references(_prose(p))) for p in _DOTTED_REFERRING if p.exists()) > 100
    assert {name: refs for name, refs in found.items() if refs} == {}


def test_the_dotted_check_catches_a_renamed_module():
    old = "runner." + "worker"  # built here, so that this file's own strings do not hold it
    text = (f"the worker itself is ``{old}.run``; python -m {'resilient_train.' + old}; "
            "see resilient_train.runner.process.worker_main.main, supervisor.launchers.local and job.workers")
    assert [r for r in _dotted_references(text) if _dotted_dangling(r)] == [f"{old}.run", f"resilient_train.{old}"]


def test_the_design_file_map_names_every_module():
    # docs/design.md's tree is where a newcomer looks for a room: each module is named there
    # (by file name; unique across the package, tests/test_layering.py).
    tree = re.search(r"^```\n(resilient_train/.*?)^```", (ROOT / "docs" / "design.md").read_text(), re.M | re.S)[1]
    named = set(re.findall(r"[a-z_]+\.py", tree))
    modules = {p.name for p in (ROOT / "resilient_train").rglob("*.py")
               if p.name not in {"__init__.py", "__main__.py"} and "_site" not in p.parts}
    assert sorted(modules - named) == []
