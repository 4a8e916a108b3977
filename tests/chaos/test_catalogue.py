"""The catalogue's files (chaos/scenarios/*.toml): the same scenarios as before, found, run by name or path, validated.

``BEFORE`` is the Python catalogue exactly as resilient_train/chaos/scenarios.py defined it
until the catalogue moved into TOML files (issue 31, item 7): every file must load to the
very same frozen dataclasses, so no scenario's faults, job or expectations changed. The one
rename (``seed-kill-chief-at-7`` -> ``kill-chief-at-7``, the issue's name) is stated, and the
old name still runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_train.chaos.__main__ import main
from resilient_train.chaos.catalogue import (
    CATALOGUE_ENV, RENAMED, by_name, catalogue_dir, catalogue_names, load_catalogue, load_scenario, resolve,
)
from resilient_train.chaos.scenarios import (
    HANG, PARAMETER_SERVER, ExternalFault, Scenario, StorageFaults, Trigger, WorkerFault,
)
from resilient_train.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CATALOGUE_DIR = REPO / "chaos" / "scenarios"
RECIPE = str(REPO / "recipes" / "linear_regression.py")

_PS_JOB = (("strategy", PARAMETER_SERVER), ("ps", 1), ("epochs", 2), ("steps_per_epoch", 50), ("save_every_steps", 10))
# The Python catalogue as of e89d77a (resilient_train/chaos/scenarios.py's CATALOGUE), verbatim.
BEFORE: tuple[Scenario, ...] = (
    Scenario(
        "seed-kill-chief-at-7",
        "the seeds' experiment: checkpoint every step, kill -9 the chief at global step 7; resumes from 7",
        (WorkerFault("after_commit", 7, rank=0),),
        job=(("save_every_steps", 1),),
        expect_restored=(7,),
        ci=True,
    ),
    Scenario(
        "kill-chief-mid-epoch",
        "kill -9 the chief from outside after the 2nd commit, mid-epoch",
        (ExternalFault("sigkill_worker", Trigger(nth=2), rank="chief"),),
        ci=True,
    ),
    Scenario(
        "kill-random-worker",
        "kill -9 a seeded-random worker after a seeded-random commit (1st-3rd), mid-epoch",
        (ExternalFault("sigkill_worker", Trigger(nth="random"), rank="random"),),
    ),
    Scenario(
        "kill-before-commit",
        "the chief is killed -9 with step 13's checkpoint written locally, nothing uploaded",
        (WorkerFault("before_commit", 13, rank=0),),
        job=(("save_every_steps", 1),),
    ),
    Scenario(
        "kill-during-slow-upload",
        "slow storage (50 ms/op); kill -9 the chief while the 3rd checkpoint's files are half uploaded",
        (StorageFaults.of(attempts=(1,), latency_s=0.05),
         ExternalFault("sigkill_during_upload", Trigger(nth=2, mid_epoch=False))),
    ),
    Scenario(
        "sigterm-worker",
        "SIGTERM rank 1 after the 1st commit, mid-epoch: agreed save, zero lost steps",
        (ExternalFault("sigterm_worker", Trigger(nth=1), rank=1),),
        ci=True,
    ),
    Scenario(
        "sigterm-supervisor-rerun",
        "SIGTERM the supervisor after the 2nd commit, mid-epoch (exit 143), then run the job again",
        (ExternalFault("sigterm_supervisor", Trigger(nth=2)),),
    ),
    Scenario(
        "sigkill-supervisor-rerun",
        "kill -9 the supervisor after the 2nd commit, mid-epoch; workers must die with it; run again",
        (ExternalFault("sigkill_supervisor", Trigger(nth=2)),),
    ),
    Scenario(
        "storage-transient-errors",
        "every storage operation of every attempt fails transiently with probability 0.1 (seeded)",
        (StorageFaults.of(attempts=None, transient_rate=0.1),),
    ),
    Scenario(
        "storage-torn-upload",
        "the chief's uploads stop after 5 files (SimulatedCrash): ckpt-10 is left without its manifest; restore skips it",
        (StorageFaults.of(attempts=(1,), stop_after_files=5),),
    ),
    Scenario(
        "storage-slow",
        "slow storage (30 ms per operation) in every attempt, plus one kill -9 of the chief",
        (StorageFaults.of(attempts=None, latency_s=0.03), WorkerFault("after_step", 17, rank=0)),
    ),
    Scenario(
        "corrupt-newest-between-attempts",
        "kill -9 the chief right after committing step 25; flip a byte in ckpt-25 before attempt 2 restores",
        (WorkerFault("after_commit", 25, rank=0),
         ExternalFault("corrupt_newest", Trigger(event="gang_restart", nth=1, attempt=None, mid_epoch=False))),
    ),
    Scenario(
        "raise-in-step",
        "an exception in the chief's step 12 (a recipe bug that happens once)",
        (WorkerFault("raise", 12, rank=0),),
    ),
    Scenario(
        "multi-fault",
        "transient storage errors in every attempt (each worker's 2nd operation, then p=0.1 seeded) "
        "+ kill -9 the chief at step 8 + SIGTERM a random worker in attempt 2",
        (StorageFaults.of(attempts=None, fail_op_k=2, transient_rate=0.1),
         WorkerFault("after_step", 8, rank=0),
         ExternalFault("sigterm_worker", Trigger(nth=2, attempt=2), rank="random")),
    ),
    Scenario(
        "hang-input",
        "a random worker's input blocks forever at its 18th batch read (mid epoch 2) on attempt 1, a stuck "
        "read: the watchdog (10 s) names that rank, the group restarts",
        (WorkerFault("input", 18, rank="random", signal=HANG),),
        job=(("hang_timeout", 10),),
    ),
    Scenario(
        "hang-collective",
        "a random worker stops calling the training step after the call that finished step 12 on attempt 1, "
        "process and heartbeats alive (its peers wait in the collective): the watchdog (10 s) names it",
        (WorkerFault("after_step", 12, rank="random", signal=HANG),),
        job=(("hang_timeout", 10),),
    ),
    Scenario(
        "stalled-storage",
        "the store goes quiet for good from the chief's 3rd upload on attempt 1 (the 2nd checkpoint): each call is "
        "given up after 1 s without progress, retried, and the save fails; the group restarts from the 1st commit",
        (StorageFaults.of(attempts=(1,), stall_write_k=3, stall_count=0),),
        job=(("storage_timeout", 1),),
    ),
    Scenario(
        "never-joins",
        "a random worker cannot reach its peers at start-up on attempt 1 (it probes closed ports): it fails within "
        "half the start-up timeout (30 s), naming itself and the address; attempt 2 completes",
        (WorkerFault("before_join", 0, rank="random"),),
        job=(("startup_timeout", 30),),
    ),
    Scenario(
        "ps-kill",
        "parameter-server tier (2 workers, 1 ps): kill -9 the ps after the 2nd commit, mid-epoch; coordinator and ps "
        "restart and restore the last commit",
        (ExternalFault("sigkill_worker", Trigger(nth=2), rank=1),),
        job=_PS_JOB,
    ),
    Scenario(
        "ps-worker-kill",
        "parameter-server tier (2 workers, 1 ps): kill -9 a seeded-random worker after the 1st commit, mid-epoch; "
        "it is restarted in place, training goes on without a restore",
        (ExternalFault("sigkill_worker", Trigger(nth=1), rank="ps-worker"),),
        job=_PS_JOB,
    ),
)


def test_the_toml_catalogue_is_exactly_the_python_catalogue_it_replaced() -> None:
    loaded = {s.name: s for s in load_catalogue(CATALOGUE_DIR)}
    before = {RENAMED.get(s.name, s.name): s for s in BEFORE}
    assert len(before) == 20 and set(before) <= set(loaded)
    assert sorted(set(loaded) - set(before)) == [  # added since (issue 32 item 6; issues 48 and 49)
        "bitflip-once", "loss-spike", "nan-batch", "nan-once", "rescue-chief-killed-between-saves",
        "rescue-hang-between-saves",
        "rescue-rank-killed-between-saves", "slow-worker", "throttle-worker", "throttle-worker-replace"]
    for name, scenario in before.items():
        renamed = Scenario(name, scenario.summary, scenario.faults, scenario.job, scenario.expect_restored, scenario.ci)
        assert loaded[name] == renamed, name  # every field: summary, faults (in order), job, expectations, ci
        assert loaded[name].job == scenario.job  # and the job overrides in their order
    assert RENAMED == {"seed-kill-chief-at-7": "kill-chief-at-7"}
    assert by_name("seed-kill-chief-at-7", CATALOGUE_DIR) == loaded["kill-chief-at-7"]


def test_a_few_scenarios_field_by_field() -> None:
    seed = by_name("kill-chief-at-7", CATALOGUE_DIR)
    assert (seed.faults, seed.job, seed.expect_restored, seed.ci) == (
        (WorkerFault("after_commit", 7, rank=0, attempt=1, signal="SIGKILL"),), (("save_every_steps", 1),), (7,), True)
    multi = by_name("multi-fault", CATALOGUE_DIR)
    assert multi.faults == (
        StorageFaults(spec=(("fail_op_k", 2), ("transient_rate", 0.1)), attempts=None),
        WorkerFault("after_step", 8, rank=0),
        ExternalFault("sigterm_worker", Trigger(event="checkpoint_committed", nth=2, attempt=2, mid_epoch=True),
                      rank="random"),
    )
    corrupt = by_name("corrupt-newest-between-attempts", CATALOGUE_DIR).faults[1]
    assert corrupt == ExternalFault("corrupt_newest", Trigger(event="gang_restart", nth=1, attempt=None, mid_epoch=False))
    assert by_name("hang-input", CATALOGUE_DIR).faults == (WorkerFault("input", 18, rank="random", signal=HANG),)
    assert by_name("ps-kill", CATALOGUE_DIR).job == _PS_JOB
    for name, rank in (("rescue-chief-killed-between-saves", "chief"), ("rescue-rank-killed-between-saves", 1)):
        rescue = by_name(name, CATALOGUE_DIR)
        assert (rescue.faults, rescue.job, rescue.expect_restored) == (
            (WorkerFault("after_step", 17, rank=rank),), (("save_every_steps", 50), ("snapshot_every", 3)), (16,))
    slow = by_name("slow-worker", CATALOGUE_DIR)
    assert (slow.faults, slow.job) == ((WorkerFault("slow", 0, rank=1, factor=3),), (
        ("recipe", "recipes/digits_cnn.py"), ("epochs", 1), ("steps_per_epoch", 150), ("save_every_steps", 50), ("straggler_window", 3)))
    assert slow.faults[0].describe() == "rank 1 3x slower after step 0 (attempt 1)"
    throttle = by_name("throttle-worker", CATALOGUE_DIR)
    assert (throttle.faults, throttle.job) == (
        (ExternalFault("throttle_worker", Trigger(event="first_step", nth=1, attempt=1, mid_epoch=True), rank=1,
                       stop_ms=50, run_ms=50),),
        (("recipe", "recipes/digits_cnn.py"), ("epochs", 1), ("steps_per_epoch", 1500), ("save_every_steps", 500),
         ("straggler_window", 6)))
    replace = by_name("throttle-worker-replace", CATALOGUE_DIR)
    assert (replace.faults, replace.job) == (throttle.faults, (
        ("recipe", "recipes/digits_cnn.py"), ("epochs", 1), ("steps_per_epoch", 4000), ("save_every_steps", 1000),
        ("straggler_window", 6), ("straggler_policy", "replace")))
    hang = by_name("rescue-hang-between-saves", CATALOGUE_DIR)
    assert (hang.faults, hang.job, hang.expect_restored) == (
        (WorkerFault("after_step", 17, rank=1, signal=HANG),),
        (("save_every_steps", 50), ("snapshot_every", 3), ("hang_timeout", 10)), (16,))


def test_the_numerical_scenarios_field_by_field() -> None:
    # issue 48 item 5: a NaN batch at a fixed step and a poisoned batch that spikes the loss, both in
    # every attempt (deterministic: skipped, the digest compared with a re-run); a NaN once and a flip.
    nan = by_name("nan-batch", CATALOGUE_DIR)
    assert nan.faults == (WorkerFault("nan_loss", 12, rank=1, attempt="all"),)
    assert nan.faults[0].describe() == "NaN loss on rank 1 at step 12 (every attempt: a poisoned batch)"
    assert (nan.job, nan.expect_restored, nan.expect_skipped, nan.reruns, nan.numerical) == (
        (("epochs", 3), ("steps_per_epoch", 10), ("save_every_steps", 5), ("keep", 100)), (10, 10), (12,), True, True)
    assert [(e["event"], e["global_step"], e.get("attempt")) for e in nan.expect_events] == [
        ("anomaly_detected", 12, 1), ("rolled_back", 10, 2), ("replay_verdict", 12, 2), ("batch_skipped", 12, 3)]
    assert nan.expect_events[0] == {"event": "anomaly_detected", "kind": "nonfinite", "global_step": 12, "epoch": 1,
                                    "step_in_epoch": 1, "replicas": 1, "values": {"loss": "nan"},
                                    "action": "rollback", "attempt": 1}
    spike = by_name("loss-spike", CATALOGUE_DIR)
    assert spike.faults == (WorkerFault("loss_spike", 130, rank=1, attempt="all", factor=10000),)
    assert spike.faults[0].describe() == "a 10000x loss on rank 1 at step 130 (every attempt: a poisoned batch)"
    assert (spike.job, spike.expect_restored, spike.expect_skipped) == (
        (("epochs", 2), ("steps_per_epoch", 80), ("save_every_steps", 20), ("loss_spike", 10), ("keep", 100)),
        (120, 120), (130,))
    assert [(e["event"], e.get("kind"), e["global_step"], e.get("verdict"), e.get("attempt"))
            for e in spike.expect_events] == [
        ("anomaly_detected", "spike", 130, None, 1), ("rolled_back", None, 120, None, 2),
        ("replay_verdict", None, 130, "deterministic", 2), ("batch_skipped", None, 130, None, 3)]
    once = by_name("nan-once", CATALOGUE_DIR)
    assert (once.faults, once.reruns, once.numerical) == ((WorkerFault("nan_loss", 12, rank=1, attempt=1),), False, True)


def test_the_ci_scenarios_are_the_catalogues() -> None:
    from tests.chaos import test_ci_scenarios as ci

    assert ci.CATALOGUE_DIR == CATALOGUE_DIR and ci.by_name is by_name
    assert set(ci.CI_NAMES) <= set(catalogue_names(CATALOGUE_DIR))
    assert {s.name for s in load_catalogue(CATALOGUE_DIR) if s.ci} == {"kill-chief-at-7", "kill-chief-mid-epoch",
                                                                      "sigterm-worker"}
    source = Path(ci.__file__).read_text()
    assert '_run("kill-chief-at-7", CI_SPEC' in source and '_run("sigterm-worker", CI_SPEC' in source


def test_the_catalogue_is_a_plain_directory_of_toml_files_not_a_package() -> None:
    assert not (REPO / "chaos" / "__init__.py").exists() and not (CATALOGUE_DIR / "__init__.py").exists()
    assert [p.name for p in (REPO / "chaos").rglob("*.py")] == ["__main__.py"]  # `python -m chaos`, nothing else
    assert sorted(p.suffix for p in CATALOGUE_DIR.iterdir()) == [".toml"] * 30


def test_run_by_path_loads_the_same_scenario_as_run_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_file = resolve(str(CATALOGUE_DIR / "sigterm-worker.toml"))
    assert by_file == resolve("sigterm-worker", CATALOGUE_DIR)
    assert by_file.source == str(CATALOGUE_DIR / "sigterm-worker.toml")
    copy = tmp_path / "my-sigterm.toml"  # a user's copy, extended without touching the package
    copy.write_text((CATALOGUE_DIR / "sigterm-worker.toml").read_text().replace("nth = 1", "nth = 2"))
    mine = resolve(str(copy))
    assert mine.name == "my-sigterm" and mine.faults[0].trigger.nth == 2
    monkeypatch.chdir(tmp_path)
    assert resolve("my-sigterm.toml") == mine  # a bare file name ending in .toml is a path, not a catalogue name


def test_where_the_catalogue_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    assert catalogue_dir(environ={}) == CATALOGUE_DIR  # next to the package: this clone
    assert catalogue_dir(str(mine), environ={CATALOGUE_ENV: "/nowhere"}) == mine  # the flag first
    assert catalogue_dir(environ={CATALOGUE_ENV: str(mine)}) == mine
    with pytest.raises(ConfigError, match=r"Received --catalogue '/nowhere'; expected a directory"):
        catalogue_dir("/nowhere", environ={})
    with pytest.raises(ConfigError, match=rf"Received {CATALOGUE_ENV} '/nowhere'; expected a directory"):
        catalogue_dir(environ={CATALOGUE_ENV: "/nowhere"})
    installed = tmp_path / "site-packages" / "resilient_train"  # a wheel: no chaos/ beside the package
    installed.mkdir(parents=True)
    (tmp_path / "clone" / "chaos" / "scenarios").mkdir(parents=True)
    assert catalogue_dir(environ={}, package=installed, cwd=tmp_path / "clone") == tmp_path / "clone" / "chaos" / "scenarios"
    with pytest.raises(ConfigError, match=r"No scenario catalogue: looked in .*; run from a clone of resilient-train, "
                                          r"pass --catalogue DIR or set RT_CHAOS_SCENARIOS, or run a scenario file"):
        catalogue_dir(environ={}, package=installed, cwd=tmp_path)


def test_list_shows_the_catalogue_and_a_catalogue_of_ones_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CATALOGUE_ENV, raising=False)
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# {CATALOGUE_DIR} (30 scenarios; run one by name or by its file's path)"
    assert [line.split()[0] for line in lines[1:]] == catalogue_names(CATALOGUE_DIR)
    assert re.fullmatch(r"kill-chief-at-7 +\[ci\] the seeds' experiment: .*resumes from 7",
                        next(line for line in lines if line.startswith("kill-chief-at-7")))
    shutil.copy(CATALOGUE_DIR / "raise-in-step.toml", tmp_path / "raise-once.toml")
    assert main(["list", "--catalogue", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("raise-once  an exception in the chief's step 12")


def test_list_works_in_a_clean_clone(tmp_path: Path) -> None:
    """The catalogue is found from a fresh clone's package, run from any directory (no install)."""
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "resilient_train", clone / "resilient_train", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(CATALOGUE_DIR, clone / "chaos" / "scenarios")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "resilient_train.chaos", "list"], cwd=elsewhere, capture_output=True,
                          text=True, env={"PYTHONPATH": str(clone), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"# {clone / 'chaos' / 'scenarios'} (30 scenarios; run one by name or by its file's path)"


def _at_the_checkout(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV`` run as a user at the checkout's root types it: no PYTHONPATH, the root is the cwd."""
    env = {"PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)


def test_python_m_chaos_at_the_checkout_is_the_packages_command(tmp_path: Path) -> None:
    """chaos/__main__.py: `python -m chaos` lists the checkout's catalogue, and a bad file is exit 2, one line."""
    listed = _at_the_checkout("chaos", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == f"# {CATALOGUE_DIR} (30 scenarios; run one by name or by its file's path)"
    assert [line.split()[0] for line in lines[1:]] == catalogue_names(CATALOGUE_DIR)
    assert listed.stdout == _at_the_checkout("resilient_train.chaos", "list").stdout
    bad = tmp_path / "kill-once.toml"
    bad.write_text('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = -1\n')
    runs = tmp_path / "runs"
    for module in ("chaos", "resilient_train.chaos"):
        refused = _at_the_checkout(module, "run", str(bad), "--recipe", RECIPE, "--root", str(runs))
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr.splitlines() == [
            f"chaos: error: {bad}: faults[1].global_step: received -1; expected an integer >= 0"]
    assert not runs.exists()  # nothing ran


# ------------------------------------------------------------------ validation: one line per mistake
BAD = """\
summry = "typo"
ci = "yes"

[job]
workres = 3
save_every_steps = 0

[[faults]]
kind = "worker"
point = "after_comit"
rank = 5
global_step = "7"

[[faults]]
kind = "external"
op = "sigkill_workr"
when = { event = "checkpoint_comitted", nth = 0 }

[[faults]]
kind = "storage"
latency_s = -1
transient_rat = 0.1

[[faults]]
knd = "worker"

[[faults]]
kind = "worker"
point = "input"
global_step = 3

[expect]
restored = [7, "8"]
"""


def test_every_mistake_of_a_users_file_is_one_line_naming_file_key_value_and_what_is_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "my-scenario.toml"
    path.write_text(BAD)
    assert main(["run", str(path), "--recipe", RECIPE, "--root", str(tmp_path / "runs")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    f = f"chaos: error: {path}"
    assert captured.err.splitlines() == [
        f"{f}: summry: unknown key; did you mean 'summary'? accepted: summary, ci, job, faults, expect",
        f"{f}: ci: received 'yes' (a string); expected true or false",
        f"{f}: summary: missing; expected a one-line description of the scenario (a string)",
        f"{f}: job.workres: unknown key; did you mean 'workers'? accepted: recipe, workers, epochs, steps_per_epoch, "
        "save_every_steps, hang_timeout, storage_timeout, startup_timeout, strategy, ps, snapshot_every, straggler_window, "
        "loss_spike, keep, straggler_policy",
        f"{f}: job.save_every_steps: received 0; expected an integer >= 1",
        f"{f}: expect.restored: received [7, '8']; expected an array of integers >= 0 (global steps)",
        f"{f}: faults[1].point: received 'after_comit'; expected one of after_step, before_commit, after_commit, "
        "raise, input, before_join, nan_loss, bitflip, loss_spike, slow; did you mean 'after_commit'?",
        f"{f}: faults[1].global_step: received '7' (a string); expected an integer >= 0",
        f"{f}: faults[2].op: received 'sigkill_workr'; expected one of sigkill_worker, sigterm_worker, "
        "sigkill_supervisor, sigterm_supervisor, corrupt_newest, sigkill_during_upload, throttle_worker; did you mean 'sigkill_worker'?",
        f"{f}: faults[2].when.event: received 'checkpoint_comitted'; expected one of the events of events.jsonl "
        "(docs/events.md); did you mean 'checkpoint_committed'?",
        f"{f}: faults[2].when.nth: received 0; expected an integer >= 1 or 'random'",
        f"{f}: faults[3].transient_rat: unknown key; did you mean 'transient_rate'? accepted: kind, attempts, seed, "
        "fail_write_k, fail_kind, transient_rate, fail_op_k, stop_after_files, latency_s, stall_write_k, stall_count, "
        "stall_s",
        f"{f}: faults[3].latency_s: received latency_s=-1; expected >= 0",
        f"{f}: faults[4].kind: missing; expected one of worker, external, storage",
        f"{f}: faults[5]: received point='input' with signal='SIGKILL'; expected signal='HANG' "
        "(an input pipeline thread can block, not die alone)",
        f"{f}: faults[1].rank: received 5; expected 0..1 (2 workers) or 'chief' or 'random'",
    ]
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.parametrize(("text", "workers", "line"), [
    ('summary = "x"\n', None, "faults: missing; expected at least one [[faults]] table"),
    ('summary = "x"\nfaults = []\n', None, "faults: received []; expected one or more [[faults]] tables"),
    ('summary = "x"\nname = "y"\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = 3\n', None,
     "name: unknown key; the scenario's name is its file's name ('case')"),
    ('summary = "x"\n[[faults]]\nkind = "workers"\n', None,
     "faults[1].kind: received 'workers'; expected one of worker, external, storage; did you mean 'worker'?"),
    ('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "raise"\n', None,
     "faults[1].global_step: missing; expected this key (chaos/README.md)"),
    ('summary = "x"\n[[faults]]\nkind = "storage"\nattempts = [0]\nlatency_s = 0.1\n', None,
     "faults[1].attempts: received [0]; expected 'all' or a non-empty array of attempt numbers >= 1"),
    ('summary = "x"\n[[faults]]\nkind = "storage"\nseed = 3\n', None,
     "faults[1]: no storage fault; expected one or more of fail_write_k, fail_kind, transient_rate, fail_op_k, "
     "stop_after_files, latency_s, stall_write_k, stall_count, stall_s"),
    ('summary = "x"\n[[faults]]\nkind = "storage"\nlatency_s = "fast"\n', None,
     "faults[1].latency_s: received 'fast' (a string); expected a number"),
    ('summary = "x"\n[job]\nhang_timeout = true\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = 3\n', None,
     "job.hang_timeout: received True (a boolean); expected a number of seconds > 0"),
    ('summary = "x"\n[job]\nstrategy = "ps"\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = 3\n', None,
     "job.strategy: received 'ps'; expected one of mirrored, parameter-server"),
    ('summary = "x"\n[[faults]]\nkind = "external"\nop = "sigkill_worker"\nrank = 2\n', 2,
     "faults[1].rank: received 2; expected 0..1 (2 workers) or 'chief' or 'random'"),
    ('summary = "x"\n[job]\nworkers = 3\n[[faults]]\nkind = "external"\nop = "sigkill_worker"\nrank = 3\n', 8,
     "faults[1].rank: received 3; expected 0..2 (3 workers) or 'chief' or 'random'"),
    ('summary = "x"\n[[faults]]\nkind = "external"\nop = "sigkill_worker"\nrank = "ps-worker"\n', 2,
     "faults[1].rank: received 'ps-worker'; expected 0..1 (2 workers) or 'chief' or 'random'"),
    ('summary = "x"\n[job]\nstrategy = "parameter-server"\n[[faults]]\nkind = "external"\nop = "sigkill_worker"\n'
     'rank = 4\n', 2, "faults[1].rank: received 4; expected 0..3 (4 ranks: coordinator, ps, workers) or 'chief' or "
                      "'random' or 'ps-worker'"),
    ('summary = "x"\n[job]\nrecipe = "no/such/recipe.py"\n[[faults]]\nkind = "worker"\npoint = "raise"\n'
     'global_step = 3\n', 2, "job.recipe: received 'no/such/recipe.py'; no such file (relative to the directory you run from)"),
    ('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "after_step"\nglobal_step = 3\nattempt = "all"\n', None,
     "faults[1]: received attempt='all' with point='after_step'; expected an attempt number (every attempt only for "
     "a poisoned batch: nan_loss, loss_spike)"),
    ('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "nan_loss"\nglobal_step = 3\nattempt = "every"\n', None,
     "faults[1].attempt: received 'every' (a string); expected an integer >= 1 or 'all'"),
    ('summary = "x"\n[job]\nloss_spike = 0\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = 3\n', None,
     "job.loss_spike: received 0; expected a number > 0"),
    ('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "raise"\nglobal_step = 3\n[[expect.events]]\n'
     'event = "anomaly_detectd"\nglobal_step = 3\n', None,
     "expect.events: received [{'event': 'anomaly_detectd', 'global_step': 3}]; expected an array of tables, each "
     "with 'event' (an event of events.jsonl, docs/events.md) and the fields that event must have"),
    ('summary = "x"\n[[faults]]\nkind = "external"\nop = "sigkill_worker"\n[expect]\nskipped = [3]\n', None,
     "expect: received expect_skipped=[3] with the external fault 'sigkill_worker'; expected worker and storage "
     "faults only (the run is compared with a re-run of the same job, which repeats them)"),
    ('summary = "x"\n[[faults]\n', None, None),  # not TOML: one line, tomllib's words with line and column
])
def test_each_kind_of_mistake(tmp_path: Path, text: str, workers: int | None, line: str | None) -> None:
    path = tmp_path / "case.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_scenario(path, workers=workers)
    lines = str(raised.value).splitlines()
    if line is None:
        assert len(lines) == 1 and lines[0].startswith(f"{path}: not valid TOML: ") and "(at line 2, column" in lines[0]
    else:
        assert lines == [f"{path}: {line}"]


def test_a_file_name_is_a_scenario_name_and_unknown_names_get_the_closest(tmp_path: Path) -> None:
    path = tmp_path / "My_Scenario.toml"
    path.write_text((CATALOGUE_DIR / "raise-in-step.toml").read_text())
    with pytest.raises(ConfigError) as raised:
        load_scenario(path)
    assert str(raised.value) == (f"{path}: (file name): received 'My_Scenario'; expected lowercase words joined by '-' "
                                 "(the file's name is the scenario's name)")
    with pytest.raises(ConfigError, match=r"Unknown scenario 'kil-chief-at-7': no .*kil-chief-at-7.toml; "
                                          r"did you mean 'kill-chief-at-7'\? expected one of bitflip-once, corrupt-newest"):
        by_name("kil-chief-at-7", CATALOGUE_DIR)
    with pytest.raises(ConfigError, match=r"Received scenario file 'nowhere/x.toml'; no such file"):
        resolve("nowhere/x.toml")


def test_a_broken_file_in_a_catalogue_fails_list_with_its_lines_and_run_all_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(CATALOGUE_DIR / "raise-in-step.toml", tmp_path / "good.toml")
    (tmp_path / "bad.toml").write_text('summary = "x"\n[[faults]]\nkind = "worker"\npoint = "rise"\nglobal_step = 1\n')
    assert main(["list", "--catalogue", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"chaos: error: {tmp_path / 'bad.toml'}: faults[1].point: received 'rise'; expected one of after_step, "
        "before_commit, after_commit, raise, input, before_join, nan_loss, bitflip, loss_spike, slow; did you mean 'raise'?"]
    assert main(["run", "--all", "--catalogue", str(tmp_path), "--recipe", RECIPE, "--root", str(tmp_path / "r")]) == 2
    assert "bad.toml: faults[1].point" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_run_refuses_names_and_all_together_and_a_missing_catalogue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["run", "--all", "kill-chief-at-7", "--recipe", RECIPE]) == 2
    assert capsys.readouterr().err == ("chaos: error: expected scenario names or files, or --all (not both); "
                                       "see `python -m resilient_train.chaos list`\n")
    assert main(["run", "kill-chief-at-7", "--workers", "0", "--recipe", RECIPE]) == 2
    assert capsys.readouterr().err == "chaos: error: Received --workers 0; expected >= 1\n"
    monkeypatch.setenv(CATALOGUE_ENV, str(tmp_path / "none"))
    assert main(["run", "kill-chief-at-7", "--recipe", RECIPE]) == 2
    assert capsys.readouterr().err == (f"chaos: error: Received {CATALOGUE_ENV} '{tmp_path / 'none'}'; "
                                       "expected a directory of scenario files (*.toml)\n")


def test_the_readmes_example_scenario_is_valid(tmp_path: Path) -> None:
    """chaos/README.md's TOML blocks that start with ``# <name>.toml`` load, ranks checked for 2 workers."""
    text = (REPO / "chaos" / "README.md").read_text()
    blocks = re.findall(r"^```toml\n# ([a-z0-9-]+\.toml)\n(.*?)^```", text, flags=re.M | re.S)
    assert len(blocks) >= 2
    for name, body in blocks:
        (tmp_path / name).write_text(body)
        assert load_scenario(tmp_path / name, workers=2).name == name[:-5]
