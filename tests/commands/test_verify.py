"""The ``verify`` / ``ls`` commands: table, JSON and exit codes."""

from __future__ import annotations

import io
import json

from resilient_train.checkpoint import Status
from resilient_train.checkpoint.manifest import MANIFEST_NAME
from resilient_train.commands.verify import format_rows, ls_command, verify_command
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

from tests.support.storage import DATA_FILE, FILES, Backend


def run(url: str, options: dict, *, as_json: bool, hash: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_command(url, options, as_json=as_json, hash=hash, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_all_good_exits_0_and_json_lists_every_directory(memory_backend: Backend) -> None:
    backend = memory_backend
    store = backend.store()
    backend.commit(store, 11)
    backend.commit(store, 25)
    fs, root = backend.raw_fs(store)
    fs.pipe_file(f"{root}/ckpt-000000000030/ckpt.index", b"half an upload")

    code, out, err = run(store.url, {}, as_json=True, hash=True)
    assert (code, err) == (EXIT_OK, "")
    record = json.loads(out)
    assert record["url"] == store.url
    assert record["newest_restorable"] == 25
    assert record["checkpoints"] == [
        {"global_step": 11, "epoch": 1, "step_in_epoch": 1, "size": sum(FILES.values()), "status": "ok",
         "detail": "", "path": f"{store.url}/ckpt-000000000011", "exact": True, "inexact": [], "skipped_steps": []},
        {"global_step": 25, "epoch": 2, "step_in_epoch": 5, "size": sum(FILES.values()), "status": "ok",
         "detail": "", "path": f"{store.url}/ckpt-000000000025", "exact": True, "inexact": [], "skipped_steps": []},
        {"global_step": 30, "epoch": None, "step_in_epoch": None, "size": 14, "status": "uncommitted",
         "detail": "no manifest", "path": f"{store.url}/ckpt-000000000030", "exact": None, "inexact": [], "skipped_steps": []},
    ]


def test_table_names_the_damage_and_the_newest_restorable(memory_backend: Backend) -> None:
    backend = memory_backend
    store = backend.store()
    for gs in (1, 2, 3):
        backend.commit(store, gs)
    fs, root = backend.raw_fs(store)
    data = bytearray(fs.cat_file(f"{root}/ckpt-000000000003/{DATA_FILE}"))
    data[0] ^= 0xFF
    fs.pipe_file(f"{root}/ckpt-000000000003/{DATA_FILE}", bytes(data))
    fs.rm_file(f"{root}/ckpt-000000000002/ckpt.index")

    code, out, _ = run(store.url, {}, as_json=False, hash=True)
    assert code == EXIT_FAILURE
    lines = out.splitlines()
    assert lines[0] == store.url
    # One numbering for people: the console's "epoch 1, step 1" (the manifest says epoch 0).
    assert lines[1].split() == ["global_step", "where", "size", "status"]
    assert lines[2].split() == ["1", "epoch", "1,", "step", "1", "20.8", "KiB", "ok"]
    assert lines[3].endswith("torn: missing file ckpt.index")
    assert lines[4].endswith(f"corrupt: sha256 mismatch in {DATA_FILE}")
    assert lines[5] == f"newest restorable: global_step 1 ({store.url}/ckpt-000000000001)"
    assert lines[6] == "2 committed checkpoints failed verification"

    # ls does not hash: the flipped byte is invisible to it, the missing file is not
    out2 = io.StringIO()
    assert ls_command(store.url, {}, as_json=False, out=out2) == EXIT_FAILURE
    assert "corrupt" not in out2.getvalue()
    assert "newest restorable: global_step 3" in out2.getvalue()


def test_empty_root_fails_with_no_committed_checkpoint(memory_backend: Backend) -> None:
    url = memory_backend.new_url()
    code, out, _ = run(url, {}, as_json=False, hash=True)
    assert code == EXIT_FAILURE
    assert out.splitlines()[1:] == ["no checkpoints", "newest restorable: none", f"no committed checkpoint under {url}"]


def test_only_uncommitted_leftovers_fail_with_no_committed_checkpoint(memory_backend: Backend) -> None:
    store = memory_backend.store()
    fs, root = memory_backend.raw_fs(store)
    fs.pipe_file(f"{root}/ckpt-000000000030/ckpt.index", b"half an upload")
    code, out, _ = run(store.url, {}, as_json=False, hash=True)
    assert code == EXIT_FAILURE
    assert out.splitlines()[-1] == f"no committed checkpoint under {store.url}"


def test_a_truncated_manifest_is_a_corrupt_manifest_and_fails(memory_backend: Backend) -> None:
    store = memory_backend.store()
    memory_backend.commit(store, 4)
    memory_backend.commit(store, 8)
    fs, root = memory_backend.raw_fs(store)
    path = f"{root}/ckpt-000000000008/{MANIFEST_NAME}"
    fs.pipe_file(path, fs.cat_file(path)[:40])
    code, out, _ = run(store.url, {}, as_json=False, hash=True)
    assert code == EXIT_FAILURE
    lines = out.splitlines()
    assert lines[3].split()[:4] == ["8", "-", "20.8", "KiB"]
    assert "corrupt manifest: " in lines[3]
    assert lines[4] == f"newest restorable: global_step 4 ({store.url}/ckpt-000000000004)"
    assert lines[5] == "1 committed checkpoint failed verification"


def test_paths_that_are_not_checkpoint_roots_exit_2(tmp_path) -> None:
    missing = tmp_path / "nope"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    run_dir = tmp_path / "runs" / "r"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run_id": "abc"}')
    for url, fragment in (
        (str(missing), f"{missing} does not exist; expected a checkpoint root"),
        (str(a_file), f"{a_file} is a file; expected a checkpoint root directory"),
        (str(run_dir), f"{run_dir} is a run directory, not a checkpoint root; its checkpoints are in {run_dir / 'checkpoints'}"),
    ):
        code, out, err = run(url, {}, as_json=False, hash=True)
        assert (code, out) == (EXIT_USAGE, "")
        assert err == f"error: {fragment}" + err[len("error: ") + len(fragment):]
        assert len(err.splitlines()) == 1
    assert not missing.exists()


def test_storage_error_exits_2_with_a_short_message() -> None:
    code, out, err = run("nope://bucket/run", {}, as_json=False, hash=True)
    assert code == EXIT_USAGE
    assert out == ""
    assert len(err.splitlines()) == 1
    assert "nope://bucket/run" in err


def test_format_rows_of_an_unreadable_manifest(memory_backend: Backend) -> None:
    backend = memory_backend
    store = backend.store()
    backend.commit(store, 4)
    fs, root = backend.raw_fs(store)
    fs.pipe_file(f"{root}/ckpt-000000000004/{MANIFEST_NAME}", b'{"schema_version": 7}')
    infos = store.list()
    assert [(i.status, i.detail) for i in infos] == [
        (Status.UNCOMMITTED, "manifest unreadable: unsupported schema_version 7 (this reader knows 1)")]
    assert format_rows(infos).splitlines()[1].endswith(
        "corrupt manifest: unsupported schema_version 7 (this reader knows 1)")


def test_the_cli_ls_lists_without_hashing_and_verify_hashes(memory_backend: Backend, capsys) -> None:
    from resilient_train.cli import main

    store = memory_backend.store()
    memory_backend.commit(store, 5)
    fs, root = memory_backend.raw_fs(store)
    data = bytearray(fs.cat_file(f"{root}/ckpt-000000000005/{DATA_FILE}"))
    data[0] ^= 0xFF
    fs.pipe_file(f"{root}/ckpt-000000000005/{DATA_FILE}", bytes(data))

    assert main(["ls", store.url, "--json"]) == EXIT_OK  # a flipped byte is invisible without hashing
    assert [c["status"] for c in json.loads(capsys.readouterr().out)["checkpoints"]] == ["ok"]
    assert main(["verify", store.url, "--json"]) == EXIT_FAILURE
    assert [c["status"] for c in json.loads(capsys.readouterr().out)["checkpoints"]] == ["corrupt"]


def test_the_table_counts_epochs_from_1_as_the_console_and_json_keeps_the_manifest(tmp_path) -> None:
    # Issue 36: the console said "(epoch 2, step 100)" where the table said "epoch 1, step_in_epoch 100".
    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.supervisor.console import render_event

    store = CheckpointStore(str(tmp_path / "ckpts"))
    for step, epoch, step_in_epoch in ((120, 1, 20), (200, 2, 0)):  # 100 steps per epoch
        local = tmp_path / f"fake-{step}"
        local.mkdir()
        (local / "weights").write_bytes(b"w")
        store.commit(local, run_id="fake", epoch=epoch, step_in_epoch=step_in_epoch, global_step=step,
                     world_size=1, weights_sha256="0" * 64, tf_version="fake")
    out = io.StringIO()
    assert ls_command(store.url, {}, as_json=False, out=out) == EXIT_OK
    assert out.getvalue().splitlines()[1:4] == [
        "global_step  where             size  status",
        "        120  epoch 2, step 20   1 B  ok",
        "        200  end of epoch 2     1 B  ok",
    ]
    console = [render_event({"event": "checkpoint_committed", "global_step": 120, "epoch": 1, "step_in_epoch": 20,
                             "path": "P"}),
               render_event({"event": "checkpoint_committed", "global_step": 200, "epoch": 2, "step_in_epoch": 0,
                             "path": "P"})]
    assert [line.strip() for line in console] == ["checkpoint committed at global step 120 (epoch 2, step 20) -> P",
                                                  "checkpoint committed at global step 200 (end of epoch 2) -> P"]
    out = io.StringIO()
    ls_command(store.url, {}, as_json=True, out=out)
    assert [(c["epoch"], c["step_in_epoch"]) for c in json.loads(out.getvalue())["checkpoints"]] == [(1, 20), (2, 0)]


def test_a_checkpoint_with_an_inexact_resume_behind_it_is_said_not_exact_and_still_passes(tmp_path) -> None:
    # Issue 51: a resume whose input differed was said once mid-run; the checkpoints after it
    # carry it (extra["inexact"]), and verify/ls say it of the newest restorable one.
    from resilient_train.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path / "ckpts"))
    entry = {"cause": "input_mismatch", "epoch": 1, "checkpoint": "ckpt-000000000010"}
    for step, extra in ((10, {}), (20, {"inexact": [entry]})):
        local = tmp_path / f"fake-{step}"
        local.mkdir()
        (local / "weights").write_bytes(b"w")
        store.commit(local, run_id="fake", epoch=step // 10, step_in_epoch=0, global_step=step, world_size=2,
                     weights_sha256="0" * 64, tf_version="fake", extra=extra)
    for command in (lambda out: verify_command(store.url, {}, as_json=False, hash=True, out=out),
                    lambda out: ls_command(store.url, {}, as_json=False, out=out)):
        out = io.StringIO()
        assert command(out) == EXIT_OK
        assert out.getvalue().splitlines()[-2:] == [
            f"newest restorable: global_step 20 ({store.url}/ckpt-000000000020)",
            "not exact: global_step 20 is not an uninterrupted run's: epoch 2's input differed from the one recorded "
            "with ckpt-000000000010",
        ]
    out = io.StringIO()
    assert verify_command(store.url, {}, as_json=True, hash=True, out=out) == EXIT_OK
    assert [(c["global_step"], c["exact"], c["inexact"]) for c in json.loads(out.getvalue())["checkpoints"]] == [
        (10, True, []), (20, False, [entry])]


