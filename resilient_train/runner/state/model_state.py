"""The model's state as resilient-train names it: the weights digest and global RNG state.

``weights_sha256`` is a contract (manifests, ``summary.json``, ``model/export.json``,
``run_finished``): SHA-256 over the model's weights, sorted by variable path; for each,
``"<path>|<numpy dtype str>|<shape tuple>\\n"`` then the raw C-order bytes. Trainable and
non-trainable weights, not the optimizer, not RNG state. It is computed here and only here,
for a live model, a twin snapshot, or a model whose weights Keras renamed on load.

``preserved_rng`` keeps every global RNG a run draws from (Python, NumPy, Keras' global
SeedGenerator) where it was across a block that builds a second model (the async twin, an
export), so building it does not change what the run trains. The model's own RNG state
(seed-generator variables) is the checkpoint's ``rng`` entry: runner/state/ckpt_layout.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from resilient_train.errors import CheckpointIncompatibleError

__all__ = ["weights_digest", "digest_named", "digest_with_paths", "weight_paths", "preserved_rng"]


def digest_named(named: Iterable[tuple[str, Any]]) -> str:
    """The weights digest of ``(path, variable)`` pairs (anything with ``.numpy()``)."""
    digest = hashlib.sha256()
    for path, variable in sorted(named, key=lambda pair: pair[0]):
        array = np.ascontiguousarray(variable.numpy())
        digest.update(f"{path}|{array.dtype.str}|{tuple(array.shape)}\n".encode())
        digest.update(memoryview(array))  # the raw C-order bytes, without a copy
    return digest.hexdigest()


def weights_digest(model: Any) -> str:
    """The digest of ``model.weights``, each named by its own ``variable.path``."""
    return digest_named((variable.path, variable) for variable in model.weights)


def weight_paths(model: Any) -> list[str]:
    """The variable path of each weight, in ``model.weights`` order."""
    return [variable.path for variable in model.weights]


def digest_with_paths(model: Any, paths: Sequence[str]) -> str:
    """The digest of ``model`` with its weights named by ``paths`` (by position).

    Keras renames variables when it loads a saved model; the export records the training
    run's paths so the digest of the loaded model equals the checkpoint's.
    """
    weights = list(model.weights)
    if len(weights) != len(paths):
        raise CheckpointIncompatibleError(f"the model has {len(weights)} weights; the export names {len(paths)}")
    return digest_named(zip(paths, weights))


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block without moving any global RNG the training run draws from.

    Building a second model runs the recipe's initializers again; they draw seeds from
    Python's ``random`` and Keras' global SeedGenerator. Without this guard an async run
    would start training from different global RNG states than a sync run of the same job.
    """
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    py_state = random.getstate()
    np_state = np.random.get_state()
    gen = global_state.get_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR)
    gen_state = gen.state.numpy() if gen is not None else None
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, gen)
        if gen is not None:
            gen.state.assign(gen_state)
