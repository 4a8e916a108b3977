"""``python -m resilient_train.chaos``: list scenarios, run them, soak, or check a run directory.

    python -m resilient_train.chaos list [--catalogue DIR]
    python -m resilient_train.chaos run SCENARIO... | --all  [--catalogue DIR] [--recipe R] [--seed S] [--workers N]
                                                             [--storage URL]
    python -m resilient_train.chaos soak --minutes M --seed S
    python -m resilient_train.chaos check RUN_DIR --reference DIGEST [--reference-run DIR] [--exit-code N]
                                          [--save-every K] [--json]

A SCENARIO is a name from the catalogue (``chaos/scenarios/<name>.toml`` of the clone, or
``--catalogue DIR`` / ``$RT_CHAOS_SCENARIOS``: resilient_train/chaos/catalogue.py) or the path
of a scenario file (``*.toml``, the format in chaos/README.md). At the root of a checkout,
``python -m chaos`` is this command (chaos/__main__.py hands it the command line unchanged).

Exit codes: 0 every scenario (or the checked run) passed, 1 at least one failed,
2 bad command line or scenario file (one line per mistake, nothing ran).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from resilient_train.errors import EXIT_USAGE

__all__ = ["main"]

DEFAULT_RECIPE = "recipes/linear_regression.py"
DEFAULT_ROOT = Path("runs/chaos")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m resilient_train.chaos", description="Fault injection for resilient-train jobs.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)

    def catalogue_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--catalogue", metavar="DIR", help="the scenario files' directory (default: $RT_CHAOS_SCENARIOS, "
                       "else chaos/scenarios of the clone)")

    catalogue_flag(sub.add_parser("list", allow_abbrev=False, help="the scenarios, one line each"))

    def job_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"recipe file (default {DEFAULT_RECIPE})")
        p.add_argument("--seed", type=int, default=0, help="seeds the fault plan and the job (default 0)")
        p.add_argument("--workers", type=int, default=2)
        p.add_argument("--epochs", type=int, help="default: the recipe's")
        p.add_argument("--steps-per-epoch", type=int, help="default: the recipe's")
        p.add_argument("--save-every-steps", type=int, help="default: the recipe's (a scenario may override)")
        p.add_argument("--storage", metavar="URL", help="base storage URL; each run gets URL/<run name> "
                       "(default: <run dir>/checkpoints)")
        p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"where runs go (default {DEFAULT_ROOT})")
        p.add_argument("--report", type=Path, help="default: <root>/chaos-report.json")

    run = sub.add_parser("run", allow_abbrev=False, help="run scenarios and check their invariants")
    run.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="a catalogue name or a scenario file (*.toml)")
    run.add_argument("--all", action="store_true", help="every scenario of the catalogue")
    catalogue_flag(run)
    job_flags(run)
    soak = sub.add_parser("soak", allow_abbrev=False, help="random faults from the whole catalogue until time runs out")
    soak.add_argument("--minutes", type=float, required=True)
    job_flags(soak)
    check = sub.add_parser("check", allow_abbrev=False, help="check the invariants on a finished run directory")
    check.add_argument("run_dir", type=Path)
    check.add_argument("--reference", metavar="DIGEST", help="weights_sha256 of the uninterrupted run (required, "
                       "except for a --strategy parameter-server run, which is not bit-identical to any)")
    check.add_argument("--reference-run", type=Path, metavar="DIR",
                       help="the reference's run dir: compare committed steps with `resilient-train diff`")
    check.add_argument("--exit-code", type=int, help="the job's exit code, when known")
    check.add_argument("--save-every", type=int, help="default: the run's job.json")
    check.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    check.add_argument("--no-orphans", action="store_true", help="skip the live-process check (run copied elsewhere)")
    check.add_argument("--json", action="store_true")
    return parser


def _spec(args: argparse.Namespace, *, check_recipe: bool = True):
    from resilient_train.chaos.harness import JobSpec

    if check_recipe and not Path(args.recipe).is_file():
        raise ValueError(f"Received --recipe {args.recipe!r}; expected a recipe file, e.g. {DEFAULT_RECIPE}")
    return JobSpec(recipe=args.recipe, workers=args.workers, epochs=args.epochs,
                   steps_per_epoch=args.steps_per_epoch, save_every_steps=args.save_every_steps,
                   seed=args.seed, storage_base=args.storage)


def _log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _run_all(scenarios, spec, args, seeds) -> int:
    from resilient_train.chaos.harness import ensure_reference, run_scenario
    from resilient_train.chaos.report import table, write_report

    results, references = [], {}
    for scenario, seed in zip(scenarios, seeds):
        job = spec.with_overrides(scenario.overrides)
        key = job.key()
        if key not in references and not scenario.parameter_server:  # a ps run has no reference digest
            references[key] = ensure_reference(job, args.root, log=_log)
        _log(f"{scenario.name} (seed {seed}): {scenario.summary}")
        result = run_scenario(scenario, spec, seed=seed, root=args.root, reference=references.get(key))
        _log(f"{scenario.name}: {'PASS' if result.passed else 'FAIL'} in {result.wall_s:.1f} s "
             f"(restarts {result.check.restarts}, lost steps {result.check.lost_steps}) -> {result.run_dir}")
        results.append(result)
        if getattr(args, "deadline", None) and time.monotonic() > args.deadline:
            break
    report_path = args.report or args.root / "chaos-report.json"
    write_report(report_path, results, spec=spec, reference=references, command=sys.argv)
    print(table(results))
    print(f"report: {report_path}")
    return 0 if all(r.passed for r in results) else 1


def _error(message: str) -> int:
    """One ``chaos: error:`` line per line of ``message`` (a scenario file's mistakes), exit 2."""
    for line in message.splitlines():
        print(f"chaos: error: {line}", file=sys.stderr)
    return EXIT_USAGE


def _scenarios(args: argparse.Namespace):
    """The scenarios ``run`` names (or --all), every mistake of every file reported before anything runs."""
    from resilient_train.chaos.catalogue import catalogue_dir, is_path, load_catalogue, resolve
    from resilient_train.errors import ConfigError

    if args.all == bool(args.scenarios):
        raise ValueError("expected scenario names or files, or --all (not both); see `python -m resilient_train.chaos list`")
    if args.workers < 1:
        raise ValueError(f"Received --workers {args.workers}; expected >= 1")
    if args.all:
        return list(load_catalogue(catalogue_dir(args.catalogue), workers=args.workers))
    directory = None if all(is_path(name) for name in args.scenarios) else catalogue_dir(args.catalogue)
    scenarios, mistakes = [], []
    for reference in args.scenarios:
        try:
            scenarios.append(resolve(reference, directory, workers=args.workers))
        except ConfigError as exc:
            mistakes.append(str(exc))
    if mistakes:
        raise ConfigError("\n".join(mistakes))
    return scenarios


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    if args.command == "list":
        from resilient_train.chaos.catalogue import catalogue_dir, load_catalogue

        try:
            directory = catalogue_dir(args.catalogue)
            scenarios = load_catalogue(directory)
        except ValueError as exc:
            return _error(str(exc))
        print(f"# {directory} ({len(scenarios)} scenarios; run one by name or by its file's path)")
        width = max((len(s.name) for s in scenarios), default=0)
        for scenario in scenarios:
            print(f"{scenario.name.ljust(width)}  {'[ci] ' if scenario.ci else ''}{scenario.summary}")
        return 0
    if args.command == "check":
        from resilient_train.chaos.invariants import check_run, is_parameter_server, render
        from resilient_train.checkpoint import parse_storage_options

        if args.reference is None and not is_parameter_server(args.run_dir):
            return _error(f"--reference DIGEST is required for {args.run_dir} (a MultiWorkerMirroredStrategy "
                          "run); only a --strategy parameter-server run is checked without one")

        result = check_run(args.run_dir, args.reference, exit_code=args.exit_code, save_every=args.save_every,
                           storage_options=parse_storage_options(args.storage_option),
                           check_orphans=not args.no_orphans, reference_run=args.reference_run)
        print(json.dumps(result.to_dict(), indent=2) if args.json else render(result))
        return 0 if result.passed else 1
    try:
        if args.command == "run":
            scenarios = _scenarios(args)
            spec = _spec(args, check_recipe=any("recipe" not in s.overrides for s in scenarios))
            return _run_all(scenarios, spec, args, [args.seed] * len(scenarios))
        spec = _spec(args)
        # soak
        from resilient_train.chaos.scenarios import random_scenario

        if args.minutes <= 0:
            raise ValueError(f"Received --minutes {args.minutes}; expected > 0")
        rng = random.Random(args.seed)
        resolved = spec.resolved()
        args.deadline = time.monotonic() + args.minutes * 60
        scenarios = [random_scenario(rng, i, total_steps=resolved.total_steps,
                                     save_every=int(resolved.save_every_steps)) for i in range(1, 1000)]
        seeds = [rng.randrange(10_000) for _ in scenarios]
        _log(f"soak for {args.minutes} min, seed {args.seed}")
        return _run_all(scenarios, spec, args, seeds)
    except (ValueError, KeyError) as exc:
        return _error(str(exc.args[0] if isinstance(exc, KeyError) else exc))


if __name__ == "__main__":
    sys.exit(main())
