"""Run jobs for the chaos suite: the cached reference run, and a job under a scenario's faults.

Every job is a real ``python -m resilient_train run`` process (so the supervisor itself
can be SIGTERMed or SIGKILLed) with real worker processes. The harness arms in-worker
faults through ``RT_FAULTS``, storage faults through ``faulty://`` plus an attempt-scoped
``RT_CHAOS_FAULTFS`` (see ``chaos/faultfs.py``), ticks the :class:`Nemesis`
every ``TICK_S`` while the job runs, runs the job again when a fault took its supervisor
down, and finally checks the invariants (:mod:`resilient_train.chaos.invariants`); the run's
page (``resilient-train report``) is written into its run dir beside ``chaos-result.json``.

A scenario that expects skipped batches (``[expect] skipped``: a poisoned batch, judged
deterministic by the replay and skipped) cannot end with the uninterrupted run's weights: its
digest is compared with a re-run of the same job from nothing under the same faults
(``<run dir>-rerun``), which must skip the same batch and end bit for bit the same, and its
trajectory with the reference's up to the skipped step (invariants 7 and 14).

The reference run (same recipe, workers, epochs, steps, save interval, seed; no faults)
is cached under ``<root>/reference-<key>/`` where ``<key>`` hashes those parameters and
the recipe file's bytes, so repeating scenarios, or the whole catalogue, runs it once.

A scenario with an ``input`` fault runs on ``<run dir>/chaos-recipe.py``, generated here:
the job's recipe with one ``tf.py_function`` gate per batch that pulls the worker's
``input`` faults. The gate is a control dependency, not arithmetic, so the batches and
the weights stay bit-identical and the reference is the job's own recipe's; the file
lives in the run dir, outside the package, so the watchdog sees its frame as the user's
input code, as it would see a real stuck read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_train.chaos.invariants import CheckResult, check_run, recipe_default
from resilient_train.chaos.nemesis import Nemesis
from resilient_train.chaos.scenarios import ExternalFault, Scenario, StorageFaults, WorkerFault, plan
from resilient_train.cluster import entry_points
from resilient_train.commands.run_report import write_report_page
from resilient_train.errors import ConfigError
from resilient_train.rundir.layout import RunDir

__all__ = ["JobSpec", "ScenarioResult", "ensure_reference", "run_scenario", "expectation_problems"]

TICK_S = 0.01
INPUT_FAULT_RECIPE = "chaos-recipe.py"
ORPHAN_WAIT_S = 5.0
FALLBACKS = {"epochs": 1, "steps_per_epoch": 100, "global_batch_size": 32, "save_every_steps": 10}


@dataclass(frozen=True)
class JobSpec:
    """The job parameters a reference digest depends on (plus where storage lives)."""

    recipe: str
    workers: int = 2
    epochs: int | None = None
    steps_per_epoch: int | None = None
    save_every_steps: int | None = None
    seed: int = 0
    storage_base: str | None = None  # None: <run_dir>/checkpoints
    hang_timeout: float | None = None  # None: the job's default (auto); no part of the reference key
    storage_timeout: float | None = None  # None: the job's default; no part of the reference key
    startup_timeout: float | None = None  # None: the job's default; no part of the reference key
    snapshot_every: int | None = None  # --snapshot-every (the memory tier); None: off (argv); no part of the key
    straggler_window: float | None = None  # None: the job's default; no part of the reference key
    # --loss-spike K and --keep N: detection and retention change no weight; no part of the reference key
    loss_spike: float | None = None  # None: off (the job's default)
    keep: int | None = None  # None: the job's default (3)
    straggler_policy: str | None = None  # None: the job's default (warn); no part of the reference key
    strategy: str = "mirrored"  # or "parameter-server" (then ``ps`` parameter servers)
    ps: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"Received workers={self.workers}; expected >= 1")

    def resolved(self) -> "JobSpec":
        """Unset values from the recipe's DEFAULTS (read without importing TensorFlow)."""
        updates = {}
        for key in ("epochs", "steps_per_epoch", "save_every_steps"):
            if getattr(self, key) is None:
                updates[key] = recipe_default(self.recipe, key) or FALLBACKS[key]
        return dataclasses.replace(self, **updates)

    def with_overrides(self, overrides: dict[str, Any]) -> "JobSpec":
        return dataclasses.replace(self, **overrides) if overrides else self

    @property
    def total_steps(self) -> int:
        return int(self.epochs) * int(self.steps_per_epoch)

    def key(self) -> str:
        spec = self.resolved()
        recipe_bytes = Path(spec.recipe).read_bytes() if Path(spec.recipe).is_file() else spec.recipe.encode()
        text = json.dumps({
            "recipe": spec.recipe, "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(),
            "workers": spec.workers, "epochs": spec.epochs, "steps_per_epoch": spec.steps_per_epoch,
            "save_every_steps": spec.save_every_steps, "seed": spec.seed,
            **({"strategy": spec.strategy, "ps": spec.ps} if spec.strategy != "mirrored" else {}),
        }, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def argv(self, run_dir: Path, storage: str) -> list[str]:
        spec = self.resolved()
        flags = []
        for flag, value in (("--hang-timeout", spec.hang_timeout), ("--storage-timeout", spec.storage_timeout),
                            ("--startup-timeout", spec.startup_timeout),
                            ("--straggler-window", spec.straggler_window)):
            if value is not None:
                flags += [flag, f"{value:g}"]
        if spec.loss_spike is not None:
            flags += ["--loss-spike", f"{spec.loss_spike:g}"]
        if spec.keep is not None:
            flags += ["--keep", str(spec.keep)]
        # The memory tier off unless the scenario sets it: with the tier (on by default) a
        # survivor commits a snapshot newer than the last save when a peer dies, so which step
        # a restart restores depends on how far the survivors got, and scenarios pin it.
        flags += ["--snapshot-every", "off" if spec.snapshot_every is None else str(spec.snapshot_every)]
        if spec.straggler_policy is not None:
            flags += ["--straggler-policy", spec.straggler_policy]
        if spec.strategy != "mirrored":
            flags += ["--strategy", spec.strategy, "--ps", str(spec.ps)]
        return [
            sys.executable, "-m", entry_points.CLI, "run", spec.recipe,
            "--run-dir", str(run_dir), "--storage", storage, "--workers", str(spec.workers),
            "--epochs", str(spec.epochs), "--steps-per-epoch", str(spec.steps_per_epoch),
            "--save-every-steps", str(spec.save_every_steps), "--seed", str(spec.seed), *flags,
        ]

    def reference_dir(self, root: Path) -> Path:
        return Path(root) / f"reference-{self.key()}"

    def storage_for(self, run_dir: Path) -> str:
        if self.storage_base is None:
            return str(Path(run_dir).resolve() / "checkpoints")
        return f"{self.storage_base.rstrip('/')}/{run_dir.name}"


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    seed: int
    run_dir: str
    faults: tuple[dict[str, Any], ...]
    faults_injected: int
    faults_planned: int
    exit_codes: tuple[int, ...]
    check: CheckResult
    problems: tuple[str, ...]  # scenario-level: a fault that missed, an expectation not met
    wall_s: float
    rerun: dict[str, Any] | None = None  # a scenario that skips a batch: the re-run (run_dir, exit_code, digest)

    @property
    def passed(self) -> bool:
        return self.check.passed and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "seed": self.seed, "run_dir": self.run_dir,
            "verdict": "PASS" if self.passed else "FAIL",
            "faults": list(self.faults), "faults_injected": self.faults_injected,
            "faults_planned": self.faults_planned, "exit_codes": list(self.exit_codes),
            "restarts": self.check.restarts, "lost_steps": self.check.lost_steps,
            "digest_match": self.check.digest_match, "checkpoints_verified": self.check.checkpoints_verified,
            "problems": list(self.problems), "check": self.check.to_dict(), "wall_s": round(self.wall_s, 1),
            **({"rerun": self.rerun} if self.rerun is not None else {}),
        }


