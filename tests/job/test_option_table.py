"""The options table (each JobConfig field's ``Option``) is the one list of how a job is set.

Every field is settable by exactly the routes its Option names: its flag is parsed by
``run``, ``worker`` and ``python -m resilient_train.runner`` and lands in that field and no
other; its key in a ``--config`` file lands there too; a key the table does not name is
refused. Each check is also run against a copy with one thing added or dropped, to show it fails.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping

import pytest

from resilient_train.cli import _parser
from resilient_train.errors import ConfigError
from resilient_train.job import config
from resilient_train.job.config import JOB_OPTIONS, TOML_KEYS, JobConfig, Option, job_from_args
from resilient_train.runner.process.worker_main import argument_parser as runner_parser

RECIPE = "r.py"
# Flags of a command that are no job option: they steer the command itself (or name the TOML file).
COMMAND_FLAGS = {
    "run": {"-h", "--help", "--config", "--accept-changes", "--verbose"},
    "worker": {"-h", "--help", "--config", "--tf-config-from", "--port-base"},
    "runner": {"-h", "--help", "--config", "--job", "--tf-config-from", "--port-base"},
}
# A value for each key that only a --config file sets (no flag to take a sample from).
TOML_ONLY_SAMPLES = {"progress_every_s": 0.5, "min_workers": 1, "snapshot_capture_every": 40}


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    top = _parser()
    (subparsers,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return {"run": subparsers.choices["run"], "worker": subparsers.choices["worker"], "runner": runner_parser()}


def _disagreements(parser: argparse.ArgumentParser, options: Mapping[str, Option], own: set[str]) -> list[str]:
    """Where ``parser`` and the table ``options`` disagree; [] when every flag of one is a flag of the other."""
    table = {option.flag: name for name, option in options.items() if option.flag is not None}
    found = []
    for action in parser._actions:
        names = {table[flag] for flag in action.option_strings if flag in table}  # --x and its --no-x: one action
        if not action.option_strings or set(action.option_strings) <= own:
            continue
        if not names:
            found.append(f"{action.option_strings[0]} is parsed but no field's Option names it")
        elif names != {action.dest}:
            found.append(f"{action.option_strings[0]} is parsed into args.{action.dest}, not its field {names.pop()}")
    offered = {flag for action in parser._actions for flag in action.option_strings}
    found += [f"{flag} (field {name}) is in the table but not parsed" for flag, name in table.items()
              if flag not in offered]
    positionals = {action.dest for action in parser._actions if not action.option_strings}
    found += [f"field {name} is the command's argument, but the parser has none named {name}"
              for name, option in options.items() if option.argument and name not in positionals]
    return found


def _sample(name: str, option: Option) -> list[str]:
    """Flag and value that set field ``name`` to something other than its default."""
    assert option.flag is not None
    if option.pairs is not None:
        return [option.flag, "k=v"]
    if option.action == "store_true":
        return [option.flag]
    if option.action is argparse.BooleanOptionalAction:
        return ["--no-" + option.flag[2:]]
    if option.choices is not None:
        return [option.flag, next(c for c in option.choices if c != getattr(JobConfig(recipe=RECIPE), name))]
    if option.parse is not None:
        return [option.flag, "6"]  # an integer or seconds; no default is 6, and 2 workers split a batch of 6
    return [option.flag, "0750"]  # text: a run dir, a URL, an address, or an octal mode; "0750" is each


def _parsed(parser: argparse.ArgumentParser, name: str, option: Option) -> tuple[argparse.Namespace, Any]:
    """The arguments of ``RECIPE <sample>`` and the value the field should get from them."""
    args = parser.parse_args([RECIPE, *_sample(name, option)])
    value = getattr(args, name)
    return args, option.pairs(value) if option.pairs is not None else value


def _dropped(parser: argparse.ArgumentParser, options: Mapping[str, Option]) -> list[str]:
    """The flags of ``options`` whose value does not land, through job_from_args, in its field and only there."""
    default = JobConfig(recipe=RECIPE)
    found = []
    for name, option in options.items():
        if option.flag is None:
            continue
        args, value = _parsed(parser, name, option)
        expected = JobConfig(recipe=RECIPE, **{name: value})  # the same value given as a keyword
        assert getattr(expected, name) != getattr(default, name), f"the sample for {name} is its default"
        job = job_from_args(args)
        if job != expected:
            found.append(f"{' '.join(_sample(name, option))} gave {name}={getattr(job, name)!r}, "
                         f"expected {getattr(expected, name)!r}")
    return found


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + " }"
    return repr(value) if isinstance(value, (int, float)) else f'"{value}"'


# ------------------------------------------------------------ the table
def test_every_field_has_an_option_and_the_routes_are_the_ones_of_today():
    assert list(JOB_OPTIONS) == [spec.name for spec in dataclasses.fields(JobConfig)]
    assert TOML_KEYS == {spec.name for spec in dataclasses.fields(JobConfig)}  # every field is a --config key
    without_flag = {name: option.why for name, option in JOB_OPTIONS.items() if option.flag is None}
    assert sorted(without_flag) == ["min_workers", "progress_every_s", "recipe",
                                    "snapshot_capture_every"] and all(without_flag.values())
    assert [name for name, option in JOB_OPTIONS.items() if option.argument] == ["recipe"]
    assert len({option.flag for option in JOB_OPTIONS.values() if option.flag}) == len(JOB_OPTIONS) - 4


def test_a_field_without_an_option_fails_at_import():
    @dataclasses.dataclass(frozen=True)
    class Grown(JobConfig):
        new_knob: int = 0

    with pytest.raises(TypeError, match=r"Grown\.new_knob has no Option; say in its metadata how it is set"):
        config._options_of(Grown)


def test_an_option_without_a_flag_says_why():
    with pytest.raises(ValueError, match="expected the reason it has none"):
        Option()
    with pytest.raises(ValueError, match=r"Received flag='-x'; expected a long flag"):
        Option(flag="-x")


# ------------------------------------------------------------ the flags
@pytest.mark.parametrize("command", ["run", "worker", "runner"])
def test_each_parser_offers_exactly_the_table_flags_into_their_fields(command):
    assert _disagreements(_command_parsers()[command], JOB_OPTIONS, COMMAND_FLAGS[command]) == []


def test_the_parser_check_catches_a_flag_outside_the_table_and_a_table_flag_not_parsed():
    parser = _command_parsers()["run"]
    parser.add_argument("--save-every-epochs", type=int)  # added to the parser, not to the table
    narrowed = {**JOB_OPTIONS, "ps": Option(why="dropped from this copy")}
    widened = {**JOB_OPTIONS, "min_workers": Option(flag="--min-workers")}
    assert _disagreements(parser, narrowed, COMMAND_FLAGS["run"]) == [
        "--ps is parsed but no field's Option names it",
        "--save-every-epochs is parsed but no field's Option names it",
    ]
    assert _disagreements(_command_parsers()["run"], widened, COMMAND_FLAGS["run"]) == [
        "--min-workers (field min_workers) is in the table but not parsed",
    ]


@pytest.mark.parametrize("command", ["run", "worker", "runner"])
def test_every_flag_lands_in_its_field_and_nowhere_else(command):
    assert _dropped(_command_parsers()[command], JOB_OPTIONS) == []


def test_the_landing_check_catches_a_flag_that_is_parsed_and_dropped(monkeypatch):
    parser = _command_parsers()["run"]  # parses --epochs ...
    monkeypatch.setattr(config, "JOB_OPTIONS", {**JOB_OPTIONS, "epochs": Option(why="dropped from this copy")})
    assert _dropped(parser, JOB_OPTIONS) == ["--epochs 6 gave epochs=None, expected 6"]  # ... job_from_args does not


# ------------------------------------------------------------ the --config keys
def test_every_toml_key_lands_in_its_field(tmp_path):
    toml_only = {name for name, option in JOB_OPTIONS.items()
                 if option.toml and option.flag is None and not option.argument}
    assert set(TOML_ONLY_SAMPLES) == toml_only, "a key without a flag needs a sample here"
    parser = _command_parsers()["run"]
    checked = 0
    for name, option in JOB_OPTIONS.items():
        if option.argument:
            value, argv = "other.py", []  # the key instead of the command's argument
        elif option.flag is None:
            value, argv = TOML_ONLY_SAMPLES[name], [RECIPE]
        else:
            value, argv = _parsed(parser, name, option)[1], [RECIPE]
        path = tmp_path / f"{name}.toml"
        path.write_text(f"{name} = {_toml(value)}\n")
        job = job_from_args(parser.parse_args([*argv, "--config", str(path)]))
        expected = JobConfig(**{"recipe": RECIPE, name: value})
        assert job == expected != JobConfig(recipe=RECIPE), name
        checked += 1
    assert checked == len(TOML_KEYS)


def test_a_key_outside_the_table_is_refused_with_every_accepted_key(tmp_path, monkeypatch):
    path = tmp_path / "job.toml"
    path.write_text("wokers = 3\n")
    parser = _command_parsers()["run"]
    with pytest.raises(ConfigError) as refused:
        job_from_args(parser.parse_args([RECIPE, "--config", str(path)]))
    fields = sorted(spec.name for spec in dataclasses.fields(JobConfig))
    assert str(refused.value) == f"Unknown key(s) ['wokers'] in {path}; accepted: {fields}"

    path.write_text("seed = 5\n")  # a field the table makes CLI-only (toml=False) is no --config key
    monkeypatch.setattr(config, "TOML_KEYS", TOML_KEYS - {"seed"})
    with pytest.raises(ConfigError, match=r"Unknown key\(s\) \['seed'\] in .*job\.toml; accepted: \[.*\]"):
        job_from_args(parser.parse_args([RECIPE, "--config", str(path)]))
    assert job_from_args(parser.parse_args([RECIPE, "--seed", "5"])).seed == 5


def test_flags_win_over_the_file_and_pairs_merge_over_its_tables(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('seed = 1\nkeep = 4\n[params]\nlr = "0.1"\nwidth = "8"\n[storage_options]\nanon = true\n')
    parser = _command_parsers()["run"]
    job = job_from_args(parser.parse_args([RECIPE, "--config", str(path), "--seed", "2", "--set", "lr=0.2",
                                           "--storage-option", "client_kwargs.region_name=x"]))
    assert (job.seed, job.keep, dict(job.params)) == (2, 4, {"lr": "0.2", "width": "8"})
    assert dict(job.storage_options) == {"anon": True, "client_kwargs": {"region_name": "x"}}
