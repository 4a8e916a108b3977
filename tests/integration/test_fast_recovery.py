"""The fast recovery path changes how fast a group restarts, never what it computes.

Real supervisor, real MWMS workers, real standby processes forked from the standby template
(linear regression, 3 x 10 steps).
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.harness import run_job, run_job_until, survivors, worker_pids

RECIPE = "recipes/linear_regression.py"
# The chief dies right after committing step 10; the restart restores step 10 (without the
# memory tier, on by default: rank 1 could rescue a newer snapshot, tests/integration/test_rescue.py).
KILL_CHIEF_AFTER_COMMIT_10 = [{"point": "after_commit", "global_step": 10, "rank": 0}]
NO_TIER = ("--snapshot-every", "off")


def _fetch_sources(job, attempt):
    return sorted((e["rank"], e["source"]) for e in job.named("checkpoint_fetched") if e["attempt"] == attempt)


_WORKER_PHASES = ["bootstrap", "reach_peers", "recipe_store", "strategy", "model_build", "setup", "fetch", "agree",
                  "restore", "input", "trace", "first_call"]


def _first_step(job, attempt):
    return next(e["global_step"] for e in job.named("first_step") if e["attempt"] == attempt)


def _started(job, attempt):
    return sorted((e["rank"], e["standby"]) for e in job.named("worker_started") if e["attempt"] == attempt)


@pytest.fixture(scope="module")
def cold_restart(tmp_path_factory):
    job = run_job(RECIPE, tmp_path_factory.mktemp("cold") / "run", "--no-warm-standby", *NO_TIER,
                  faults=KILL_CHIEF_AFTER_COMMIT_10)
    assert job.returncode == 0, job.output
    assert (job.summary["status"], job.summary["global_step"], job.summary["restarts"]) == ("completed", 30, 1)
    assert _started(job, 2) == [(0, False), (1, False)]
    assert not job.named("standby_started")
    return job


def test_a_warm_standby_restart_ends_with_the_same_weights_as_a_cold_one(tmp_path, cold_restart):
    warm = run_job(RECIPE, tmp_path / "run", *NO_TIER, faults=KILL_CHIEF_AFTER_COMMIT_10)
    assert warm.returncode == 0, warm.output
    assert (warm.summary["status"], warm.summary["global_step"], warm.summary["restarts"]) == ("completed", 30, 1)
    assert _started(warm, 1) == [(0, True), (1, True)]  # the first attempt's workers are forks too ...
    assert [e["standby_warm"] for e in warm.named("worker_started") if e["attempt"] == 1] == [True, True]
    assert _started(warm, 2) == [(0, True), (1, True)]  # the restart took standbys ...
    standby_pids = {e["pid"] for e in warm.named("standby_started")}
    assert set(worker_pids(warm.events, 2).values()) <= standby_pids  # ... and reports their real pids
    # ... each forked from the one template that imported TensorFlow (runner/process/standby_template.py)
    [template] = warm.named("standby_template_started")
    assert [e["pid"] for e in warm.named("standby_template_ready")] == [template["pid"]]
    assert [e["forked"] for e in warm.named("standby_started")] == [True] * len(standby_pids)
    assert not warm.named("standby_template_lost")
    # ... and whether each had finished importing when handed over: exactly those whose
    # standby_ready came before their worker_started (else the restart paid the rest of the import)
    ready_before, warmth = set(), []
    for e in warm.events:
        if e["event"] == "standby_ready":
            ready_before.add(e["pid"])
        elif e["event"] == "worker_started" and e["attempt"] == 2:
            warmth.append((e["standby_warm"], e["pid"] in ready_before))
    assert len(warmth) == 2 and all(said == seen for said, seen in warmth), warmth
    for job in (cold_restart, warm):
        assert [(r["global_step"], r["attempt"]) for r in job.named("restored")] == [(10, 2)]
        assert _fetch_sources(job, 2) == [(0, "host_cache"), (1, "host_cache")]  # no download
    assert warm.summary["weights_sha256"] == cold_restart.summary["weights_sha256"]
    # Where each attempt's start-up went (runner/process/startup_phases.py): one event per rank at its
    # first step, counted from a cold process's creation or a standby's assignment; one trace each.
    for job, starts in ((cold_restart, ["created", "created"]), (warm, ["assigned", "assigned"])):
        phases = sorted((e for e in job.named("startup_phases") if e["rank"] == 0), key=lambda e: e["attempt"])
        assert sorted((e["attempt"], e["rank"]) for e in job.named("startup_phases")) == [(1, 0), (1, 1), (2, 0), (2, 1)]
        assert [(e["attempt"], e["start"], e["traces"], e["global_step"]) for e in phases] == [
            (1, starts[0], 1, _first_step(job, 1)), (2, starts[1], 1, _first_step(job, 2))]
        def first(event):
            """A cold process's ``imports``, a standby's ``handover``; a standby handed over while
            still importing (runner/process/warm_standby.py) has the rest of its import first, its own
            phase, and the pool never saw it ready."""
            if starts[1] == "created":
                return ["imports"]
            if list(event["phases"])[0] != "standby_import":
                return ["handover"]
            [started] = [e for e in job.named("worker_started") if (e["attempt"], e["rank"]) == (2, event["rank"])]
            assert started["standby_warm"] is False
            return ["standby_import", "handover"]

        assert list(phases[1]["phases"]) == [*first(phases[1]), *_WORKER_PHASES]
        # Rank 1 registers only once the chief's server answers (cluster/reach.py): its own phase.
        [peer] = [e for e in job.named("startup_phases") if (e["attempt"], e["rank"]) == (2, 1)]
        at = _WORKER_PHASES.index("strategy")
        assert list(peer["phases"]) == [*first(peer), *_WORKER_PHASES[:at], "chief_server", *_WORKER_PHASES[at:]]


@pytest.mark.slow  # tests/checkpoint's cache tests reject a corrupt copy
def test_a_corrupt_host_cache_copy_is_rejected_and_shared_storage_used(tmp_path, cold_restart):
    """Shared storage that is not the run dir's disk (a store on that disk shares the host
    cache's inodes: one flipped byte there is the store's too): the fault-injecting
    filesystem with no faults, in front of a local directory."""
    run_dir = tmp_path / "run"
    storage = ("--storage", f"faulty://{tmp_path / 'shared'}")
    first = run_job(RECIPE, run_dir, "--epochs", "2", *storage)
    assert first.returncode == 0, first.output
    data = next((run_dir / "local" / "host-cache" / "ckpt-000000000020").glob("ckpt.data-*"))
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))

    more = run_job(RECIPE, run_dir, "--epochs", "3", *storage)
    assert more.returncode == 0, more.output
    rejected = [e for e in more.named("cache_rejected") if e["attempt"] == 2]
    assert sorted((e["rank"], e["reason"]) for e in rejected) == [
        (0, f"sha256 mismatch in {data.name}"), (1, f"sha256 mismatch in {data.name}")
    ]
    assert _fetch_sources(more, 2) == [(0, "shared"), (1, "shared")]
    assert [r["global_step"] for r in more.named("restored") if r["attempt"] == 2] == [20]
    assert more.summary["weights_sha256"] == cold_restart.summary["weights_sha256"]


def _prestarted(events) -> set[int]:
    """The standbys started for a next attempt: the first attempt's workers are standbys too
    (forked from the template, ``standby_started`` just before their ``worker_started``)."""
    return {e["pid"] for e in events if e["event"] == "standby_started"} - set(worker_pids(events).values())


def test_standbys_die_with_a_killed_supervisor(tmp_path):
    pids: dict[str, set[int]] = {}

    def kill_supervisor(proc, events):
        pids["standby"] = _prestarted(events)
        pids["template"] = {e["pid"] for e in events if e["event"] == "standby_template_started"}
        pids["worker"] = set(worker_pids(events).values())
        proc.send_signal(signal.SIGKILL)

    # (waiting for 2 standby_started alone raced the workers' worker_started: the suite, 2026-11-29)
    run_job_until(
        RECIPE, tmp_path / "run", "--epochs", "2000", "--save-every-steps", "0",
        when=lambda events: len(worker_pids(events)) == 2 and len(_prestarted(events)) >= 2,
        action=kill_supervisor,
    )
    everyone = pids["standby"] | pids["worker"] | pids["template"]
    assert len(pids["standby"]) == 2 and len(pids["worker"]) == 2 and len(pids["template"]) == 1
    assert survivors(everyone, within_s=30) == []