def test_the_batches_a_run_skipped_are_named_for_the_newest_and_listed_per_checkpoint(tmp_path) -> None:
    # Issue 48: a deterministic anomaly's batch skipped (--deterministic-anomaly skip) is in every
    # later checkpoint's extra; verify and ls name them, --json lists them per checkpoint.
    from resilient_train.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path / "ckpts"))
    for step, extra in ((4, {}), (8, {"skipped_steps": [6]}), (12, {"skipped_steps": [6, 11]})):
        local = tmp_path / f"fake-{step}"
        local.mkdir()
        (local / "weights").write_bytes(b"w")
        store.commit(local, run_id="fake", epoch=0, step_in_epoch=step, global_step=step, world_size=2,
                     weights_sha256="0" * 64, tf_version="fake", extra=extra)
    for command in (lambda out: verify_command(store.url, {}, as_json=False, hash=True, out=out),
                    lambda out: ls_command(store.url, {}, as_json=False, out=out)):
        out = io.StringIO()
        assert command(out) == EXIT_OK
        assert out.getvalue().splitlines()[-1] == (
            "skipped batches: global steps 6, 11 (deterministic anomalies, --deterministic-anomaly skip); a resume or "
            "re-run of this job skips them too")
    out = io.StringIO()
    assert verify_command(store.url, {}, as_json=True, hash=True, out=out) == EXIT_OK
    assert [(c["global_step"], c["skipped_steps"]) for c in json.loads(out.getvalue())["checkpoints"]] == [
        (4, []), (8, [6]), (12, [6, 11])]
