"""``resilient-train export URL --recipe R --out DIR``: a committed checkpoint as a model.

The checkpoint (``--step``, default the newest committed) is fetched with every file
hash-checked, restored into the recipe's model, and its weights digest must equal the
manifest's ``weights_sha256`` before anything is written; the files themselves are written
by ``runner/outputs/model_export.py`` ``export_model`` (the same writer as the chief's export at
completion). ``--recipe`` may be the ``model.fit`` script the run ran: its model is rebuilt as
the run built it, by running the script up to its ``fit`` call with the run's ``--seed``
(runner/keras_recipes/fitscript.py ``script_model``; nothing is trained, the code after ``fit``
does not run), and ``--set`` is refused (a script has no parameters). Exit codes (errors.py): 0 exported, 1 the checkpoint is corrupt or does not
fit the recipe, 2 nothing committed under URL, or no committed checkpoint at ``--step`` (one
line listing the committed steps: a step ``--keep`` removed and one that never existed read
the same), or the CLI's usage errors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CheckpointCorruptError, CheckpointIncompatibleError

__all__ = ["add_parser", "main", "export_command", "committed_steps_text", "training_checkpoint", "script_recipe"]

_FORMATS = ("keras", "saved_model")  # runner/outputs/model_export.py FORMATS, without importing numpy to build the parser


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("export", help="export a committed checkpoint as model.keras / SavedModel")
    parser.add_argument("url", help="storage URL (the --storage of the run)")
    parser.add_argument("--recipe", required=True, help="the recipe (or model.fit script) that trained it")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (replaced if it exists)")
    parser.add_argument("--step", type=int, help="global step (default: the newest committed checkpoint)")
    parser.add_argument("--format", choices=_FORMATS, action="append",
                        help="keras (model.keras) or saved_model (SavedModel for serving); default both")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe parameter")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options
    from resilient_train.commands.tf_stderr import tensorflow_chatter_filtered
    from resilient_train.job.config import parse_set_pairs

    with tensorflow_chatter_filtered():  # the recipe loads TensorFlow here, in this process
        return export_command(
            args.url,
            recipe_spec=args.recipe,
            out=args.out,
            step=args.step,
            formats=tuple(args.format or _FORMATS),
            storage_options=parse_storage_options(args.storage_option),
            overrides=parse_set_pairs(args.set),
        )


def export_command(
    url: str,
    *,
    recipe_spec: str,
    out: str,
    step: int | None,
    formats: Sequence[str],
    storage_options: Mapping[str, Any],
    overrides: Mapping[str, str],
) -> int:
    """``resilient-train export``: verify checkpoint ``step`` (default newest), then export it."""
    from resilient_train.checkpoint import CheckpointStore, Status
    from resilient_train.job.recipe import is_fit_script, load_recipe, resolve_params
    from resilient_train.rundir import events
    from resilient_train.runner.outputs.model_export import EXPORT_FILE, export_model
    from resilient_train.runner.state.model_state import weight_paths

    events.configure(None, console=None)  # the store's progress events are not this command's output
    store = CheckpointStore(url, storage_options)
    if step is None:
        manifest = store.latest_manifest()
        if manifest is None:
            print(f"resilient-train export: no committed checkpoint under {url}", file=sys.stderr)
            return EXIT_USAGE
        step = manifest.global_step
    else:  # before the recipe is loaded (TensorFlow): a step that is not there is known from one listing
        committed = [info.global_step for info in store.list() if info.status is not Status.UNCOMMITTED]
        if step not in committed:
            print(f"resilient-train export: no checkpoint at step {step} under {url}; "
                  f"{committed_steps_text(committed)}", file=sys.stderr)
            return EXIT_USAGE
    script = is_fit_script(recipe_spec)
    if script and overrides:
        print(f"resilient-train export: --set {', '.join(overrides)} with the fit() script {recipe_spec}: a script "
              "has no parameters", file=sys.stderr)
        return EXIT_USAGE
    recipe = None if script else load_recipe(recipe_spec)  # a script's: once the manifest gives the run's seed
    params = resolve_params(recipe.params, overrides) if recipe is not None else {}
    with tempfile.TemporaryDirectory(prefix="rt-export-") as scratch:
        try:
            manifest, local_dir = store.fetch(step, Path(scratch))
            if recipe is None:
                recipe = script_recipe(recipe_spec, int(manifest.extra.get("fingerprint", {}).get("seed", 0)))
            model = _restore_weights(recipe, params, local_dir / "ckpt", f"{url}/{CheckpointStore.dir_name(step)}")
            record = export_model(
                model,
                Path(out),
                paths=weight_paths(model),
                weights_sha256=manifest.weights_sha256,
                formats=formats,
                info={"recipe": recipe.name, "global_step": manifest.global_step, "epoch": manifest.epoch,
                      "source": f"{url}/{CheckpointStore.dir_name(step)}"},
            )
        except (CheckpointCorruptError, CheckpointIncompatibleError) as exc:
            print(f"resilient-train export: checkpoint step {step}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    print(f"Exported global step {record['global_step']} (weights_sha256 {record['weights_sha256']}) "
          f"to {out}: {', '.join(record['files'].values())}, {EXPORT_FILE}")
    return EXIT_OK


def committed_steps_text(steps: Sequence[int], *, shown: int = 8) -> str:
    """``committed: 250, 275, 300``; more than ``shown`` steps keep the first two and the newest
    ones (``committed: 10, 20, ..., 280, 290, 300 (30 in all)``); none: ``nothing is committed``."""
    if not steps:
        return "nothing is committed there"
    if len(steps) <= shown:
        return "committed: " + ", ".join(map(str, steps))
    head, tail = steps[:2], steps[-(shown - 2):]
    return f"committed: {', '.join(map(str, head))}, ..., {', '.join(map(str, tail))} ({len(steps)} in all)"


def script_recipe(spec: str, seed: int) -> Any:
    """A recipe whose ``build_model`` is the fit script's model, rebuilt as the run built it."""
    from resilient_train.job.recipe import Recipe, check_recipe_source, recipe_name
    from resilient_train.runner.keras_recipes.fitscript import script_model

    path = check_recipe_source(spec)
    return Recipe(name=recipe_name(spec), source=str(path), build_model=lambda params: script_model(path, seed=seed),
                  build_optimizer=None, loss=None, dataset=None)