def _run_quiet(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def ensure_reference(spec: JobSpec, root: Path, *, log: Any = None) -> str:
    """The uninterrupted run's weights_sha256, running it once per parameter set."""
    spec = spec.resolved()
    ref_dir = spec.reference_dir(root)
    cached = ref_dir / "reference.json"
    if cached.exists():
        return json.loads(cached.read_text())["weights_sha256"]
    shutil.rmtree(ref_dir, ignore_errors=True)
    ref_dir.mkdir(parents=True)
    if log:
        log(f"reference run {ref_dir.name} ({spec.recipe}, {spec.workers} workers, "
            f"{spec.epochs}x{spec.steps_per_epoch} steps, save every {spec.save_every_steps}, seed {spec.seed})")
    started = time.monotonic()
    proc = _run_quiet(spec.argv(ref_dir, spec.storage_for(ref_dir)), ref_dir / "supervisor.log")
    code = proc.wait()
    summary_path = RunDir(ref_dir).summary
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if code != 0 or summary.get("status") != "completed" or not summary.get("weights_sha256"):
        raise RuntimeError(f"reference run in {ref_dir} failed (exit {code}); see {ref_dir / 'supervisor.log'}")
    record = {"weights_sha256": summary["weights_sha256"], "params": dataclasses.asdict(spec),
              "key": spec.key(), "wall_s": round(time.monotonic() - started, 1)}
    cached.write_text(json.dumps(record, indent=2) + "\n")
    return record["weights_sha256"]


def _fault_env(faults: tuple[Any, ...], base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.pop("RT_FAULTS", None)
    env.pop("RT_FAULTFS", None)
    in_worker = [{k: v for k, v in dataclasses.asdict(f).items() if k != "factor" or f.point in ("slow", "loss_spike")}
                 for f in faults if isinstance(f, WorkerFault)]  # factor: points slow's and loss_spike's only
    if in_worker:
        env["RT_FAULTS"] = json.dumps(in_worker)
    storage: dict[str, Any] = {}
    for fault in faults:
        if isinstance(fault, StorageFaults):
            for attempt in (fault.attempts or ("*",)):
                storage.setdefault(str(attempt), {}).update(dict(fault.spec))
    if storage:
        env["RT_CHAOS_FAULTFS"] = json.dumps(storage)
    return env


_INPUT_FAULT_TEMPLATE = '''"""{base} with a chaos input gate: generated by resilient_train.chaos.harness.

Each batch of the recipe's dataset first passes a tf.py_function that pulls this worker's
``input`` faults (RT_FAULTS, resilient_train.runner.failures.faults.input_gate). It is a control
dependency, not arithmetic: every batch, and so every weight, is the recipe's own.
"""

import importlib.util
import inspect
import os

import numpy as np
import tensorflow as tf

from resilient_train.runner.failures.faults import input_gate

_spec = importlib.util.spec_from_file_location("_chaos_base_recipe", {base!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({{name: value for name, value in vars(_base).items() if not name.startswith("__")}})
build_model = _base.build_model  # named here too: the recipe check reads this file, not the module
build_optimizer = _base.build_optimizer
loss = _base.loss
_gates = {{}}  # one per process: batches are numbered over the process's whole life


def dataset(input_context, epoch, seed, start_step=0):
    if "start_step" in inspect.signature(_base.dataset).parameters:
        data = _base.dataset(input_context, epoch, seed, start_step=start_step)
    else:  # what the runner does for the base recipe: skip, running the skipped batches
        data = _base.dataset(input_context, epoch, seed).skip(start_step)
    rank = input_context.input_pipeline_id
    if rank not in _gates:
        _gates[rank] = input_gate(os.environ, rank=rank)
    read_batch = _gates[rank]

    def _read():
        read_batch()  # the stuck read of an input fault never returns
        return np.int32(0)

    def gate(*batch):
        with tf.control_dependencies([tf.py_function(_read, [], tf.int32)]):
            batch = tf.nest.map_structure(tf.identity, batch)
        return batch if len(batch) > 1 else batch[0]

    return data.map(gate)
'''


def write_input_fault_recipe(run_dir: Path, recipe: str) -> Path:
    """``<run_dir>/chaos-recipe.py``: ``recipe`` with an input gate (see the module docstring)."""
    path = Path(run_dir) / INPUT_FAULT_RECIPE
    path.write_text(_INPUT_FAULT_TEMPLATE.format(base=str(Path(recipe).resolve())))
    return path


def _worker_fault_fired(fault: WorkerFault, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Did the worker pull its own trigger? (its process exited as the fault says)."""
    pid = next((r["pid"] for r in records if r.get("event") == "worker_started"
                and r.get("attempt") == fault.attempt and r.get("rank") == fault.rank), None)
    exit_record = next((r for r in records if r.get("event") == "worker_exited" and r.get("pid") == pid), None)
    if fault.point in ("nan_loss", "loss_spike"):  # the group saw it at that step of that attempt (runner/health/)
        fired = any(r.get("event") == "anomaly_detected" and r.get("global_step") == fault.global_step
                    and (fault.every_attempt or r.get("attempt") == fault.attempt) for r in records)
    elif fault.point == "slow":  # the straggler detector named that rank in that attempt (runner/health/stragglers.py)
        fired = any(r.get("event") == "straggler_detected" and r.get("attempt") == fault.attempt
                    and r.get("rank") == fault.rank for r in records)
    elif fault.point == "bitflip":  # the replicas' comparison found it, at the next check after that step
        fired = any(r.get("event") == "anomaly_detected" and r.get("attempt") == fault.attempt
                    and r.get("kind") == "replicas" and r.get("global_step", 0) > fault.global_step for r in records)
    elif fault.point == "before_join":  # it exits by the reachability check: EXIT_FAILURE, not a signal
        fired = exit_record is not None and exit_record.get("exit_code") == 1
    elif fault.hangs:  # it never exits by itself: it fired when the watchdog found the group hung
        fired = any(r.get("event") == "hang_detected" and r.get("attempt") == fault.attempt for r in records)
    elif exit_record is None:
        fired = False  # e.g. the supervisor was SIGKILLed and never saw the exit
    elif fault.point == "raise":
        fired = exit_record.get("exit_code") == 1
    else:
        fired = exit_record.get("signal") == fault.signal
    return {"fault": fault.describe(), "op": f"rt_faults:{fault.point}", "state": "done" if fired else "missed",
            "pid": pid, "global_step": fault.global_step, "attempt": fault.attempt}


def _throttle_named(fault: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """The straggler detector named the throttled rank in its attempt, after the throttle began."""
    injected = next((r for r in records if r.get("event") == "chaos_fault_injected" and r.get("op") == "throttle_worker"
                     and r.get("rank") == fault.get("rank") and r.get("attempt") == fault.get("attempt")), None)
    return injected is not None and any(
        r.get("event") == "straggler_detected" and r.get("rank") == fault.get("rank")
        and r.get("attempt") == fault.get("attempt") and str(r.get("ts", "")) >= str(injected.get("ts", ""))
        for r in records)


def _storage_fault_fired(fault: StorageFaults, records: list[dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    spec = dict(fault.spec)
    if spec.get("fail_op_k"):
        # Deterministic: every attempt in scope that touched storage must show a retry.
        started = sorted({r["attempt"] for r in records if r.get("event") == "worker_started"})
        scope = [a for a in started if fault.attempts is None or a in fault.attempts]
        retried = {r.get("attempt") for r in records if r.get("event") == "storage_retry"}
        missing = [a for a in scope if a not in retried]
        fired, detail = bool(scope) and not missing, {"attempts_without_retry": missing}
    elif spec.get("transient_rate"):
        retries = sum(1 for r in records if r.get("event") == "storage_retry")
        fired, detail = retries > 0, {"storage_retries": retries}
    elif spec.get("stall_write_k"):
        scope = fault.attempts
        stalls = sum(1 for r in records if r.get("event") == "storage_retry" and "(storage stalled)" in str(r.get("error"))
                     and (scope is None or r.get("attempt") in scope))
        fired, detail = stalls > 0, {"stalled_calls_retried": stalls}
    elif spec.get("stop_after_files") is not None:
        logs = "".join(a.log(0).read_text(errors="replace") for a in RunDir(run_dir).attempts() if a.log(0).exists())
        fired, detail = "SimulatedCrash" in logs, {}
    else:
        fired, detail = True, {}  # latency: always in effect
    return {"fault": fault.describe(), "op": "faulty_storage", "state": "done" if fired else "missed", **detail}


def run_scenario(
    scenario: Scenario,
    spec: JobSpec,
    *,
    seed: int,
    root: Path,
    reference: str | None,
    max_invocations: int = 4,
    timeout_s: float = 600.0,
) -> ScenarioResult:
    """Run ``scenario`` once (seeded), check it, return the result (never raises for a bad run).

    A parameter-server scenario is not bit-identical to any run: ``reference`` is not used
    (the checker's parameter-server mode checks the tier's guarantees instead).
    """
    job = spec.with_overrides(scenario.overrides).resolved()  # the scenario's [job] may set workers too
    planned = plan(scenario, seed, scenario.ranks(job.workers))
    reference_run: Path | None = job.reference_dir(root)
    expected_ps_kills = None
    if planned.parameter_server:
        reference, reference_run = None, None
        expected_ps_kills = {f.trigger.attempt or 1: int(f.rank) for f in planned.faults
                             if isinstance(f, ExternalFault) and f.op == "sigkill_worker"}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(root) / f"{planned.name}-s{seed}-{stamp}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    if planned.input_faults:
        job = dataclasses.replace(job, recipe=str(write_input_fault_recipe(run_dir, job.recipe)))
    has_storage_faults = any(isinstance(f, StorageFaults) for f in planned.faults)
    plain_storage = job.storage_for(run_dir)
    storage = ("faulty://" + plain_storage) if has_storage_faults else plain_storage
    (run_dir / "chaos-plan.json").write_text(json.dumps({
        "scenario": planned.name, "seed": seed, "summary": planned.summary,
        "faults": [f.describe() for f in planned.faults], "job": dataclasses.asdict(job), "storage": storage,
    }, indent=2) + "\n")
    env = _fault_env(planned.faults, dict(os.environ))
    external = [f for f in planned.faults if isinstance(f, ExternalFault)]
    supervisor: dict[str, subprocess.Popen | None] = {"proc": None}
    nemesis = Nemesis(
        run_dir, external, storage_url=plain_storage, steps_per_epoch=int(job.steps_per_epoch),
        rng=random.Random(f"nemesis:{planned.name}:{seed}"),
        supervisor_pid=lambda: supervisor["proc"].pid if supervisor["proc"] else None,
    )
    problems: list[str] = []
    exit_codes: list[int] = []
    started = time.monotonic()
    deadline = started + timeout_s
    for invocation in range(1, max_invocations + 1):
        proc = _run_quiet(job.argv(run_dir, storage), run_dir / f"supervisor-{invocation}.log", env)
        supervisor["proc"] = proc
        supervisor_faults_before = nemesis.armed_supervisor_faults()
        while proc.poll() is None:
            nemesis.poll()
            if time.monotonic() > deadline:
                problems.append(f"timeout: the job ran past {timeout_s:.0f} s; killed")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(TICK_S)
        nemesis.poll()
        exit_codes.append(proc.returncode)
        if problems:
            break
        supervisor_killed = nemesis.armed_supervisor_faults() and not supervisor_faults_before
        if supervisor_killed and proc.returncode not in (143, -signal.SIGKILL):
            problems.append(f"supervisor invocation {invocation} exited {proc.returncode} after being signalled; "
                            "expected 143 (SIGTERM) or -9 (SIGKILL)")
        if proc.returncode == 0 or not supervisor_killed:
            break
        _wait_workers_gone(run_dir, ORPHAN_WAIT_S, problems)
    nemesis.finish()
    wall = time.monotonic() - started

    from resilient_train.chaos.invariants import load_events

    records = load_events(RunDir(run_dir).events)
    faults = nemesis.results()
    for fault in planned.faults:
        if isinstance(fault, WorkerFault):
            faults.append(_worker_fault_fired(fault, records))
        elif isinstance(fault, StorageFaults):
            faults.append(_storage_fault_fired(fault, records, run_dir))
    for fault in faults:
        if fault["state"] != "done":
            problems.append(f"fault not injected: {fault['fault']} ({fault['state']})")
        elif fault.get("op") == "throttle_worker" and not _throttle_named(fault, records):
            problems.append(f"rank {fault.get('rank')} throttled in attempt {fault.get('attempt')} ({fault['fault']}) "
                            "was not named by the straggler detector (no straggler_detected for it after the throttle)")
        if fault.get("op") == "corrupt_newest" and fault.get("state") == "done" and not fault.get("verify_exact"):
            problems.append(
                f"verify after corrupting checkpoint {fault.get('global_step')} ({fault.get('file')}) reported "
                f"exit {fault.get('verify_exit')}, bad {fault.get('verify_bad')}; expected exactly that corruption"
            )
    rerun: dict[str, Any] | None = None
    if planned.reruns and not problems and exit_codes[-1:] == [0]:
        # A skipped batch changes the weights: the reference is the same job run again, from
        # nothing, under the same faults (it must skip the same batch and end bit for bit the same).
        rerun = _rerun(job, run_dir, env, faulty=has_storage_faults, timeout_s=timeout_s)
        if rerun["exit_code"] != 0 or not rerun["weights_sha256"]:
            problems.append(f"the re-run of the same job ({rerun['run_dir']}) exited {rerun['exit_code']} with "
                            f"weights_sha256 {rerun['weights_sha256']}; expected 0 and a digest")
        problems.extend(f"re-run: {line}" for line in expectation_problems(planned, rerun["records"]))
        reference = rerun["weights_sha256"]
    check = check_run(run_dir, reference, exit_code=exit_codes[-1] if exit_codes else None,
                      save_every=job.save_every_steps, expected_hangs=planned.expected_hangs,
                      stalled_attempts=planned.stalled_attempts, expected_unreachable=planned.expected_unreachable,
                      expected_ps_kills=expected_ps_kills, check_finite=True if planned.numerical else None,
                      reference_run=reference_run if reference_run is not None and reference_run.is_dir() else None)
    if planned.expect_restored is not None and check.restored_steps != planned.expect_restored:
        problems.append(f"expected restored steps {list(planned.expect_restored)}, got {list(check.restored_steps)}")
    if planned.expect_skipped is not None and check.skipped_steps != planned.expect_skipped:
        problems.append(f"expected skipped batches at global steps {list(planned.expect_skipped)}, got "
                        f"{list(check.skipped_steps)} (replay_verdict action skip)")
    problems.extend(expectation_problems(planned, records))
    result = ScenarioResult(
        scenario=planned.name, seed=seed, run_dir=str(run_dir), faults=tuple(faults),
        faults_injected=sum(1 for f in faults if f["state"] == "done"), faults_planned=len(faults),
        exit_codes=tuple(exit_codes), check=check, problems=tuple(problems), wall_s=wall,
        rerun={k: v for k, v in rerun.items() if k != "records"} if rerun is not None else None,
    )
    (run_dir / "chaos-result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    _write_page(run_dir)
    return result


def _rerun(job: JobSpec, run_dir: Path, env: dict[str, str], *, faulty: bool, timeout_s: float) -> dict[str, Any]:
    """The same job from nothing in ``<run_dir>-rerun`` (own storage), with the same in-worker
    and storage faults (``env``); no external fault (a scenario that reruns has none)."""
    from resilient_train.chaos.invariants import load_events

    rerun_dir = run_dir.parent / f"{run_dir.name}-rerun"
    shutil.rmtree(rerun_dir, ignore_errors=True)
    rerun_dir.mkdir(parents=True)
    storage = job.storage_for(rerun_dir)
    proc = _run_quiet(job.argv(rerun_dir, ("faulty://" + storage) if faulty else storage),
                      rerun_dir / "supervisor-1.log", env)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    try:
        digest = json.loads(RunDir(rerun_dir).summary.read_text()).get("weights_sha256")
    except (OSError, ValueError):
        digest = None
    return {"run_dir": str(rerun_dir), "exit_code": code, "weights_sha256": digest,
            "records": load_events(RunDir(rerun_dir).events)}


def _matches(expected: Any, actual: Any) -> bool:
    """``actual`` has every field of ``expected`` (tables: recursively) with the same value."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(_matches(v, actual.get(k)) for k, v in expected.items())
    return expected == actual


def expectation_problems(scenario: Scenario, records: list[dict[str, Any]]) -> list[str]:
    """``[[expect.events]]``: for each event name listed, the run's events of that name, in order,
    are exactly as many as listed and each has the listed fields (docs: chaos/README.md)."""
    problems = []
    for name in dict.fromkeys(e["event"] for e in scenario.expect_events):
        expected = [{k: v for k, v in e.items() if k != "event"} for e in scenario.expect_events if e["event"] == name]
        found = [r for r in records if r.get("event") == name]
        if len(found) != len(expected) or not all(_matches(e, r) for e, r in zip(expected, found)):
            keys = list(dict.fromkeys(k for e in expected for k in e))
            shown = [{k: r.get(k) for k in keys} for r in found]
            problems.append(f"expected {len(expected)} {name} event(s) {expected}, got {len(found)}: {shown}")
    return problems


def _write_page(run_dir: Path) -> None:
    """``<run dir>/report.html`` beside chaos-result.json: the run as a page (commands/run_report.py);
    a run whose supervisor never wrote an event has none."""
    try:
        write_report_page(run_dir)
    except ConfigError:
        pass  # no events.jsonl: nothing to draw (chaos-result.json says what happened)


def _wait_workers_gone(run_dir: Path, wait_s: float, problems: list[str]) -> None:
    """After the supervisor died: its workers must follow it (parent-death signal)."""
    import psutil

    from resilient_train.chaos.invariants import load_events

    pids = [r["pid"] for r in load_events(RunDir(run_dir).events) if r.get("event") == "worker_started"]
    deadline = time.monotonic() + wait_s
    while True:
        alive = [pid for pid in pids if _is_live_worker(pid, psutil)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if alive:
        problems.append(f"orphans: workers {alive} outlived their supervisor by {wait_s:.0f} s; killed them")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _is_live_worker(pid: int, psutil: Any) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and "resilient_train" in " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
