"""The recipe the harness generates for an ``input`` fault: the job's own batches, one gate each.

The scenario's exactness claim rests on the gate changing nothing: the generated recipe
must yield the base recipe's batches bit for bit (the reference digest is the base
recipe's), name what the recipe check reads statically, and pull the worker's ``input``
faults once per batch, counted over the process.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from resilient_train.chaos.harness import write_input_fault_recipe
from resilient_train.job.recipe import check_recipe_source

BASE = Path(__file__).resolve().parents[2] / "recipes" / "linear_regression.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _context(pipeline: int):
    return SimpleNamespace(num_input_pipelines=2, input_pipeline_id=pipeline, per_replica_batch_size=2,
                           params={"fail_at_step": -1})


def _batches(dataset, n: int) -> list[bytes]:
    return [b"".join(np.asarray(t).tobytes() for t in batch) for batch in dataset.take(n)]


def test_the_generated_recipe_yields_the_base_batches_and_passes_the_recipe_check(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_input_fault_recipe(tmp_path, str(BASE))
    assert check_recipe_source(str(path)) == path
    # An input fault of another rank is armed: this pipeline reads through every batch.
    monkeypatch.setenv("RT_FAULTS", json.dumps([{"point": "input", "global_step": 2, "rank": 1, "signal": "HANG"}]))
    monkeypatch.setenv("RT_ATTEMPT", "1")
    base, gated = _load(BASE, "_base_recipe"), _load(path, "_gated_recipe")
    assert (gated.DEFAULTS, gated.PARAMS) == (base.DEFAULTS, base.PARAMS)
    assert gated.eval_dataset.__code__.co_filename == gated.build_model.__code__.co_filename == str(BASE)
    for epoch in (0, 1):
        expected = _batches(base.dataset(_context(0), epoch, 3), 12)
        assert _batches(gated.dataset(_context(0), epoch, 3), 12) == expected
        # start_step: the base recipe takes none, so the gate skips like the runner would.
        assert _batches(gated.dataset(_context(0), epoch, 3, start_step=5), 7) == expected[5:]
