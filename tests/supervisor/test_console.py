"""The console: sentences for people, key=value lines with --verbose, the progress display."""

import io
import json
import re
from pathlib import Path

import pytest

from resilient_train.rundir.events import render_line
from resilient_train.supervisor.console import (
    CONSOLE,
    Console,
    EventTail,
    hang_line,
    progress_line,
    render_event,
)

ROOT = Path(__file__).resolve().parents[2]
TS = "2026-11-23T10:00:00.000000+00:00"


def write(path, *records):
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps({"ts": TS, **record}) + "\n")


def tail_for(tmp_path, **kwargs):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    out = io.StringIO()
    return path, out, EventTail(path, out, **kwargs)


# ------------------------------------------------------------ the decision table

def documented_events():
    """Every event name in docs/events.md's table (first column, in backticks)."""
    names = set()
    for line in (ROOT / "docs" / "events.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


SHOWN = {
    "run_started", "run_finished", "job_changed", "worker_restarted", "fresh_start", "restored", "epoch_finished",
    "training_stopped", "anomaly_detected", "straggler_detected", "straggler_replaced", "rolled_back", "replay_verdict", "host_suspected", "batch_skipped", "input_mismatch", "world_size_changed", "preemption_requested", "preempted",
    "checkpoint_committed", "checkpoint_rejected", "checkpoint_failed", "storage_retry", "storage_claimed",
    "stale_writer_fenced", "gang_restart", "hang_detected", "model_exported", "model_export_failed",
    "ray_connected", "node_lost", "chaos_fault_injected", "script_output",
    "rescue_committed", "rescue_skipped", "rescue_abandoned",
    "preemption_notice_watch", "preemption_notice", "preemption_notice_saved", "preemption_notice_error",
}


def test_every_documented_event_has_a_decision_in_the_one_table():
    documented = documented_events()
    assert len(documented) == 85  # 80 before sharded_save, checkpoint_share_uploaded/_replaced, restore_read (issue 50); straggler_replaced (issue 49)
    assert documented - set(CONSOLE) == set()
    assert set(CONSOLE) - documented == {"worker_preempted", "cache_write_failed"}  # emitted, named in events.py
    assert {name for name, sentence in CONSOLE.items() if sentence is not None} == SHOWN


# ------------------------------------------------------------ sentences

AT = {"epoch": 1, "step_in_epoch": 20, "global_step": 60}
SENTENCES = [
    ({"event": "preemption_notice_watch", "rank": 0, "provider": "gce", "setting": "auto",
      "endpoint": "169.254.169.254:80", "feeds": ["preempted", "maintenance-event"]},
     "watching gce preemption notices at 169.254.169.254:80 (--preemption-notice auto)"),
    ({"event": "preemption_notice", "rank": 1, "provider": "aws", "kind": "spot_terminate", "action": "stop",
      "deadline": "2026-11-26T12:02:00Z"},
     "worker 1: aws preemption notice spot_terminate, deadline 2026-11-26T12:02:00Z: the workers save at one "
     "agreed step, then stop"),
    ({"event": "preemption_notice", "rank": 0, "provider": "gce", "kind": "MIGRATE_ON_HOST_MAINTENANCE",
      "action": "save", "deadline": None},
     "worker 0: gce preemption notice MIGRATE_ON_HOST_MAINTENANCE: the machine survives it: one agreed save, "
     "training goes on"),
    ({"event": "preemption_notice_saved", "rank": 0, "provider": "gce", "kind": "preempted", "global_step": 6,
      "seconds": 1.105},
     "worker 0: saved global step 6 1.1 s after its notice"),
    ({"event": "preemption_requested", "source": "notice:azure"},
     "this host had a preemption notice (azure): the workers save at one agreed step, then stop"),
    ({"event": "preemption_notice_error", "rank": 1, "provider": "aws", "feed": "spot",
      "error": "GET /latest/meta-data/spot/instance-action: '<html>' is not a JSON object"},
     "worker 1: preemption notices (aws, spot) ignored: GET /latest/meta-data/spot/instance-action: '<html>' "
     "is not a JSON object"),
    ({"event": "run_started", "recipe": "recipes/digits_cnn.py", "workers": 2, "run_dir": "runs/digits_cnn",
      "storage": "runs/digits_cnn/checkpoints", "launcher": "local"},
     "training recipes/digits_cnn.py on 2 workers (local launcher); run dir runs/digits_cnn, "
     "checkpoints in runs/digits_cnn/checkpoints"),
    ({"event": "run_started", "recipe": "r.py", "workers": 4, "min_workers": 2, "run_dir": "d", "storage": "s3://b/x"},
     "training r.py on 2 to 4 workers; run dir d, checkpoints in s3://b/x"),
    ({"event": "run_finished", "status": "completed", "global_step": 200, "restarts": 1, "preemptions": 0,
      "lost_steps": 7},
     "1 restart, 0 preemptions; lost 7 steps in all"),
    ({"event": "job_changed", "changes": {"epochs": {"was": 5, "now": 10}}, "accepted": "more epochs"},
     "the job changed since this run dir was last used (epochs 5 -> 10); going on: more epochs"),
    ({"event": "worker_restarted", "rank": 2, "role": "worker", "pid": 77, "address": "127.0.0.1:2222",
      "previous_exit": "killed by SIGKILL", "restarts": 1},
     "worker 2 (killed by SIGKILL) was started again in place at 127.0.0.1:2222 (pid 77)"),
    ({"event": "fresh_start", "epoch": 0, "step_in_epoch": 0, "global_step": 0},
     "no checkpoint found: starting from step 0"),
    ({"event": "restored", **AT, "checkpoint": "s/ckpt-000000000060"},
     "restored global step 60 (epoch 2, step 20) from s/ckpt-000000000060"),
    ({"event": "restored", "epoch": 1, "step_in_epoch": 0, "global_step": 40, "checkpoint": "s/ckpt-000000000040"},
     "restored global step 40 (end of epoch 1) from s/ckpt-000000000040"),
    ({"event": "epoch_finished", "epoch": 0, "global_step": 40, "loss": 1.32154, "metrics": {"accuracy": 0.57231}},
     "epoch 1 finished  loss 1.3215  accuracy 0.5723"),
    ({"event": "epoch_finished", "epoch": 0, "global_step": 40, "loss": 1.32154, "metrics": {}, "val_loss": 0.25,
      "val_metrics": {}, "after_restore": True},
     "epoch 1 finished  loss 1.3215  val_loss 0.2500  (reported after the restart)"),
    ({"event": "training_stopped", "epoch": 2, "global_step": 120, "reason": "model.stop_training"},
     "training stopped early after epoch 3 at global step 120: a recipe callback set model.stop_training"),
    ({"event": "anomaly_detected", "kind": "nonfinite", "global_step": 6, "epoch": 0, "step_in_epoch": 5,
      "replicas": 1, "values": {"loss": "nan", "accuracy": 0.09375}, "action": "stop"},
     "non-finite loss or gradients at global step 6 (epoch 0, batch 5 of the epoch) on 1 replica(s): loss=nan, "
     "accuracy=0.09375; the run stops; its state is not saved"),
    ({"event": "rolled_back", "global_step": 4, "anomaly_step": 6},
     "rolled back to global step 4: replaying up to step 6"),
    ({"event": "replay_verdict", "global_step": 6, "verdict": "transient", "values_before": {"loss": "nan"}},
     "replayed step 6 without the anomaly: it was transient (not the data or the model); training goes on"),
    ({"event": "replay_verdict", "global_step": 6, "verdict": "transient", "hosts": ["10.0.0.2"]},
     "replayed step 6 without the anomaly: it was transient on 10.0.0.2 (not the data or the model); training goes on"),
    ({"event": "host_suspected", "host": "10.0.0.2", "ranks": [1], "transients": 3, "limit": 3},
     "host 10.0.0.2 had 3 transient anomalies (--max-transients-per-host 3): suspected faulty hardware; it is "
     "treated as a host with a preemption notice (ranks 1): the workers save and stop, and no worker of this run is "
     "placed there again where the launcher can avoid it (Ray, Slurm)"),
    ({"event": "replay_verdict", "global_step": 6, "verdict": "deterministic", "action": "skip"},
     "the anomaly came back at step 6 when replayed: deterministic (the data or the model); that batch is skipped: "
     "rolling back to replay without it"),
    ({"event": "batch_skipped", "global_step": 6, "epoch": 0, "step_in_epoch": 5},
     "skipped the batch of global step 6 (epoch 0, batch 5 of the epoch): a deterministic anomaly "
     "(--deterministic-anomaly skip)"),
    ({"event": "anomaly_detected", "kind": "replicas", "global_step": 10, "epoch": 0, "step_in_epoch": 9,
      "replicas": 2, "ranks": [0, 1], "values": {}, "action": "rollback"},
     "the replicas' trainable weights differ at global step 10 (epoch 0, batch 9 of the epoch): 2 replica(s) on "
     "rank(s) 0, 1 differ from the others (silent data corruption?); its state is not saved; rolling back to the "
     "newest commit to replay it"),
    ({"event": "straggler_detected", "rank": 1, "host": "10.0.0.2", "global_step": 51, "slower": 2.86,
      "busy_ms_per_step": 61.758, "others_ms_per_step": 21.626, "window_s": 20.0, "steps_per_s": 16.19,
      "steps_per_s_without": 46.24, "steps_per_s_lost": 30.05, "steps_left": 249, "time_lost_s": 10.0, "action": "warn"},
     "rank 1 (10.0.0.2) is a straggler: busy 2.86x as long per step as the other workers (61.758 ms against "
     "21.626 ms) for 20 s, at global step 51; it costs the group 30.05 steps/s (16.19 instead of about 46.24), "
     "about 10 s to the end of the run; training goes on (warn)"),
    ({"event": "straggler_detected", "rank": 1, "host": "10.0.0.2", "global_step": 562, "slower": 1.7,
      "evidence": "stalled", "stalled": 0.433, "others_stalled": 0.021, "busy_ms_per_step": 14.317,
      "others_ms_per_step": 8.422, "window_s": 6.0, "steps_per_s": 69.85, "steps_per_s_without": 118.74,
      "steps_per_s_lost": 48.89, "steps_left": 938, "time_lost_s": 5.5, "action": "warn"},
     "rank 1 (10.0.0.2) is a straggler: its process could not run 43% of the time against 2% on the other workers "
     "(a CPU quota, a noisy neighbour?): about 1.7x slower per step (14.317 ms against 8.422 ms at their pace) for "
     "6 s, at global step 562; it costs the group 48.89 steps/s (69.85 instead of about 118.74), about 5.5 s to the "
     "end of the run; training goes on (warn)"),
    ({"event": "straggler_detected", "rank": 1, "host": "127.0.0.1", "global_step": 700, "slower": 1.8,
      "evidence": "stalled", "stalled": 0.46, "others_stalled": 0.03, "busy_ms_per_step": 11.0,
      "others_ms_per_step": 6.1, "window_s": 6.0, "steps_per_s": 90.9, "steps_per_s_without": 163.9,
      "steps_per_s_lost": 73.0, "steps_left": 3300, "time_lost_s": 16.2, "action": "replace",
      "reason": "its cost to the end of the run (16.2 s) exceeds a restart's (10 s, estimated)", "gain_s": 16.2,
      "restart_cost_s": 10.0, "restart_cost_from": "estimate"},
     "rank 1 (127.0.0.1) is a straggler: its process could not run 46% of the time against 3% on the other workers "
     "(a CPU quota, a noisy neighbour?): about 1.8x slower per step (11.0 ms against 6.1 ms at their pace) for 6 s, "
     "at global step 700; it costs the group 73.0 steps/s (90.9 instead of about 163.9), about 16.2 s to the end of "
     "the run; replacing it: its cost to the end of the run (16.2 s) exceeds a restart's (10 s, estimated): the "
     "workers save at one agreed step, then the group restarts without that process (off its node where the "
     "launcher can place it elsewhere)"),
    ({"event": "straggler_detected", "rank": 1, "host": "h1", "global_step": 51, "slower": 2.86,
      "busy_ms_per_step": 61.758, "others_ms_per_step": 21.626, "window_s": 20.0, "steps_per_s": 16.19,
      "steps_per_s_without": 46.24, "steps_per_s_lost": 30.05, "steps_left": 249, "time_lost_s": 10.0, "action": "warn",
      "reason": "rank 1 was replaced 42 s ago (--straggler-cooldown 600 s)"},
     "rank 1 (h1) is a straggler: busy 2.86x as long per step as the other workers (61.758 ms against 21.626 ms) for "
     "20 s, at global step 51; it costs the group 30.05 steps/s (16.19 instead of about 46.24), about 10 s to the end "
     "of the run; training goes on (warn: rank 1 was replaced 42 s ago (--straggler-cooldown 600 s))"),
    ({"event": "straggler_replaced", "attempt": 1, "rank": 1, "host": "127.0.0.1", "global_step": 712,
      "moved": "fresh_process", "nodes": [], "launcher": "local"},
     "rank 1 replaced after the agreed save of global step 712: it restarts with a fresh process on the same host "
     "127.0.0.1: the local launcher cannot place it elsewhere, so whatever slowed the old process itself (a "
     "stop/continue cycle, a quota on it) is gone, a slow host is not"),
    ({"event": "straggler_replaced", "attempt": 1, "rank": 1, "host": "10.0.0.2", "global_step": 712,
      "moved": "node_avoided", "nodes": ["abc123"], "launcher": "ray"},
     "rank 1 replaced after the agreed save of global step 712: it restarts off node abc123, which the ray launcher "
     "avoids from now on"),
    ({"event": "input_mismatch", "epoch": 1, "checkpoint": "s/ckpt-000000000040", "expected_sha256": "a" * 64,
      "found_sha256": "b" * 64, "strict": False},
     "epoch 2's input differs from the one recorded with s/ckpt-000000000040, so the resumed run will not match "
     "an uninterrupted one; training on"),
    ({"event": "world_size_changed", "checkpoint_world_size": 2, "world_size": 1, "input": "dataset",
      "note": "weights will differ"},
     "the checkpoint was written by 2 workers, this attempt has 1: weights will differ"),
    ({"event": "preemption_requested", "source": "supervisor:SIGINT"},
     "the run got SIGINT: the workers save at one agreed step, then stop"),
    ({"event": "preemption_requested", "source": "worker:1"},
     "worker 1 got a stop signal: the workers save at one agreed step, then stop"),
    ({"event": "preemption_requested", "source": "straggler:1", "global_step": 712},
     "rank 1 is a straggler to replace (--straggler-policy replace): the workers save at one agreed step, then stop"),
    ({"event": "preemption_requested", "source": "launcher:slurm"},
     "the slurm launcher asked to stop: the workers save at one agreed step, then stop"),
    ({"event": "preempted", **AT}, "saved global step 60 (epoch 2, step 20) and stopped"),
    ({"event": "preempted", "global_step": 60}, "saved global step 60 and stopped"),
    ({"event": "checkpoint_committed", "epoch": 0, "step_in_epoch": 20, "global_step": 20,
      "path": "runs/d/checkpoints/ckpt-000000000020"},
     "checkpoint committed at global step 20 (epoch 1, step 20) -> runs/d/checkpoints/ckpt-000000000020"),
    ({"event": "checkpoint_committed", "epoch": 1, "step_in_epoch": 0, "global_step": 40, "path": "s/ckpt-000000000040"},
     "checkpoint committed at global step 40 (end of epoch 1) -> s/ckpt-000000000040"),
    ({"event": "checkpoint_rejected", "path": "s/ckpt-000000000010", "reason": "sha256 mismatch in ckpt.index",
      "global_step": 10},
     "checkpoint s/ckpt-000000000010 rejected: sha256 mismatch in ckpt.index"),
    ({"event": "checkpoint_failed", "global_step": 30, "error": "OSError: disk full"},
     "saving global step 30 failed in the background: OSError: disk full"),
    ({"event": "storage_retry", "op": "put", "path": "s/ckpt-000000000010/ckpt.index", "try_number": 1,
      "error": "ConnectionError: reset", "wait_s": 0.512},
     "storage put of s/ckpt-000000000010/ckpt.index failed (ConnectionError: reset); try 1 again in 0.5 s"),
    ({"event": "storage_claimed", "storage": "s3://b/x", "previous_run_id": "r-1", "previous_run_dir": "runs/old",
      "forced": True},
     "took over storage s3://b/x from run r-1 (runs/old) as --force-storage asked"),
    ({"event": "stale_writer_fenced", "generation": 1, "newer_generation": 2, "op": "commit",
      "path": "s/ckpt-000000000010"},
     "refused to let a worker of a superseded attempt (generation 1, now 2) commit s/ckpt-000000000010"),
    ({"event": "gang_restart", "attempt": 2, "reason": "attempt 1 failed (killed by SIGKILL); restart 1 of 3",
      "root_cause_rank": 1, "backoff_s": 0.25},
     "restarting every worker as attempt 2 in 0.2 s: attempt 1 failed (killed by SIGKILL); restart 1 of 3"),
    ({"event": "hang_detected", "rank": 1, "seconds": 31.2, "global_step": 24, "epoch": 0, "step_in_epoch": 24,
      "where": "main thread in input_hang.py:47 _read", "stacks": "runs/x/attempt-1/stacks-1.txt"},
     "hang: rank 1 made no progress for 31 s at global step 24 (epoch 1, step 24); "
     "main thread in input_hang.py:47 _read (stacks: runs/x/attempt-1/stacks-1.txt)"),
    ({"event": "model_exported", "path": "runs/d/model", "global_step": 200, "weights_sha256": "c" * 64,
      "files": {"keras": "model.keras"}},
     "model of global step 200 exported to runs/d/model"),
    ({"event": "model_export_failed", "path": "runs/d/model", "error": "ValueError: no signature"},
     "could not export the model to runs/d/model (the run still completes): ValueError: no signature"),
    ({"event": "ray_connected", "address": "10.0.0.1:6379", "nodes": 3},
     "joined the Ray cluster at 10.0.0.1:6379 (3 nodes alive)"),
    ({"event": "node_lost", "node": "ab12", "node_ip": "10.0.0.2", "slot": 1, "pid": 4242, "error": "ActorDiedError"},
     "node 10.0.0.2 was lost with worker slot 1 (pid 4242)"),
    ({"event": "chaos_fault_injected", "op": "sigkill_worker", "target": "rank 1", "trigger": "checkpoint_committed #2"},
     "chaos harness: sigkill_worker on rank 1 (trigger: checkpoint_committed #2)"),
    ({"event": "rescue_committed", "global_step": 16, "rank": 1, "snapshot_age_s": 0.066, "seconds": 0.175},
     "rescue: rank 1 committed its in-memory snapshot of global step 16 (taken 0.066 s before, committed in 0.175 s)"),
    ({"event": "rescue_skipped", "rank": 0, "reason": "no snapshot yet"},
     "rescue: rank 0 committed nothing: no snapshot yet; the restart restores the last commit"),
    ({"event": "rescue_abandoned", "rank": 0, "reason": "no answer within 80 s", "waited_s": 80.0},
     "rescue: abandoned (no answer within 80 s); the restart restores the last commit"),
]


# Shown as printed, without the clock (test_a_script_line_is_shown_as_printed).
AS_PRINTED = {"script_output"}


@pytest.mark.parametrize("record, sentence", SENTENCES, ids=[f"{i}-{r['event']}" for i, (r, _) in enumerate(SENTENCES)])
def test_each_shown_event_is_one_exact_sentence(record, sentence):
    assert render_event({"ts": TS, **record}) == "10:00:00  " + sentence


def test_every_shown_event_has_a_sentence_case():
    assert {record["event"] for record, _ in SENTENCES} == SHOWN - AS_PRINTED


def test_a_script_line_is_shown_as_printed_without_a_clock_empty_lines_too(tmp_path):
    path, out, tail = tail_for(tmp_path)
    write(path, {"event": "script_output", "text": "hello from the script", "rank": 0, "attempt": 1},
          {"event": "script_output", "text": "", "rank": 0, "attempt": 1},
          {"event": "script_output", "text": "  indented: 0.5", "rank": 0, "attempt": 1},
          {"event": "checkpoint_committed", **AT, "path": "s/ckpt-000000000060"})
    tail.pump()
    assert out.getvalue() == ("hello from the script\n\n  indented: 0.5\n"
                              "10:00:00  checkpoint committed at global step 60 (epoch 2, step 20) -> s/ckpt-000000000060\n")
    assert render_event({"ts": TS, "event": "script_output", "text": "x=1"}) == "x=1"


def test_some_occurrences_of_shown_events_say_nothing_new():
    quiet = [
        {"event": "run_finished", "status": "completed", "global_step": 200, "restarts": 0, "preemptions": 0,
         "lost_steps": 0},
        {"event": "storage_claimed", "storage": "s", "previous_run_id": None, "previous_run_dir": None, "forced": False},
        {"event": "world_size_changed", "attempt": 3, "from": 2, "to": 1, "reason": "capacity fell"},
    ]
    assert [render_event({"ts": TS, **record}) for record in quiet] == [None, None, None]


def test_a_record_missing_its_sentence_fields_is_shown_as_its_fields_not_raised():
    assert render_event({"ts": TS, "event": "gang_restart", "attempt": 2}) == "10:00:00 gang_restart           attempt=2"


def test_an_event_the_table_does_not_know_is_shown_as_its_fields():
    assert render_event({"ts": TS, "event": "brand_new", "x": 1}) == "10:00:00 brand_new              x=1"


# ------------------------------------------------------------ hidden events and --verbose

HIDDEN_RECORDS = [
    {"event": "iterator_state_sized", "bytes": [579259, 578533], "max_bytes": 262144, "kept": False},
    {"event": "checkpoint_waited", "global_step": 40, "in_flight_step": 20, "waited_ms": 31.5},
    {"event": "generation_claimed", "generation": 1, "attempt": 1, "path": "s/generations/gen-1.json", "rank": 0},
    {"event": "standby_started", "pid": 4242},
    {"event": "worker_exited", "rank": 1, "pid": 4242, "attempt": 1, "exit_code": 0, "state": "exited"},
    {"event": "run_state", "from": "running", "to": "stopping", "attempt": 1, "reason": "worker 1 exited abnormally"},
    {"event": "input_digest", "epoch": 0, "sha256": "ab" * 4},
]


def test_hidden_events_print_nothing_by_default_and_their_fields_with_verbose(tmp_path):
    path, out, tail = tail_for(tmp_path)
    write(path, *HIDDEN_RECORDS)
    assert [r["event"] for r in tail.pump()] == [r["event"] for r in HIDDEN_RECORDS]
    assert out.getvalue() == ""

    verbose_dir = tmp_path / "verbose"
    verbose_dir.mkdir()
    path, out, tail = tail_for(verbose_dir, verbose=True)
    write(path, *HIDDEN_RECORDS)
    tail.pump()
    assert out.getvalue().splitlines() == [
        "10:00:00 iterator_state_sized   bytes=[579259, 578533] max_bytes=262144 kept=False",
        "10:00:00 checkpoint_waited      global_step=40 in_flight_step=20 waited_ms=31.5",
        "10:00:00 generation_claimed     generation=1 attempt=1 path=s/generations/gen-1.json rank=0",
        "10:00:00 standby_started        pid=4242",
        "10:00:00 worker_exited          rank=1 pid=4242 attempt=1 exit_code=0 state=exited",
        "10:00:00 run_state              from=running to=stopping attempt=1 reason=worker 1 exited abnormally",
        "10:00:00 input_digest           epoch=0 sha256=abababab",
    ]


def test_verbose_shows_sentence_events_and_progress_as_their_fields_too(tmp_path):
    path, out, tail = tail_for(tmp_path, verbose=True, epochs=5)
    progress = {"event": "train_progress", **AT, "steps_per_epoch": 40, "steps_per_s": 20.0, "loss": 0.5}
    commit = {"event": "checkpoint_committed", **AT, "path": "s/ckpt-000000000060"}
    write(path, progress, commit)
    tail.pump()
    assert out.getvalue().splitlines() == [render_line({"ts": TS, **progress}), render_line({"ts": TS, **commit})]
    assert out.getvalue().splitlines()[0] == (
        "10:00:00 train_progress         epoch=1 step_in_epoch=20 global_step=60 steps_per_epoch=40 steps_per_s=20 "
        "loss=0.5")


# ------------------------------------------------------------ what the tail remembers

def test_a_fresh_start_after_the_only_checkpoint_was_rejected_says_so(tmp_path):
    path, out, tail = tail_for(tmp_path)
    write(path, {"event": "checkpoint_rejected", "path": "/c/ckpt-000000000010", "reason": "sha256 mismatch in ckpt.index",
                 "global_step": 10},
          {"event": "fresh_start", "epoch": 0, "step_in_epoch": 0, "global_step": 0})
    tail.pump()
    lines = out.getvalue().splitlines()
    assert lines == [
        "10:00:00  checkpoint /c/ckpt-000000000010 rejected: sha256 mismatch in ckpt.index",
        "10:00:00  no restorable checkpoint: 1 checkpoint was rejected (see above); starting from step 0",
    ]
    write(path, {"event": "fresh_start", "epoch": 0, "step_in_epoch": 0, "global_step": 0})
    tail.pump()
    assert out.getvalue().splitlines()[-1] == "10:00:00  no checkpoint found: starting from step 0"


def test_a_restore_after_a_failed_attempt_says_how_many_steps_were_lost(tmp_path):
    path, out, tail = tail_for(tmp_path)
    write(path,
          {"event": "worker_exited", "rank": 1, "pid": 9, "attempt": 1, "signal": "SIGKILL", "state": "exited"},
          {"event": "worker_failed", "rank": 1, "pid": 9, "attempt": 1, "signal": "SIGKILL", "classification": "failed"},
          {"event": "attempt_reached", "attempt": 1, "global_step": 27},
          {"event": "gang_restart", "attempt": 2, "reason": "attempt 1 failed (killed by SIGKILL); restart 1 of 3",
           "root_cause_rank": 1, "backoff_s": 0.25},
          {"event": "restored", "attempt": 2, "rank": 0, "epoch": 0, "step_in_epoch": 20, "global_step": 20,
           "checkpoint": "s/ckpt-000000000020"},
          {"event": "attempt_reached", "attempt": 2, "global_step": 3},
          {"event": "fresh_start", "attempt": 3, "rank": 0, "epoch": 0, "step_in_epoch": 0, "global_step": 0})
    tail.pump()
    assert out.getvalue().splitlines() == [
        "10:00:00  restarting every worker as attempt 2 in 0.2 s: attempt 1 failed (killed by SIGKILL); restart 1 of 3",
        "10:00:00  restored global step 20 (epoch 1, step 20) from s/ckpt-000000000020; lost 7 steps (they are "
        "trained again)",
        "10:00:00  no checkpoint found: starting from step 0; lost 3 steps (they are trained again)",
    ]


def test_a_stop_request_is_one_line_per_attempt_however_many_workers_get_it(tmp_path):
    path, out, tail = tail_for(tmp_path)
    write(path, {"event": "preemption_requested", "source": "supervisor:SIGTERM"},
          *({"event": "preemption_requested", "source": f"worker:{rank}", "rank": rank} for rank in range(3)),
          {"event": "preempted", "global_step": 12},
          {"event": "restored", "attempt": 2, "epoch": 0, "step_in_epoch": 12, "global_step": 12, "checkpoint": "c"},
          {"event": "preemption_requested", "source": "worker:2", "rank": 2})
    tail.pump()
    assert out.getvalue().splitlines() == [
        "10:00:00  the run got SIGTERM: the workers save at one agreed step, then stop",
        "10:00:00  saved global step 12 and stopped",
        "10:00:00  restored global step 12 (epoch 1, step 12) from c",
        "10:00:00  worker 2 got a stop signal: the workers save at one agreed step, then stop",
    ]


def test_progress_commit_and_restore_lines_number_the_same_epoch_the_same_way():
    at = {"ts": "2026-11-23T06:55:29", **AT}
    progress = progress_line({**at, "event": "train_progress", "steps_per_epoch": 40}, epochs=5, steps_per_s=20.0)
    commit = render_event({**at, "event": "checkpoint_committed", "path": "s/ckpt-000000000060"})
    restore = render_event({**at, "event": "restored", "checkpoint": "s/ckpt-000000000060"})
    assert progress == "06:55:29  step 60/200  30%  ETA 7s  epoch 2/5  20.0 steps/s"
    assert commit == "06:55:29  checkpoint committed at global step 60 (epoch 2, step 20) -> s/ckpt-000000000060"
    assert restore == "06:55:29  restored global step 60 (epoch 2, step 20) from s/ckpt-000000000060"


def test_a_hang_is_one_line_naming_rank_step_and_where():
    hang = {"event": "hang_detected", "ts": "2026-11-23T06:55:29", "rank": 1, "seconds": 31.2, "global_step": 24,
            "epoch": 0, "step_in_epoch": 24, "where": "main thread in input_hang.py:47 _read",
            "stacks": "runs/x/attempt-1/stacks-1.txt"}
    assert render_event(hang) == (
        "06:55:29  hang: rank 1 made no progress for 31 s at global step 24 (epoch 1, step 24); "
        "main thread in input_hang.py:47 _read (stacks: runs/x/attempt-1/stacks-1.txt)"
    )
    assert hang_line({**hang, "global_step": None}) == (
        "rank 1 made no progress for 31 s before its first step of the attempt; main thread in input_hang.py:47 _read"
    )


# ------------------------------------------------------------ the progress display

def progress(step, *, ts=TS, rate=27.12, epoch=None, steps_per_epoch=1_600, **metrics):
    return {"event": "train_progress", "ts": ts, "epoch": step // steps_per_epoch if epoch is None else epoch,
            "step_in_epoch": step % steps_per_epoch, "steps_per_epoch": steps_per_epoch, "global_step": step,
            "steps_per_s": rate, "steps_per_call": 4, **metrics}


def test_the_progress_line_shows_the_whole_run_its_percentage_and_eta():
    line = progress_line(progress(1_220, loss=0.41234, accuracy=0.88), epochs=5, steps_per_s=27.12)
    assert line == "10:00:00  step 1,220/8,000  15%  ETA 4m10s  epoch 1/5  loss 0.4123  accuracy 0.8800  27.1 steps/s"


@pytest.mark.parametrize("step, rate, expected", [
    (0, 10.0, "step 0/8,000  0%  ETA 13m20s"),
    (7_999, 2.0, "step 7,999/8,000  99%  ETA 0s"),  # 0.5 s rounds to 0: never 100% before the end
    (8_000, 2.0, "step 8,000/8,000  100%  ETA 0s"),
    (800, 0.5, "step 800/8,000  10%  ETA 4h00m"),
    (4_000, 0.0, "step 4,000/8,000  50%"),  # no rate, no ETA
])
def test_percentage_and_eta_for_given_numbers(step, rate, expected):
    assert progress_line(progress(step), epochs=5, steps_per_s=rate).startswith(f"10:00:00  {expected}  epoch ")


def test_without_a_steady_rate_the_line_says_no_eta():
    assert progress_line(progress(1_220), epochs=5, steps_per_s=3.0, eta=False) == (
        "10:00:00  step 1,220/8,000  15%  epoch 1/5  3.0 steps/s")
    assert progress_line(progress(1_220), epochs=5, steps_per_s=None) == "10:00:00  step 1,220/8,000  15%  epoch 1/5"


def test_a_resumed_run_counts_its_percentage_from_the_global_step():
    # 3 of 5 epochs were trained before the restart: the display starts at 60%, not 0%.
    line = progress_line(progress(4_810, epoch=3), epochs=5, steps_per_s=31.9)
    assert line == "10:00:00  step 4,810/8,000  60%  ETA 1m40s  epoch 4/5  31.9 steps/s"


def test_without_the_planned_epochs_the_line_shows_step_and_epoch_only():
    assert progress_line(progress(1_220), epochs=None, steps_per_s=27.12) == "10:00:00  step 1,220  epoch 1  27.1 steps/s"


def test_on_a_terminal_progress_redraws_one_line_and_is_wiped_before_other_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    out = io.StringIO()
    tail = EventTail(path, Console(out, tty=True, width=80), epochs=5)
    write(path, progress(100, rate=5.0), progress(1_220, rate=27.12))
    tail.pump()
    first = "10:00:00  step 100/8,000  1%  epoch 1/5"  # the first includes tracing: no rate, no ETA
    second = "10:00:00  step 1,220/8,000  15%  epoch 1/5  27.1 steps/s"  # its own rate; no steady one yet
    assert out.getvalue() == "\r" + first + "\r" + second.ljust(len(first))
    write(path, {"event": "epoch_finished", "epoch": 0, "global_step": 1_600, "loss": 0.5, "metrics": {}})
    tail.pump()
    assert out.getvalue() == (
        "\r" + first + "\r" + second.ljust(len(first)) + "\r" + " " * len(second) + "\r"
        + "10:00:00  epoch 1 finished  loss 0.5000\n"
    )
    tail.console.write("Run completed\n")  # the supervisor's own lines: nothing to wipe now
    assert out.getvalue().endswith("loss 0.5000\nRun completed\n")


def test_on_a_terminal_the_line_is_cut_to_the_width():
    out = io.StringIO()
    console = Console(out, tty=True, width=20)
    console.progress("x" * 30)
    console.write("next\n")
    assert out.getvalue() == "\r" + "x" * 19 + "\r" + " " * 19 + "\r" + "next\n"


def at(second, **fields):
    """An event at 10:00:00 + ``second`` (fractions kept: the ETA's clock is the events' ts)."""
    minutes, seconds = divmod(second, 60)
    return {"ts": f"2026-11-23T10:{int(minutes):02d}:{seconds:06.3f}+00:00", **fields}


def test_in_a_log_progress_is_a_line_every_ten_seconds_from_the_second_event(tmp_path):
    path, out, tail = tail_for(tmp_path, epochs=5)
    write(path, *(progress(100 * i, ts=at(i)["ts"], rate=20.0) for i in range(0, 24, 2)))
    tail.pump()
    assert "\r" not in out.getvalue()
    # 100 steps/s by the events' clock from the second event on (their own 20.0 is shown only
    # until that is measured: 3 events and 3 s after it)
    assert out.getvalue().splitlines() == [
        "10:00:02  step 200/8,000  2%  epoch 1/5  20.0 steps/s",
        "10:00:12  step 1,200/8,000  15%  ETA 1m08s  epoch 1/5  100.0 steps/s",
        "10:00:22  step 2,200/8,000  27%  ETA 58s  epoch 2/5  100.0 steps/s",
    ]


def test_no_eta_from_the_first_call_nor_from_a_restarts_first_seconds(tmp_path):
    # Issue 51 as a run showed it (300 steps at ~50 steps/s): the old console said
    # "step 2/300  0%  ETA 12m25s" (the second call's 1 step in 2.5 s), and after the
    # restart "step 152/300  50%  ETA 6m29s".
    path, out, tail = tail_for(tmp_path, epochs=2)
    calls = [(1, 5.0, 0.2), (2, 7.5, 0.4), (52, 8.5, 50.0), (102, 9.5, 50.0), (152, 10.5, 50.0)]
    restart = [(151, 30.0, 0.1), (152, 32.6, 0.4), (202, 33.6, 50.0), (252, 34.6, 50.0), (300, 35.6, 48.0)]

    def events(attempt, rows):
        first, t0, _ = rows[0]
        yield at(t0, event="first_step", global_step=first, attempt=attempt)
        for step, second, rate in rows:
            yield {**progress(step, rate=rate, epoch=(step - 1) // 150, steps_per_epoch=150), **at(second),
                   "attempt": attempt}

    write(path, *events(1, calls), at(11.0, event="restored", epoch=1, step_in_epoch=0, global_step=150,
                                      checkpoint="s/ckpt-000000000150", attempt=2), *events(2, restart))
    tail.console.tty = True  # every progress event redrawn, as on a terminal
    tail.pump()
    lines = [line.strip() for line in out.getvalue().replace("\r", "\n").splitlines() if "%" in line]
    assert lines == [
        "10:00:05  step 1/300  0%  epoch 1/2",  # the first call: no rate, no ETA
        "10:00:07  step 2/300  0%  epoch 1/2  0.4 steps/s",  # was "ETA 12m25s"
        "10:00:08  step 52/300  17%  epoch 1/2  50.0 steps/s",
        "10:00:09  step 102/300  34%  epoch 1/2  50.0 steps/s",
        "10:00:10  step 152/300  50%  ETA 3s  epoch 2/2  50.0 steps/s",  # 150 steps / 3 s after the second call
        "10:00:30  step 151/300  50%  epoch 2/2",  # the restart's first call
        "10:00:32  step 152/300  50%  epoch 2/2  0.4 steps/s",  # was "ETA 6m29s"
        "10:00:33  step 202/300  67%  epoch 2/2  50.0 steps/s",
        "10:00:34  step 252/300  84%  epoch 2/2  50.0 steps/s",
        "10:00:35  step 300/300  100%  ETA 0s  epoch 2/2  49.3 steps/s",  # 148 steps / 3 s
    ]


def test_a_fit_scripts_progress_has_its_total_percentage_and_eta(tmp_path):
    # The supervisor cannot read a fit script's epochs (tail epochs=None); the event says them.
    path, out, tail = tail_for(tmp_path, epochs=None)
    write(path, *({**progress(step, steps_per_epoch=100, rate=9.0, accuracy=0.9407, loss=0.2667), **at(second),
                   "epochs": 3} for step, second in ((1, 0.0), (41, 1.0), (81, 2.0), (121, 3.0), (177, 12.0))))
    tail.pump()
    assert out.getvalue().splitlines() == [
        "10:00:01  step 41/300  13%  epoch 1/3  accuracy 0.9407  loss 0.2667  9.0 steps/s",
        "10:00:12  step 177/300  59%  ETA 10s  epoch 2/3  accuracy 0.9407  loss 0.2667  12.4 steps/s",
    ]