def _fresh_model(recipe: Any, params: Mapping[str, Any]) -> Any:
    """The recipe's model, built as the first model of a fresh process.

    Keras numbers layer names per process (``dense``, ``dense_1``...), and the weights
    digest hashes each weight under its path: clearing the session first gives the paths a
    worker's model had, so the digest can be compared with the manifest's.
    """
    import keras

    keras.backend.clear_session()
    return recipe.build_model(dict(params))


def training_checkpoint(recipe: Any, params: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """``(checkpoint, model, counters)``: the object graph a worker saves, strategy-free on CPU.

    Built by runner/state/ckpt_layout.py ``training_graph``, as the worker's is;
    ``counters`` maps ``epoch``/``step_in_epoch``/``global_step`` to their variables.
    """
    from resilient_train.runner.state import ckpt_layout

    from resilient_train.runner.keras_recipes.compiled import is_compiled
    from resilient_train.runner.keras_recipes.own_step import has_own_step

    model = _fresh_model(recipe, params)
    own_step = is_compiled(model) and has_own_step(model)  # as the worker decides (runner/training/loop.py)
    if own_step:
        _build_own_optimizers(recipe, params, model)
    # A compiled-model recipe's optimizer is the one compile() was given (runner/keras_recipes/compiled.py).
    optimizer = recipe.build_optimizer(dict(params)) if recipe.build_optimizer is not None else model.optimizer
    optimizer.build(model.trainable_variables)
    counters = ckpt_layout.new_counters()
    checkpoint = ckpt_layout.training_graph(model=model, optimizer=optimizer, counters=counters,
                                            rng=ckpt_layout.rng_state(model),
                                            metrics=ckpt_layout.metric_state(model) if own_step else None)
    return checkpoint, model, counters


def _build_own_optimizers(recipe: Any, params: Mapping[str, Any], model: Any) -> None:
    """A recipe's model with its own ``train_step`` and optimizers of its own (keras.io's GAN):
    build them as a worker does before its restore (runner/training/loop.py), from the spec
    of the recipe's dataset of epoch 0 (built, never iterated), so their keys are in the layout.
    A fit script's are built by ``script_model`` from its ``fit`` input."""
    import tensorflow as tf

    from resilient_train.runner.input.data import epoch_dataset
    from resilient_train.runner.keras_recipes.own_step import build_own_optimizers, own_optimizers

    if recipe.dataset is None and recipe.example is None or not own_optimizers(model):
        return  # a fit script's (its recipe has no dataset): built by script_model
    strategy = tf.distribute.get_strategy()
    batch = int(dict(recipe.defaults).get("global_batch_size", 1))
    spec = epoch_dataset(strategy, recipe, epoch=0, seed=0, start_step=0, steps_per_epoch=1, global_batch_size=batch,
                         params=dict(params), worker=(0, 1)).element_spec
    build_own_optimizers(model, strategy, spec)


def _restore_weights(recipe: Any, params: dict[str, Any], prefix: Path, where: str) -> Any:
    """The recipe's model with the checkpoint's weights (optimizer and counters ignored)."""
    from resilient_train.runner.state import ckpt_layout

    model = _fresh_model(recipe, params)
    ckpt_layout.restore(ckpt_layout.weights_graph(model), prefix, where=where, recipe_name=recipe.name, partial=True)
    return model
