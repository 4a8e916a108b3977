"""The trained model as files: ``model.keras``, a SavedModel for serving, and ``export.json``.

Two ways in, one way out (:func:`export_model`):

* at completion the chief exports ``<run-dir>/model/`` from the final weights
  (:func:`export_completed`, called by the worker after ``Trainer.run`` returned), and
* ``resilient-train export STORAGE_URL --recipe R [--step N] --out DIR`` exports any
  committed checkpoint (``commands/export.py``): the checkpoint is fetched with every file
  hash-checked, restored into the recipe's model, and its weights digest must equal the
  manifest's ``weights_sha256`` before anything is written.

Why ``export.json`` records the weight paths: ``weights_sha256`` hashes each weight under
its Keras variable path (``sequential/conv2d/kernel``), and Keras names variables when a
model is built, so a model built twice in one process, or loaded back from
``model.keras``, has other paths (``conv2d/kernel``) for the same weights in the same
order. The export writes the training model's paths in ``model.weights`` order; pairing
them with a reloaded model's weights by position (:func:`exported_weights_sha256`) gives
back exactly the checkpoint's digest.

A model Keras cannot write as ``model.keras`` (a subclass without ``get_config``, such as
keras.io's ``VAE(encoder, decoder)``: Keras raises a bare ``NotImplementedError``) is exported
as its weights, ``model.weights.h5`` (``save_weights`` needs no config; the user rebuilds the
class in code and calls ``load_weights``, after setting ``built = True`` on a model that is never
called, such as keras.io's VAE and GAN: Keras refuses to load into an unbuilt model), with the
SavedModel if Keras can trace one; what was not written and why is ``skipped`` in export.json and
in ``model_exported``.

An export is written to a sibling temp directory and renamed into place, so ``DIR``
holds a complete export or the previous one, never half of one.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from resilient_train.runner.state.model_state import digest_with_paths, preserved_rng, weight_paths
from resilient_train.errors import CheckpointIncompatibleError
from resilient_train.rundir.permissions import directory_mode

__all__ = ["FORMATS", "EXPORT_FILE", "WEIGHTS_FILE", "export_model", "export_completed", "exported_weights_sha256"]

FORMATS = ("keras", "saved_model")
EXPORT_FILE = "export.json"
WEIGHTS_FILE = "model.weights.h5"  # instead of model.keras for a model without get_config


def exported_weights_sha256(model: Any, export_dir: Path) -> str:
    """The checkpoint-comparable digest of a model loaded back from ``export_dir``."""
    info = json.loads((Path(export_dir) / EXPORT_FILE).read_text())
    return digest_with_paths(model, info["weight_paths"])


def export_model(
    model: Any,
    out_dir: Path,
    *,
    paths: Sequence[str],
    weights_sha256: str,
    formats: Sequence[str] = FORMATS,
    info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``model`` to ``out_dir`` in ``formats`` plus export.json; returns export.json's content.

    ``model`` must be a plain (strategy-free) Keras model; its digest under ``paths``
    must equal ``weights_sha256`` (raises CheckpointIncompatibleError otherwise).
    """
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"Received formats={list(formats)}; expected some of {list(FORMATS)}")
    digest = digest_with_paths(model, paths)
    if digest != weights_sha256:
        raise CheckpointIncompatibleError(
            f"the model to export has weights_sha256 {digest[:16]}..., the checkpoint {weights_sha256[:16]}..."
        )
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    staging.chmod(directory_mode())  # mkdtemp makes it 0700; an export gets the run dir's mode (--run-dir-mode)
    try:
        files: dict[str, str] = {}
        skipped: dict[str, str] = {}
        if "keras" in formats:
            try:
                model.save(staging / "model.keras")
                files["keras"] = "model.keras"
            except NotImplementedError:  # Keras cannot write its config: the weights, and say what to add
                (staging / "model.keras").unlink(missing_ok=True)
                never_built = not model.built and bool(model.weights)
                if never_built:  # a VAE or a GAN is never called: its parts hold every weight
                    model.built = True
                model.save_weights(staging / WEIGHTS_FILE)
                files["weights"] = WEIGHTS_FILE
                name = type(model).__name__
                # Keras' load_weights refuses a model that was never built, as such a rebuilt one is
                load = (f"set its built = True (it is never called) and call load_weights('{WEIGHTS_FILE}')"
                        if never_built else f"call load_weights('{WEIGHTS_FILE}')")
                skipped["keras"] = (f"{name} has no get_config(): add get_config() to {name} for model.keras, or "
                                    f"rebuild {name}(...) in code and {load}")
        if "saved_model" in formats:
            try:
                model.export(str(staging / "saved_model"), format="tf_saved_model", verbose=False)
                files["saved_model"] = "saved_model"
            except Exception as exc:  # only beside the weights fallback: a plain model's failure stays one
                if "weights" not in files:
                    raise
                shutil.rmtree(staging / "saved_model", ignore_errors=True)
                skipped["saved_model"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
        record = {
            **(info or {}),
            "weights_sha256": digest,
            "weight_paths": list(paths),
            "files": files,
            **({"skipped": skipped} if skipped else {}),
            "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        (staging / EXPORT_FILE).write_text(json.dumps(record, indent=2) + "\n")
        _replace_dir(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record


def _replace_dir(new: Path, target: Path) -> None:
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _strategy_free_copy(recipe: Any, params: dict[str, Any], source: Any) -> Any:
    """A fresh model from the recipe, outside any strategy, holding ``source``'s weights."""

    with preserved_rng():
        model = recipe.build_model(params)
    model.set_weights([np.asarray(variable.numpy()) for variable in source.weights])
    return model


def export_completed(trainer: Any, result: Any, out_dir: Path) -> dict[str, Any] | None:
    """The chief's export at completion; a failure is an event, never a failed run.

    The checkpoint is committed already, so ``resilient-train export`` can retry later.
    """
    from resilient_train.rundir.events import emit

    try:
        model = _strategy_free_copy(trainer.recipe, trainer.params, trainer.model)
        record = export_model(
            model,
            out_dir,
            paths=weight_paths(trainer.model),
            weights_sha256=result.weights_sha256,
            info={"recipe": trainer.recipe.name, "global_step": result.global_step, "epoch": result.epoch,
                  "source": "completed run"},
        )
    except Exception as exc:  # the run succeeded; say why there is no model and go on
        emit("model_export_failed", group=True, path=str(out_dir), error=f"{type(exc).__name__}: {exc}")
        return None
    emit("model_exported", group=True, path=str(out_dir), global_step=result.global_step,
         weights_sha256=record["weights_sha256"], files=record["files"],
         **({"skipped": record["skipped"]} if "skipped" in record else {}))
    return record
