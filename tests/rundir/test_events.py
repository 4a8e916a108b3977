import io
import json
import multiprocessing

from resilient_train.rundir import events
from resilient_train.rundir.events import EventFile, render_line


def _append_many(path, writer, count):
    sink = EventFile(path)
    for i in range(count):
        sink.append({"event": "x", "writer": writer, "i": i, "pad": "p" * (i % 97) * 50})


def test_appends_from_several_processes_never_interleave(tmp_path):
    path = tmp_path / "events.jsonl"
    procs = [multiprocessing.Process(target=_append_many, args=(path, w, 300)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 1200
    for writer in range(4):
        assert [r["i"] for r in records if r["writer"] == writer] == list(range(300))


def test_group_events_reach_the_file_only_from_the_chief(tmp_path):
    path = tmp_path / "events.jsonl"
    console = io.StringIO()
    events.configure(path, console=console, writes_group_events=False, run_id="r1", attempt=2, rank=1, role="worker")
    events.emit("checkpoint_committed", group=True, global_step=4)
    events.emit("storage_retry", op="upload", try_number=1)
    events.configure(path, console=None, writes_group_events=True, run_id="r1", attempt=2, rank=0, role="chief")
    events.emit("checkpoint_committed", group=True, global_step=4)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["event"], r["rank"], r["attempt"], r["run_id"]) for r in records] == [
        ("storage_retry", 1, 2, "r1"),
        ("checkpoint_committed", 0, 2, "r1"),
    ]
    assert "checkpoint_committed" in console.getvalue()  # the worker's own log still shows it


def test_render_line_is_short_and_typed():
    line = render_line({"event": "restored", "ts": "2026-01-01T10:11:12.000+00:00", "global_step": 7, "loss": 0.123456})
    assert line == "10:11:12 restored               global_step=7 loss=0.1235"
