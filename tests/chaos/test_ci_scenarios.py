"""The CI subset: real 2-worker jobs under real faults, checked by resilient_train.chaos.invariants.

The scenarios are the catalogue's files (``chaos/scenarios/<name>.toml``, loaded by
resilient_train.chaos.catalogue). One reference run (cached for the session) and two scenarios on the small
linear-regression recipe, all with a checkpoint every step so they share the reference:
the seeds' own experiment (kill -9 the chief right after it committed step 7; the run
must continue from exactly 7) and a SIGTERM to a worker (zero lost steps). About a
minute or two on 2 cores. The rest of the catalogue runs with RT_SLOW=1 (one test per
scenario), and all of it with ``python -m resilient_train.chaos run --all``. The
parameter-server scenarios (``ps-kill``, ``ps-worker-kill``) have no reference: the
checker's parameter-server mode checks the tier's guarantees instead; each takes about a
minute on 2 busy cores, and tests/integration/test_parameter_server.py covers the same
kills by default, so they are RT_SLOW too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilient_train.chaos.catalogue import by_name, load_catalogue
from resilient_train.chaos.harness import JobSpec, ensure_reference, run_scenario
from resilient_train.chaos.report import table

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "linear_regression.py")
CATALOGUE_DIR = REPO / "chaos" / "scenarios"
CATALOGUE = load_catalogue(CATALOGUE_DIR)
CI_NAMES = ("kill-chief-at-7", "sigterm-worker")  # with CI_SPEC; hang-collective with SLOW_SPEC
CI_SPEC = JobSpec(RECIPE, workers=2, save_every_steps=1, seed=0)
SLOW_SPEC = JobSpec(RECIPE, workers=2, seed=0)


@pytest.fixture(scope="session")
def chaos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


def _run(name: str, spec: JobSpec, root: Path, seed: int = 0):
    scenario = by_name(name, CATALOGUE_DIR)
    reference = ensure_reference(spec.with_overrides(scenario.overrides), root)
    result = run_scenario(scenario, spec, seed=seed, root=root, reference=reference)
    return result


def test_seeds_experiment_kill_chief_at_7_resumes_from_7(chaos_root: Path) -> None:
    result = _run("kill-chief-at-7", CI_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    assert result.check.restored_steps == (7,)
    assert result.check.restarts == 1
    assert result.check.digest_match
    assert result.exit_codes == (0,)
    assert [f["state"] for f in result.faults] == ["done"]
    page = (Path(result.run_dir) / "report.html").read_text()  # beside chaos-result.json
    assert page.count('<g class="band" data-kind="restart"') == 1
    assert page.count('<line class="restore" data-step="7"') >= 1


@pytest.mark.slow  # tests/integration/test_hang.py: a hung rank 1 is detected, named by the watchdog and healed
def test_a_worker_hung_before_a_save_is_named_by_the_watchdog(chaos_root: Path) -> None:
    """hang-collective: rank 1 stops after the call that ends at the save point 15, so the chief
    waits for it in the save's iterator-state gather (linear_regression re-enters by iterator
    state). That wait counts as training (hang timeout), not as a save (the start-up
    allowance, 600 s): before runner/training/loop.py built the save request outside its flush phase
    the run sat there until the scenario timed out."""
    result = _run("hang-collective", SLOW_SPEC, chaos_root)
    assert result.passed, result.to_dict()
    [fault] = result.faults
    assert (fault["fault"], fault["state"]) == ("hang rank 1 at after_step step 12 (attempt 1)", "done")
    assert result.check.restarts == 1 and result.check.digest_match
    assert result.exit_codes == (0,)


@pytest.mark.slow  # test_supervisor.py's SIGTERM to a worker
def test_sigterm_to_a_worker_loses_no_step(chaos_root: Path) -> None:
    result = _run("sigterm-worker", CI_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    assert result.check.restarts == 1
    assert result.check.lost_steps == 0
    assert [r.ended_by for r in result.check.restart_records] == ["preemption"]
    assert result.check.digest_match


@pytest.mark.slow  # tests/integration/test_stragglers.py: a rank slow in its host loop is named (by default)
def test_a_worker_throttled_from_outside_is_named_from_its_stalls_and_the_run_stays_exact(chaos_root: Path) -> None:
    """throttle-worker: the nemesis stops rank 1's process 50 ms in every 100 (SIGSTOP/SIGCONT, its
    code untouched) once training runs. Its host time is the other rank's (the slowness is inside
    the compiled step); its stall probe (runner/health/stall_probe.py) names it."""
    from resilient_train.chaos.invariants import load_events
    from resilient_train.rundir.layout import RunDir

    result = _run("throttle-worker", SLOW_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    [fault] = result.faults
    assert (fault["op"], fault["state"], fault["rank"], fault["attempt"]) == ("throttle_worker", "done", 1, 1)
    [named] = [r for r in load_events(RunDir(Path(result.run_dir)).events) if r.get("event") == "straggler_detected"]
    assert (named["rank"], named["attempt"], named["evidence"], named["action"]) == (1, 1, "stalled", "warn")
    assert named["slower"] > 1.5 and named["stalled"] > named["others_stalled"]  # past the default threshold 0.5
    assert (result.check.digest_match, result.check.restarts, result.exit_codes) == (True, 0, (0,))


NUMERICAL_HEALTH = ("nan-batch", "loss-spike")  # their own tests below


@pytest.mark.slow  # ~3-4 min (reference, run, re-run); the default suite's covering test is tests/integration/
# test_numerical_health.py::test_a_nan_back_at_the_same_step_is_deterministic_and_its_batch_is_skipped_in_the_next_replay
def test_a_nan_batch_is_found_at_its_step_judged_deterministic_skipped_and_a_rerun_ends_with_the_same_digest(
        chaos_root: Path) -> None:
    result = _run("nan-batch", SLOW_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()  # [expect] events included
    assert [(f["fault"], f["state"]) for f in result.faults] == [
        ("NaN loss on rank 1 at step 12 (every attempt: a poisoned batch)", "done")]
    assert (result.check.skipped_steps, result.check.restored_steps, result.check.restarts) == ((12,), (10, 10), 2)
    assert result.check.finite_checked == (5, 10, 15, 20, 25, 30)  # every commit kept (keep = 100), each one read
    assert result.rerun is not None and result.rerun["exit_code"] == 0
    assert result.check.digest == result.rerun["weights_sha256"] and result.check.digest_match
    # the uninterrupted run's weights until the skipped batch, others after it
    assert (result.check.last_matching_step, result.check.first_divergent_step) == (10, 15)


@pytest.mark.slow  # ~4-5 min; --loss-spike is off by default: its logic is tests/runner/health/test_spikes.py's, the
# rollback and skip the default suite's test_numerical_health.py::test_a_nan_back_at_the_same_step_is_deterministic...
def test_a_poisoned_batch_spiking_the_loss_is_named_at_its_step_rolled_back_skipped_and_reruns_exactly(
        chaos_root: Path) -> None:
    from resilient_train.chaos.invariants import load_events
    from resilient_train.rundir.layout import RunDir

    result = _run("loss-spike", SLOW_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    assert (result.check.skipped_steps, result.check.restored_steps, result.check.restarts) == ((130,), (120, 120), 2)
    [spike] = [r for r in load_events(RunDir(Path(result.run_dir)).events) if r.get("event") == "anomaly_detected"]
    assert (spike["kind"], spike["global_step"], spike["epoch"], spike["step_in_epoch"]) == ("spike", 130, 1, 49)
    assert spike["values"]["loss"] > spike["threshold"] > spike["median"] > 0  # nothing before it in 129 steps
    assert result.rerun is not None and result.check.digest == result.rerun["weights_sha256"]
    assert result.check.last_matching_step == 120 and result.check.first_divergent_step == 140


@pytest.mark.slow  # tests/supervisor/test_supervisor_loop.py: a straggler's marker and 143 restart the group (fakes)
def test_a_throttled_worker_is_replaced_by_an_agreed_save_and_a_fresh_process_losing_nothing(chaos_root: Path) -> None:
    """throttle-worker-replace: the nemesis throttles rank 1's process (its pid: SIGSTOP/SIGCONT 50/50 ms);
    with --straggler-policy replace the chief names it, finds its cost to the end above a restart's
    (no restart in the run yet: the 10 s estimate), and asks for the stop; the group saves the step
    that stop names, exits 143, and the local launcher restarts it with fresh processes, which the
    throttle (it held the old pid) no longer touches. Zero lost steps, the digest of the run
    never throttled."""
    from resilient_train.chaos.invariants import load_events
    from resilient_train.rundir.layout import RunDir

    result = _run("throttle-worker-replace", SLOW_SPEC, chaos_root)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    [fault] = result.faults
    assert (fault["op"], fault["state"], fault["rank"], fault["attempt"]) == ("throttle_worker", "done", 1, 1)
    records = load_events(RunDir(Path(result.run_dir)).events)

    def named(event: str, **match) -> list[dict]:
        return [r for r in records if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]

    [detected] = named("straggler_detected")
    assert (detected["rank"], detected["attempt"], detected["evidence"], detected["action"]) == (1, 1, "stalled", "replace")
    assert (detected["restart_cost_s"], detected["restart_cost_from"]) == (10.0, "estimate")
    assert detected["gain_s"] == detected["time_lost_s"] > detected["restart_cost_s"]
    assert detected["steps_left"] == 4000 - detected["global_step"]
    [request] = named("preemption_requested", source="straggler:1")
    assert (request["attempt"], request["rank"]) == (1, 0)  # the chief's stop request, voted in the next call
    saved = request["global_step"]
    assert detected["global_step"] < saved < 4000
    assert [r["global_step"] for r in named("preempted", attempt=1, role="chief")] == [saved]
    assert [r["global_step"] for r in named("checkpoint_committed", attempt=1)][-1] == saved
    assert [(r["rank"], r["global_step"], r["moved"], r["nodes"], r["launcher"]) for r in named("straggler_replaced")] == [
        (1, saved, "fresh_process", [], "local")]
    exits = {(r["attempt"], r["rank"]): r.get("exit_code") for r in named("worker_exited")}
    assert (exits[(1, 0)], exits[(1, 1)]) == (143, 143)
    pids = {(r["attempt"], r["rank"]): r["pid"] for r in named("worker_started")}
    assert fault["pid"] == pids[(1, 1)] != pids[(2, 1)]  # the throttle held attempt 1's rank-1 process
    assert [r["global_step"] for r in named("restored", attempt=2)] == [saved]
    assert named("straggler_detected", attempt=2) == []  # the fresh process runs at the others' pace
    assert result.check.lost_steps == 0 and [r.ended_by for r in result.check.restart_records] == ["preemption"]
    assert (result.check.digest_match, result.check.restarts, result.exit_codes) == (True, 1, (0,))
    [entry] = json.loads((Path(result.run_dir) / "summary.json").read_text())["stragglers"]
    assert (entry["action"], entry["moved"], entry["saved_step"]) == ("replace", "fresh_process", saved)


@pytest.mark.slow
@pytest.mark.parametrize("name", [s.name for s in CATALOGUE if s.name not in (*CI_NAMES, "throttle-worker",
                                                                             *NUMERICAL_HEALTH, "throttle-worker-replace")
                                  and not s.parameter_server])
def test_catalogue_scenario(name: str, chaos_root: Path) -> None:
    result = _run(name, SLOW_SPEC, chaos_root)
    assert result.passed, result.to_dict()


@pytest.mark.slow
def test_ps_kill_restores_the_last_commit_and_blames_the_ps(chaos_root: Path) -> None:
    result = run_scenario(by_name("ps-kill", CATALOGUE_DIR), SLOW_SPEC, seed=0, root=chaos_root, reference=None)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    [fault] = result.faults
    assert (fault["state"], fault["rank"], fault["trigger_step"]) == ("done", 1, 20)  # the ps, after the 2nd commit
    assert result.check.restored_steps == (20,) and result.check.restarts == 1
    assert result.exit_codes == (0,)
    assert "n/a (parameter-server)" in table([result])  # the digest column: no reference to compare with


@pytest.mark.slow
def test_ps_worker_kill_restarts_the_worker_in_place_without_a_restore(chaos_root: Path) -> None:
    result = run_scenario(by_name("ps-worker-kill", CATALOGUE_DIR), SLOW_SPEC, seed=0, root=chaos_root, reference=None)
    assert result.problems == () and result.check.violations == (), result.to_dict()
    [fault] = result.faults
    assert fault["state"] == "done" and fault["rank"] in (2, 3)  # a worker
    assert (result.check.restored_steps, result.check.restarts, result.check.lost_steps) == ((), 0, 0)
    assert result.exit_codes == (0,)
