"""``resilient-train export``: the parser offers exactly the formats the writer knows; a step
without a committed checkpoint is exit 2 and one line listing the committed steps."""

from __future__ import annotations

import pytest

from resilient_train.errors import EXIT_USAGE


def test_export_formats_match_the_writer() -> None:
    from resilient_train.commands.export import _FORMATS
    from resilient_train.runner.outputs.model_export import FORMATS

    assert _FORMATS == FORMATS


def commit_fake(store, tmp_path, step: int) -> None:
    """A committed checkpoint (opaque bytes: the step check needs no TensorFlow)."""
    local = tmp_path / f"fake-{step}"
    local.mkdir()
    (local / "weights").write_bytes(b"w%d" % step)
    store.commit(local, run_id="fake", epoch=0, step_in_epoch=step, global_step=step, world_size=1,
                 weights_sha256="0" * 64, tf_version="fake")


@pytest.mark.parametrize("step", [225, 100])  # removed by --keep 3; never existed
def test_a_step_without_a_committed_checkpoint_lists_the_committed_ones(capsys, tmp_path, step) -> None:
    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.cli import main

    store = CheckpointStore(str(tmp_path / "ckpts"))
    for committed in (225, 250, 275, 300):
        commit_fake(store, tmp_path, committed)
    assert store.retain(3) == [f"{store.url}/ckpt-000000000225"]
    out = tmp_path / "out"
    code = main(["export", store.url, "--recipe", "recipes/linear_regression.py", "--out", str(out),
                 "--step", str(step)])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"resilient-train export: no checkpoint at step {step} under {store.url}; committed: 250, 275, 300"]
    assert not out.exists()


@pytest.mark.parametrize(
    "steps, text",
    [
        ([], "nothing is committed there"),
        ([250, 275, 300], "committed: 250, 275, 300"),
        (list(range(10, 310, 10)), "committed: 10, 20, ..., 250, 260, 270, 280, 290, 300 (30 in all)"),
    ],
)
def test_committed_steps_are_abbreviated_when_many(steps, text) -> None:
    from resilient_train.commands.export import committed_steps_text

    assert committed_steps_text(steps) == text
