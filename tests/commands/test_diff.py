"""``resilient-train diff``: the comparison on hand-built trajectories, then the command on
run dirs (events.jsonl) and on storage (manifests)."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

from resilient_train.checkpoint.manifest import MANIFEST_NAME
from resilient_train.cli import main as cli_main
from resilient_train.commands.diff import Trajectory, compare_trajectories, diff_command
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

from tests.support.storage import Backend, write_ckpt_dir

W = {n: f"{n:x}" * 64 for n in range(1, 10)}  # distinct 64-hex weights digests
FP = {"recipe_sha256": "c" * 64, "params": {"units": 8}, "seed": 1, "epochs": 2, "steps_per_epoch": 10,
      "global_batch_size": 32, "workers": 2}


def traj(weights: dict[int, str], inputs: dict[int, str] | None = None, **fingerprint) -> Trajectory:
    return Trajectory("t", weights, inputs or {}, {**FP, **fingerprint})


def test_identical_trajectories_over_the_common_steps():
    a = traj({4: W[1], 8: W[2], 10: W[3]}, {0: W[5], 1: W[6]})
    b = traj({4: W[1], 8: W[2], 9: W[7], 10: W[3]}, {0: W[5], 1: W[6]})  # 9: a preemption's extra save
    result = compare_trajectories(a, b)
    assert result.identical
    assert (result.common_steps, result.only_a, result.only_b) == ((4, 8, 10), (), (9,))
    assert (result.first_divergent_step, result.last_matching_step) == (None, 10)
    assert (result.first_divergent_epoch, result.fingerprint_changes) == (None, ())


def test_the_first_divergent_step_and_the_last_match_before_it():
    a = traj({4: W[1], 8: W[2], 12: W[3], 16: W[4]})
    b = traj({4: W[1], 8: W[2], 12: W[5], 16: W[4]})  # 16 equal again by accident: still after the split
    result = compare_trajectories(a, b)
    assert not result.identical
    assert (result.first_divergent_step, result.last_matching_step) == (12, 8)


def test_other_seeds_diverge_at_the_first_commit_and_the_fingerprint_says_why():
    result = compare_trajectories(traj({4: W[1], 8: W[2]}), traj({4: W[3], 8: W[4]}, seed=2))
    assert (result.first_divergent_step, result.last_matching_step) == (4, None)
    assert result.fingerprint_changes == (("seed", 1, 2),)
    params = compare_trajectories(traj({4: W[1]}), traj({4: W[1]}, params={"units": 16}, workers=1))
    assert params.fingerprint_changes == (("params.units", 8, 16), ("workers", 2, 1))


def test_input_divergence_alone_is_a_divergence_naming_the_epoch():
    a = traj({4: W[1], 12: W[2]}, {0: W[5], 1: W[6]})
    b = traj({4: W[1], 12: W[2]}, {0: W[5], 1: W[7], 2: W[8]})
    result = compare_trajectories(a, b)
    assert (result.identical, result.first_divergent_step, result.first_divergent_epoch) == (False, None, 1)
    assert result.common_epochs == (0, 1)


def test_nothing_in_common_is_not_identical():
    result = compare_trajectories(traj({4: W[1]}), traj({8: W[1]}))
    assert not result.identical and result.common_steps == ()
    assert compare_trajectories(traj({}), traj({})).identical is False


# ------------------------------------------------------------------ the command


def write_run_dir(path: Path, committed: dict[int, str], inputs: dict[int, str], **fingerprint) -> Path:
    """A run dir as the runner leaves it: events.jsonl (two attempts) and fingerprint.json."""
    path.mkdir(parents=True)
    records = [{"event": "run_started", "storage": str(path / "checkpoints")}]
    records += [{"event": "input_digest", "epoch": e, "sha256": s} for e, s in inputs.items()]
    records += [{"event": "checkpoint_committed", "global_step": g, "epoch": g // 10, "step_in_epoch": g % 10,
                 "weights_sha256": s, "path": "x", "size": 1} for g, s in committed.items()]
    (path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "fingerprint.json").write_text(json.dumps({**FP, **fingerprint}))
    return path


def run(a: str, b: str, *, as_json: bool = False, options: dict | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = diff_command(a, b, options or {}, as_json=as_json, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_run_dirs_that_diverge_name_the_step_the_epoch_and_the_seed(tmp_path):
    a = write_run_dir(tmp_path / "a", {4: W[1], 8: W[2], 12: W[3]}, {0: W[5], 1: W[6]})
    b = write_run_dir(tmp_path / "b", {4: W[1], 8: W[4], 12: W[3]}, {0: W[5], 1: W[7]}, seed=7)
    code, out, err = run(str(a), str(b))
    assert (code, err) == (EXIT_FAILURE, "")
    lines = out.splitlines()
    assert lines[0] == f"A: {a} (events.jsonl): 3 committed steps, 2 epoch input digests"
    assert lines[2:] == [
        f"first divergent global step: 8 (A {W[2][:12]}, B {W[4][:12]})",
        "last matching global step: 4",
        f"first divergent epoch input: epoch 2 (first batch A {W[6][:12]}, B {W[7][:12]})",  # 1-based, as the console
        "job fingerprint differs: seed 1 -> 7",
        "diverged",
    ]
    code, out, _ = run(str(a), str(b), as_json=True)
    record = json.loads(out)
    assert (code, record["first_divergent_step"], record["last_matching_step"]) == (EXIT_FAILURE, 8, 4)
    assert record["first_divergent_epoch"] == 1
    assert record["fingerprint_changes"] == [{"field": "seed", "a": 1, "b": 7}]
    assert record["weights_sha256"] == {"a": W[2], "b": W[4]}


def test_a_run_dir_against_itself_exits_0_through_the_cli(tmp_path, capsys):
    a = write_run_dir(tmp_path / "a", {4: W[1], 8: W[2]}, {0: W[5]})
    assert cli_main(["diff", str(a), str(a)]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[2:] == [
        "weights identical at all 2 common committed steps (4..8)",
        "epoch inputs identical in all 1 common epochs",
        "job fingerprint: identical",
        "identical trajectories",
    ]


def test_neither_a_run_dir_nor_a_checkpoint_root_is_a_usage_error(tmp_path):
    a = write_run_dir(tmp_path / "a", {4: W[1]}, {})
    code, out, err = run(str(a), str(tmp_path / "missing"))
    assert (code, out) == (EXIT_USAGE, "")
    assert err == f"resilient-train diff: {tmp_path / 'missing'} does not exist; expected a run dir or a storage URL\n"
    (tmp_path / "empty").mkdir()
    code, _, err = run(str(tmp_path / "empty"), str(a))
    assert code == EXIT_USAGE and err.count("\n") == 1 and "neither a run dir" in err


def commit(backend: Backend, store, step: int, weights: str, epoch_input: tuple[int, str]) -> None:
    local = write_ckpt_dir(backend.tmp_path / f"stage-{uuid.uuid4().hex[:8]}", step)
    store.commit(local, run_id="run-1", epoch=step // 10, step_in_epoch=step % 10, global_step=step, world_size=2,
                 weights_sha256=weights, tf_version="2.21.0",
                 extra={"fingerprint": FP, "input_digest": {"epoch": epoch_input[0], "sha256": epoch_input[1]}})


def test_storage_with_an_edited_input_digest_names_the_epoch(backend: Backend):
    """An unseeded input resumed without the runner's seeding: same weights so far, other first batch."""
    reference, resumed = backend.store(), backend.store()
    for store in (reference, resumed):
        for step, epoch in ((5, 0), (10, 1), (15, 1)):
            commit(backend, store, step, W[step // 5], (epoch, W[5 + epoch]))
    assert run(reference.url, resumed.url, options=backend.options)[0] == EXIT_OK
    fs, root = backend.raw_fs(resumed)
    path = f"{root}/ckpt-000000000015/{MANIFEST_NAME}"
    manifest = json.loads(fs.cat_file(path))
    manifest["extra"]["input_digest"]["sha256"] = W[9]
    fs.pipe_file(path, json.dumps(manifest).encode())

    code, out, _ = run(reference.url, resumed.url, as_json=True, options=backend.options)
    record = json.loads(out)
    assert (code, record["first_divergent_step"], record["first_divergent_epoch"]) == (EXIT_FAILURE, None, 1)
    assert record["common_steps"] == [5, 10, 15]
    assert record["a"] == f"{reference.url} (manifests)"


def test_a_run_dir_whose_events_predate_the_digest_falls_back_to_its_storage(tmp_path, memory_backend: Backend):
    store = memory_backend.store()
    for step in (5, 10):
        commit(memory_backend, store, step, W[step // 5], (0, W[5]))
    old = tmp_path / "old"
    old.mkdir()
    (old / "events.jsonl").write_text(json.dumps({"event": "run_started", "storage": store.url}) + "\n" + json.dumps(
        {"event": "checkpoint_committed", "global_step": 5, "path": "x"}) + "\n")
    code, out, _ = run(str(old), store.url, as_json=True)
    record = json.loads(out)
    assert (code, record["a"], record["common_steps"]) == (EXIT_OK, f"{old} (manifests in {store.url})", [5, 10])


def test_a_batch_one_run_skipped_is_named_beside_the_divergence_it_explains(tmp_path):
    a = write_run_dir(tmp_path / "a", {4: W[1], 8: W[2], 12: W[3]}, {0: W[5]})
    b = write_run_dir(tmp_path / "b", {4: W[1], 8: W[4], 12: W[6]}, {0: W[5]})
    with open(b / "events.jsonl", "a") as events:  # B's batch of step 6 came back NaN when replayed: skipped
        events.write(json.dumps({"event": "batch_skipped", "global_step": 6, "epoch": 0, "step_in_epoch": 5}) + "\n")
    code, out, _ = run(str(a), str(b))
    assert code == EXIT_FAILURE
    lines = out.splitlines()
    assert lines[2:5] == [
        f"first divergent global step: 8 (A {W[2][:12]}, B {W[4][:12]})",
        "last matching global step: 4",
        "epoch inputs identical in all 1 common epochs"]
    assert lines[5] == ("batches skipped by one run only (deterministic anomalies, --deterministic-anomaly skip): "
                        "A [], B [6]; the weights differ from the first of those steps on")
    assert json.loads(run(str(a), str(b), as_json=True)[1])["skipped_steps"] == {"a": [], "b": [6]}
    both = compare_trajectories(Trajectory("t", {4: W[1]}, {}, FP, (6,)), Trajectory("t", {4: W[1]}, {}, FP, (6,)))
    assert both.identical and (both.skipped_a, both.skipped_b) == ((), ())


def test_the_skip_list_of_a_checkpoint_root_is_its_newest_manifests():
    from resilient_train.commands.diff import _from_manifests

    class Manifest:
        def __init__(self, step: int, extra: dict) -> None:
            self.global_step, self.weights_sha256, self.extra = step, W[step], extra

    *_, skipped = _from_manifests([Manifest(1, {}), Manifest(2, {"skipped_steps": [6]}),
                                   Manifest(3, {"skipped_steps": [6, 9]})])
    assert skipped == (6, 9)
