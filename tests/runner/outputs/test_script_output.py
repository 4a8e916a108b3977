"""The chief's stdout tee: every write reaches the log unchanged, each complete line is one event."""

from __future__ import annotations

import io
import json
import sys
import threading

from resilient_train.rundir import events
from resilient_train.runner.outputs.script_output import EVENT, LineTee, tee_stdout


def make_tee():
    log, lines = io.StringIO(), []
    return LineTee(log, lines.append), log, lines


def test_each_complete_line_is_one_emit_and_every_write_reaches_the_stream():
    tee, log, lines = make_tee()
    assert tee.write("hello from the script\n") == 22
    tee.write("two\nlines\n")
    tee.write("\n")  # print(): an empty line
    assert lines == ["hello from the script", "two", "lines", ""]
    assert log.getvalue() == "hello from the script\ntwo\nlines\n\n"


def test_a_line_written_in_pieces_is_emitted_once_when_it_ends():
    tee, log, lines = make_tee()
    print("epoch", end="", file=tee)
    print(" 1", end=" ", file=tee)
    assert lines == []
    print("done", file=tee)
    assert lines == ["epoch 1 done"]
    tee.write("a\nb")  # a line ends and the next begins in one write
    assert lines == ["epoch 1 done", "a"]
    assert log.getvalue() == "epoch 1 done\na\nb"


def test_flush_emits_nothing_and_finish_emits_the_unfinished_last_line_once():
    tee, log, lines = make_tee()
    tee.write("50%")
    tee.flush()  # a progress bar flushes half lines: still one line on a terminal
    assert lines == []
    tee.write(" 100%")
    tee.finish()
    assert lines == ["50% 100%"]
    tee.finish()  # nothing left: nothing more
    tee.write("\n")  # the newline that ends what finish() already sent is an empty line of its own
    assert lines == ["50% 100%", ""]
    assert log.getvalue() == "50% 100%\n"


def test_writelines_and_other_attributes_are_the_streams():
    tee, log, lines = make_tee()
    tee.writelines(["a\n", "b", "c\n"])
    assert lines == ["a", "bc"]
    assert tee.getvalue() == "a\nbc\n"  # StringIO's own method, through the tee
    assert tee.isatty() is False


def test_a_print_while_emitting_goes_to_the_stream_only():
    log, lines = io.StringIO(), []

    def emit(line):  # an event listener that prints
        lines.append(line)
        tee.write(f"(listener saw {line})\n")

    tee = LineTee(log, emit)
    tee.write("x\n")
    assert lines == ["x"]
    assert log.getvalue() == "x\n(listener saw x)\n"


def test_an_unwritable_event_file_loses_the_console_copy_not_the_print():
    def emit(line):
        raise OSError(28, "No space left on device")

    log = io.StringIO()
    tee = LineTee(log, emit)
    assert tee.write("still printed\n") == 14
    assert log.getvalue() == "still printed\n"


def test_lines_of_two_threads_never_mix():
    tee, _, lines = make_tee()

    def printer(name):
        for i in range(200):
            print(f"{name} {i}", file=tee)

    threads = [threading.Thread(target=printer, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(lines) == sorted(f"{name} {i}" for name in "ab" for i in range(200))
    assert [line for line in lines if line[0] == "a"] == [f"a {i}" for i in range(200)]


def test_tee_stdout_writes_script_output_events_and_puts_stdout_back(tmp_path, capsys):
    """As the chief's worker installs it: events in events.jsonl, not echoed as key=value lines."""
    path = tmp_path / "events.jsonl"
    console = io.StringIO()
    events.configure(path, console=console, run_id="r1", attempt=1, rank=0, role="chief")
    before = sys.stdout
    with tee_stdout(lambda line: events.emit(EVENT, echo=False, text=line)) as tee:
        assert sys.stdout is tee
        print("hello from the script")
        print("no newline at the end", end="")
    assert sys.stdout is before
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [{k: r[k] for k in ("event", "text", "rank", "attempt", "run_id")} for r in records] == [
        {"event": "script_output", "text": "hello from the script", "rank": 0, "attempt": 1, "run_id": "r1"},
        {"event": "script_output", "text": "no newline at the end", "rank": 0, "attempt": 1, "run_id": "r1"},
    ]
    assert capsys.readouterr().out == "hello from the script\nno newline at the end"
    assert console.getvalue() == ""  # the log has the printed text already
    events.configure(None)  # no later test writes into this one's tmp_path
