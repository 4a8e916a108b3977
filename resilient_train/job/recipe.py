"""The recipe contract and its loader.

A recipe is a Python file (``recipes/digits_cnn.py``) or an importable module
(``mypkg.my_recipe``) that says *what* to train; resilient-train decides *how* (strategy,
checkpoints, resume). A recipe author needs to know nothing about checkpoints or TF_CONFIG,
and about sharding only what TensorFlow's ``input_context`` says.

Required functions::

    def build_model(params) -> keras.Model        # built (use keras.Input), inside strategy scope
    def build_optimizer(params) -> keras.optimizers.Optimizer
    def loss(labels, predictions) -> Tensor        # PER-EXAMPLE loss, shape [batch]
    def dataset(input_context, epoch, seed) -> tf.data.Dataset  # per-replica batches (x, y) or (x, y, w)

or, instead of ``dataset``, the indexed input contract (the runner builds the pipeline, its
order and every worker's share; runner/input/indexed.py)::

    def num_examples(params) -> int
    def example(index, params) -> (x, y) or (x, y, w)  # tensors for int64 scalar `index`; traced
    def augment(example, seed) -> example               # optional; seed: int64 [2], per position

A recipe defines ``dataset`` or ``num_examples`` + ``example``, never both.

Optional::

    def callbacks(params) -> list[keras.callbacks.Callback]  # run where model.fit would; their
                                                           # state is kept with each checkpoint
    DEFAULTS = {"epochs": 3, "steps_per_epoch": 50, "global_batch_size": 64}
    PARAMS = {"learning_rate": 0.01}                # recipe parameters, set with --set key=value
    def metrics(labels, predictions) -> dict[str, Tensor]   # per-example values, averaged per epoch
    def dataset(input_context, epoch, seed, start_step=0)    # may take start_step: the epoch from
                                                           # batch start_step on (cheap re-entry)
    def eval_dataset(input_context, seed) -> tf.data.Dataset  # FINITE held-out per-replica batches (x, y)

A compiled model: when ``build_model`` returns a model on which ``compile(optimizer=...,
loss=..., metrics=[...])`` was called, ``build_optimizer``, ``loss`` and ``metrics`` are
left out and taken from ``compile`` (runner/keras_recipes/compiled.py says what is honoured). Here,
without importing the recipe, the supervisor refuses what the runner cannot honour when
it is written literally: a missing ``build_optimizer`` / ``loss`` with no ``.compile(``
call, ``compile(run_eagerly=True | jit_compile=True | steps_per_execution=N>1)``,
``weighted_metrics`` beside several losses, a metric in ``compile(metrics=...)`` whose result is one number per
class or threshold (``"f1_score"``, ``thresholds=[a, b]``), a class overriding ``train_step`` (a fit
script's class may: its own step runs, runner/keras_recipes/own_step.py; not with validation in its
``fit``), and ``BackupAndRestore`` (the runner backs up and restores; runner/keras_recipes/callbacks.py).

``eval_dataset`` is the held-out split: sharded like ``dataset``, finite (no ``repeat()``),
never shuffled into the training data. When a recipe defines it the runner evaluates the
model on it at every epoch end (``--eval-every-epochs``), on all workers, and reports
``val_loss`` and ``val_<metric>`` over every held-out example.

``input_context`` is a ``tf.distribute.InputContext`` (shard with ``num_input_pipelines`` /
``input_pipeline_id``) that also carries ``global_batch_size``, ``per_replica_batch_size``
and ``params``.

Exact resume (bit-identical weights after any number of kills) needs the recipe to keep
three rules; the runner does the rest (op determinism, RNG state in the checkpoint,
mid-epoch re-entry by skipping batches):

1. ``dataset`` is a pure function of ``(input_context, epoch, seed)``: seed every shuffle
   and random op from ``seed`` and ``epoch`` (``shuffle(n, seed=seed * 1000 + epoch)``),
   never from the clock, and yield at least ``steps_per_epoch`` batches (``repeat()`` is fine).
2. Random layers (Dropout, noise) draw from Keras seed generators (``seed=...`` or the
   global seed the runner sets); their state is checkpointed.
3. No Python-side state that changes during training outside the model and optimizer.

The runner resets TensorFlow's global seed from ``(seed, epoch)`` right before each
``dataset`` call (an unseeded ``shuffle()`` resumes exactly) and checks after a restore that
the resumed epoch's first batch is the one recorded with the checkpoint
(runner/input/determinism.py; ``resilient-train check RECIPE`` runs the same check up front).

A ``model.fit`` script: a file that defines neither ``build_model`` nor ``dataset`` and calls
``.fit(`` once is run as a whole by the worker (runner/keras_recipes/fitscript.py), with the runner's
strategy and training loop behind ``MultiWorkerMirroredStrategy()`` and ``Model.fit``.
:func:`check_fit_script` refuses here, before workers start, the ``fit`` calls the runner
cannot honour (:data:`FIT_REFUSED`, and by what ``x`` is: a dataset without ``steps_per_epoch``,
:data:`FIT_DATASET_REFUSED`, :data:`FIT_ARRAYS_REFUSED`; :data:`FIT_PAIRS_REFUSED`; sample or
class weights for a model compiled with several losses; two calls, a call in a loop).

This module does not import TensorFlow: the supervisor checks a recipe's shape (it parses,
defines the required functions) before it spends seconds starting workers.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, TypeGuard

from resilient_train.errors import RecipeError

__all__ = ["Recipe", "load_recipe", "check_recipe_source", "recipe_name", "resolve_params", "REQUIRED", "DATASET_INPUT", "INDEXED_INPUT", "DEFAULT_KEYS",
           "is_fit_script", "check_fit_script", "FIT_REFUSED", "FIT_DATASET_REFUSED", "FIT_ARRAYS_REFUSED",
           "FIT_PAIRS_REFUSED", "SEVERAL_OUTPUTS_WEIGHTS_REFUSED", "STATEFUL_METRICS", "STATEFUL_METRIC_NAMES",
           "VECTOR_METRIC_NAMES",
           "CALLBACKS_REFUSED"]

REQUIRED = ("build_model", "build_optimizer", "loss")
# The input: one of the two contracts (``dataset``, or the indexed one).
DATASET_INPUT = ("dataset",)
INDEXED_INPUT = ("num_examples", "example")
# Required unless build_model returns a compiled model (the source calls ``.compile(``).
FROM_COMPILE = ("build_optimizer", "loss")
# Optional functions and how many positional parameters each must accept.
OPTIONAL_ARITY = {"metrics": 2, "eval_dataset": 2, "callbacks": 1, "num_examples": 1, "example": 2, "augment": 2}
_SIGNATURES = {"metrics": "(labels, predictions)", "eval_dataset": "(input_context, seed)", "callbacks": "(params)",
               "num_examples": "(params)", "example": "(index, params)", "augment": "(example, seed)"}
# compile() arguments the runner cannot honour, refused when written literally.
_COMPILE_REFUSED = {
    "run_eagerly": "the runner compiles its own step",
    "jit_compile": "the runner's step is not XLA-compiled",
    "weighted_metrics": "not yet with several outputs (sample weights with several outputs are not either)",
}
_TRAINER_OVERRIDES = ("train_step", "test_step", "compute_loss", "compute_metrics")
# Keras callbacks the runner refuses, and why: here, by name, before workers start when the
# source names them (check_fit_script, _check_keras_usage); runner/keras_recipes/callbacks.py refuses the
# imported objects with the same words.
CALLBACKS_REFUSED = {
    "BackupAndRestore": "remove it: resilient-train already backs up and restores (input position and callback state included)",
    "ProgbarLogger": "not supported yet: the runner reports progress as events (remove it)",
    "RemoteMonitor": "not supported yet (remove it)",
    "SwapEMAWeights": "not supported yet (remove it)",
}
DEFAULT_KEYS = ("epochs", "steps_per_epoch", "global_batch_size", "save_every_steps")
# fit() arguments a script may not pass, and why (runner/keras_recipes/fitscript.py honours the
# others: x, y, batch_size, epochs, steps_per_epoch, callbacks, shuffle, validation_*; verbose is ignored).
FIT_REFUSED = {
    "initial_epoch": "the runner resumes at the right epoch itself",
}
# Refused by what x is: a tf.data.Dataset (no y), or arrays (fit(x, y, ...)).
FIT_DATASET_REFUSED = {
    "batch_size": "batch the tf.data.Dataset instead (at the global batch size), or pass arrays: fit(x, y, batch_size=...)",
    "validation_split": "Keras splits arrays, not a dataset: pass fit(x, y, validation_split=...) or validation_data=",
    "sample_weight": "Keras takes it with arrays only: yield (x, y, sample_weight) from the dataset instead",
    "class_weight": "not supported with a dataset yet: pass arrays, or yield (x, y, sample_weight) from the dataset",
}
# fit() weights refused for a model with several outputs (fitscript.py refuses them by the model's outputs).
SEVERAL_OUTPUTS_WEIGHTS_REFUSED = {
    "class_weight": "Keras supports class_weight only for a model with a single output",
    "sample_weight": "not supported yet with several outputs: Keras weighs each <output>_loss by it, the runner's "
                     "per-output losses are unweighted",
}
# A recipe's model with its own train_step and optimizers of its own (keras.io's GAN: compile(d_optimizer=...,
# g_optimizer=...)), refused by runner/keras_recipes/own_step.py (a fit script's are checkpointed).
# Pairs of fit() arguments refused together, and why.
FIT_PAIRS_REFUSED = {
    ("sample_weight", "class_weight"): "Keras refuses both at once (pass one)",
    ("sample_weight", "validation_split"): "not supported yet: Keras weighs the held-out loss by the split's sample "
                                           "weights, the runner's validation is unweighted",
}
# compile() metrics whose state is not a mean of per-example values, but a sum the runner keeps
# (runner/keras_recipes/metric_states.py; tests/runner/keras_recipes/test_compiled.py checks this list against
# Keras): class names and the names keras.metrics.get() resolves to them.
STATEFUL_METRICS = (
    "AUC", "BinaryIoU", "F1Score", "FBetaScore", "FalseNegatives", "FalsePositives", "IoU", "Mean", "MeanIoU",
    "OneHotIoU", "OneHotMeanIoU", "Precision", "PrecisionAtRecall", "R2Score", "Recall", "RecallAtPrecision",
    "RootMeanSquaredError", "SensitivityAtSpecificity", "SpecificityAtSensitivity", "Sum", "TrueNegatives",
    "TruePositives",
)
# ... of which these names give one result per class (Keras' default average=None).
VECTOR_METRIC_NAMES = ("f1_score", "f_beta_score")
STATEFUL_METRIC_NAMES = (
    "auc", "binary_io_u", "f1_score", "f_beta_score", "false_negatives", "false_positives", "io_u", "mean",
    "mean_io_u", "one_hot_io_u", "one_hot_mean_io_u", "precision", "precision_at_recall", "r2_score", "recall",
    "recall_at_precision", "root_mean_squared_error", "sensitivity_at_specificity", "specificity_at_sensitivity",
    "sum", "true_negatives", "true_positives",
)
FIT_ARRAYS_REFUSED = {
    "steps_per_epoch": "not supported with arrays yet: an epoch is the arrays once over (n // batch_size steps)",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    build_model: Callable[[dict], Any]
    build_optimizer: Callable[[dict], Any] | None  # None: taken from a compiled model
    loss: Callable[[Any, Any], Any] | None  # None: taken from a compiled model
    dataset: Callable[[Any, int, int], Any] | None  # None: an indexed recipe
    metrics: Callable[[Any, Any], dict] | None = None
    eval_dataset: Callable[[Any, int], Any] | None = None
    callbacks: Callable[[dict], Any] | None = None
    defaults: Mapping[str, int] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    num_examples: Callable[[dict], int] | None = None  # the indexed contract (runner/input/indexed.py)
    example: Callable[[Any, dict], Any] | None = None
    augment: Callable[[Any, Any], Any] | None = None
    # A compiled model's metrics whose state is summed, not averaged (AUC, Precision...): a
    # runner/keras_recipes/metric_states.py MetricStates, set by compiled.py; None: none.
    metric_states: Any = None

    @property
    def indexed(self) -> bool:
        """The runner builds this recipe's input from ``example(index)``."""
        return self.example is not None


def recipe_name(spec: str) -> str:
    """``recipes/digits_cnn.py`` -> ``digits_cnn``; ``pkg.mod`` -> ``mod``."""
    if _is_path(spec):
        return Path(spec).stem
    return spec.rsplit(".", 1)[-1]


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or Path(spec).is_file()


def _source_path(spec: str) -> Path:
    if _is_path(spec):
        path = Path(spec)
        if not path.is_file():
            raise RecipeError(
                f"Recipe file {spec!r} does not exist; expected a .py file (e.g. recipes/digits_cnn.py) "
                "or an importable module name"
            )
        return path
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError) as exc:
        found = None
        cause = f" ({exc})"
    else:
        cause = ""
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise RecipeError(f"Recipe module {spec!r} cannot be found{cause}; expected a .py file or an importable module")
    return Path(found.origin)


def check_recipe_source(spec: str, *, eval_every_epochs: int | None = None, record_indices: bool = False) -> Path:
    """Check a recipe without importing it: the file parses and defines the required functions.

    ``eval_every_epochs > 0`` also requires ``eval_dataset`` (the run would evaluate it);
    ``record_indices`` requires the indexed contract (only it has indices to record).
    """
    path = _source_path(spec)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise RecipeError(f"Recipe {path} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    if _is_fit_script(tree):
        check_fit_script(path, tree)
        return path
    defined = {
        node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    } | {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.ImportFrom))
        for target in (node.targets if isinstance(node, ast.Assign) else [])
        if isinstance(target, ast.Name)
    } | {
        alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    # A build_model taken from another module (assigned or imported) may compile there; the
    # source cannot tell, so the worker checks the model it builds (runner/training/loop.py).
    own_build_model = any(isinstance(node, ast.FunctionDef) and node.name == "build_model" for node in tree.body)
    compiles = _calls_compile(tree) or ("build_model" in defined and not own_build_model)
    # An indexed recipe (one that starts the other contract) is checked for its input below.
    inputs = () if any(name in defined for name in INDEXED_INPUT) else DATASET_INPUT
    missing = [name for name in (*REQUIRED, *inputs) if name not in defined and not (compiles and name in FROM_COMPILE)]
    if missing:
        raise RecipeError(
            f"Recipe {path} does not define {', '.join(missing)}; a recipe must define "
            f"{', '.join((*REQUIRED, *DATASET_INPUT))} (build_optimizer and loss may come from model.compile(); "
            "dataset may be num_examples + example instead; see resilient_train/job/recipe.py)"
        )
    _check_input_contract(path, defined)
    _check_optional_arity(path, tree)
    _check_keras_usage(path, tree)
    if eval_every_epochs and "eval_dataset" not in defined:
        raise RecipeError(
            f"Received eval_every_epochs={eval_every_epochs} but recipe {path} defines no "
            "eval_dataset(input_context, seed); add one or pass --eval-every-epochs 0"
        )
    if record_indices and "example" not in defined:
        raise RecipeError(
            f"Received --record-indices but recipe {path} defines dataset, not the indexed contract; "
            "record_indices needs num_examples(params) + example(index, params) (docs/recipes.md)"
        )
    return path


def _check_input_contract(path: Path, defined: set[str]) -> None:
    """``dataset`` or ``num_examples`` + ``example``: exactly one input contract."""
    indexed = [name for name in (*INDEXED_INPUT, "augment") if name in defined]
    if "dataset" in defined and indexed:
        raise RecipeError(
            f"Recipe {path} defines both dataset and {', '.join(indexed)}; define one input contract: "
            "dataset(input_context, epoch, seed), or num_examples(params) + example(index, params)"
        )
    missing = [name for name in INDEXED_INPUT if name not in defined]
    if "dataset" not in defined and missing:
        raise RecipeError(
            f"Recipe {path} does not define {'dataset' if len(missing) == 2 else missing[0]}; a recipe's input is "
            "dataset(input_context, epoch, seed), or num_examples(params) + example(index, params) "
            "(see resilient_train/job/recipe.py)"
        )


def _recipe_function_names(tree: ast.Module) -> set[str]:
    """Top-level functions and imported names (a script's ``dataset = ...`` variable is neither)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def _fit_calls(tree: ast.Module) -> list[ast.Call]:
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fit"]


def _is_fit_script(tree: ast.Module) -> bool:
    """No recipe functions (``def build_model`` / ``dataset`` / ``num_examples`` / ``example``, or
    imported) and a ``.fit(`` call."""
    recipe_functions = {"build_model", *DATASET_INPUT, *INDEXED_INPUT}
    return not (recipe_functions & _recipe_function_names(tree)) and bool(_fit_calls(tree))


def is_fit_script(spec: str) -> bool:
    """Whether ``spec`` is a ``model.fit`` script rather than a recipe (a file that does not
    parse is not: check_recipe_source reports its syntax error)."""
    try:
        tree = ast.parse(_source_path(spec).read_text())
    except SyntaxError:
        return False
    return _is_fit_script(tree)


def check_fit_script(path: Path, tree: ast.Module) -> None:
    """Refuse, in one line, a ``fit`` call the runner cannot honour exactly."""
    calls = _fit_calls(tree)
    if len(calls) > 1:
        lines = ", ".join(str(call.lineno) for call in calls)
        raise RecipeError(f"Script {path} calls fit() {len(calls)} times (lines {lines}); one fit() call is supported")
    call = calls[0]
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and any(inner is call for inner in ast.walk(node)):
            raise RecipeError(f"Script {path} calls fit() inside a loop (line {call.lineno}); one fit() call is supported")
    keywords = {keyword.arg: keyword for keyword in call.keywords}
    if None in keywords:
        raise RecipeError(f"Script {path}: fit(**...) at line {call.lineno}; pass fit's arguments by name")
    if len(call.args) > 2:
        raise RecipeError(f"Script {path}: fit() at line {call.lineno} gets {len(call.args)} positional arguments; "
                          "expected fit(x, y, batch_size=..., ...) or fit(dataset, ...): pass the others by name")
    # fit(x, y): arrays; fit(x, batch_size=...) without steps_per_epoch: arrays alone (keras.io's
    # VAE; the worker refuses it for a model without its own train_step); fit(dataset): no y.
    arrays = len(call.args) == 2 or "y" in keywords or ("batch_size" in keywords and "steps_per_epoch" not in keywords)
    refused = {**FIT_REFUSED, **(FIT_ARRAYS_REFUSED if arrays else FIT_DATASET_REFUSED)}
    for name, why in refused.items():
        if name in keywords:
            raise RecipeError(f"Script {path}: fit({name}=...) at line {call.lineno}: {why}")
    given = {name for name, keyword in keywords.items() if not _maybe_none(keyword.value)}  # the worker checks the rest
    for (first, second), why in FIT_PAIRS_REFUSED.items():
        if first in given and second in given:
            raise RecipeError(f"Script {path}: fit({first}=..., {second}=...) at line {call.lineno}: {why}")
    weights = [name for name in ("sample_weight", "class_weight") if name in given]
    several = _compiles_several_losses(tree)
    if weights and several is not None:
        raise RecipeError(f"Script {path}: fit({weights[0]}=...) at line {call.lineno} for the model compiled with "
                          f"several losses at line {several}: {SEVERAL_OUTPUTS_WEIGHTS_REFUSED[weights[0]]}")
    freq = keywords.get("validation_freq")
    if freq is not None and isinstance(freq.value, (ast.List, ast.Tuple, ast.Set)):
        raise RecipeError(f"Script {path}: fit(validation_freq=[...]) at line {call.lineno}: a list is not supported "
                          "yet; pass an int N (every N-th epoch)")
    shuffle = keywords.get("shuffle")
    if shuffle is not None and isinstance(shuffle.value, ast.Constant) and shuffle.value.value == "batch":
        raise RecipeError(f"Script {path}: fit(shuffle='batch') at line {call.lineno}: not supported; pass "
                          "shuffle=True (a new permutation every epoch) or False")
    if not arrays and "steps_per_epoch" not in keywords:
        raise RecipeError(f"Script {path}: fit() at line {call.lineno} has no steps_per_epoch; pass "
                          "fit(dataset, epochs=..., steps_per_epoch=N) with a repeated dataset (exact resume counts "
                          "steps), or arrays: fit(x, y, batch_size=..., epochs=...)")
    _check_keras_usage(path, tree, fit_line=call.lineno)
    _check_own_step_fit(path, tree, call)


def _check_optional_arity(path: Path, tree: ast.Module) -> None:
    """An optional function defined with the wrong parameters fails here, not mid-run."""
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name not in OPTIONAL_ARITY:
            continue
        args = node.args
        positional = len(args.posonlyargs) + len(args.args)
        required = positional - len(args.defaults)
        expected = OPTIONAL_ARITY[node.name]
        if args.vararg is None and positional < expected or required > expected:
            raise RecipeError(
                f"Recipe {path}: {node.name} takes {positional} positional parameter(s) at line "
                f"{node.lineno}; expected {node.name}{_SIGNATURES[node.name]}"
            )


def _calls_compile(tree: ast.Module) -> bool:
    return any(_is_compile_call(node) for node in ast.walk(tree))


def _is_compile_call(node: ast.AST) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"


def _check_keras_usage(path: Path, tree: ast.Module, *, fit_line: int | None = None) -> None:
    """What the runner cannot honour, when the source says it literally (the worker checks
    the imported recipe again: runner/keras_recipes/compiled.py, runner/keras_recipes/callbacks.py). ``fit_line``: the
    script's fit() call, which a refused callback is named against."""
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, (ast.Name, ast.Attribute)) and name in CALLBACKS_REFUSED:
            where = f"Recipe {path}" if fit_line is None else f"Script {path}: the fit() call at line {fit_line}"
            raise RecipeError(f"{where} uses {name} at line {node.lineno}; {CALLBACKS_REFUSED[name]}")
        if isinstance(node, ast.ClassDef):
            _check_trainer_overrides(path, node, script=fit_line is not None)
        if not _is_compile_call(node):
            continue
        for keyword in node.keywords:
            value = keyword.value
            literal = value.value if isinstance(value, ast.Constant) else ...
            if keyword.arg == "steps_per_execution" and literal is not ... and literal != 1:
                raise RecipeError(
                    f"Recipe {path}: compile(steps_per_execution={literal!r}) at line {node.lineno} is not "
                    "supported; use resilient-train's --steps-per-execution instead"
                )
            if keyword.arg in ("metrics", "weighted_metrics"):
                _check_metrics_literal(path, keyword.value, node.lineno)
            if keyword.arg == "weighted_metrics" and literal is not None and _several_losses(node):
                raise RecipeError(
                    f"Recipe {path}: compile(weighted_metrics=...) at line {node.lineno} with several losses is not "
                    f"supported: {_COMPILE_REFUSED['weighted_metrics']}"
                )
            if keyword.arg in ("run_eagerly", "jit_compile") and literal is True:
                raise RecipeError(
                    f"Recipe {path}: compile({keyword.arg}=True) at line {node.lineno} is not supported: "
                    f"{_COMPILE_REFUSED[keyword.arg]}"
                )


def _maybe_none(value: ast.AST) -> bool:
    """``None``, or a conditional with a ``None`` branch (``class_weight=None if a else {...}``)."""
    if isinstance(value, ast.Constant):
        return value.value is None
    return isinstance(value, ast.IfExp) and (_maybe_none(value.body) or _maybe_none(value.orelse))


def _compiles_several_losses(tree: ast.Module) -> int | None:
    """The line of a ``compile(loss={...} | [...], loss_weights=...)``: a model with several outputs."""
    for node in ast.walk(tree):
        if _is_compile_call(node) and _several_losses(node):
            return node.lineno
    return None


def _several_losses(call: ast.Call) -> bool:
    return any(keyword.arg == "loss_weights" or (
        keyword.arg == "loss" and isinstance(keyword.value, (ast.Dict, ast.List, ast.Tuple))) for keyword in call.keywords)


def _check_metrics_literal(path: Path, metrics: ast.AST, line: int) -> None:
    """A metric written in ``compile(metrics=...)`` whose result is not one number (one per
    class or threshold: ``"f1_score"``, ``F1Score()`` without ``average``, ``thresholds=[a, b]``),
    refused before the workers start (the worker refuses the object: runner/keras_recipes/compiled.py)."""
    for node in ast.walk(metrics):
        named = node.value.lower() if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        called = isinstance(node, ast.Call) and (
            node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute)
            else None)
        keywords = {keyword.arg: keyword.value for keyword in node.keywords} if isinstance(node, ast.Call) else {}
        average = keywords.get("average")
        thresholds = keywords.get("thresholds")
        per_class = named in VECTOR_METRIC_NAMES or called in ("F1Score", "FBetaScore") and (
            average is None or isinstance(average, ast.Constant) and average.value is None)
        per_threshold = isinstance(thresholds, (ast.List, ast.Tuple)) and len(thresholds.elts) > 1
        if per_class or per_threshold:
            shown = repr(named) if named else f"{called}()"
            raise RecipeError(
                f"Recipe {path}: compile(metrics=...) at line {line} uses {shown}, whose result is one number per "
                f"{'class' if per_class else 'threshold'}: not supported (a log, a CSV column and a callback's "
                "monitor need one number): pass average='macro' (or 'micro', 'weighted') or one threshold"
            )


def _own_train_step(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "train_step"), None)


def _check_trainer_overrides(path: Path, node: ast.ClassDef, *, script: bool) -> None:
    """A class may override ``train_step`` (the runner then runs it: runner/keras_recipes/own_step.py),
    and with it the methods its ``train_step`` calls; one that overrides any other of
    ``_TRAINER_OVERRIDES`` without ``train_step`` is refused (the runner's step would ignore it)."""
    if _own_train_step(node) is not None:
        return
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name in _TRAINER_OVERRIDES:
            raise RecipeError(
                f"{'Script' if script else 'Recipe'} {path}: class {node.name} overrides {item.name} at line "
                f"{item.lineno} but not train_step; the runner runs Keras' step or the model's own train_step, "
                "which would not call it"
            )


def _check_own_step_fit(path: Path, tree: ast.Module, call: ast.Call) -> None:
    """A script whose model has its own ``train_step``: validation in ``fit`` only with its own
    ``test_step`` too (Keras' would evaluate compile()'s loss, which such a model does not have)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or (step := _own_train_step(node)) is None:
            continue
        if any(isinstance(item, ast.FunctionDef) and item.name == "test_step" for item in node.body):
            continue
        for keyword in call.keywords:
            if keyword.arg in ("validation_data", "validation_split"):
                raise RecipeError(
                    f"Script {path}: fit({keyword.arg}=...) at line {call.lineno} with class {node.name}'s own "
                    f"train_step (line {step.lineno}) and Keras' test_step: not supported: it evaluates compile()'s "
                    "loss, which this model does not have: override test_step too"
                )


def load_recipe(spec: str) -> Recipe:
    """Import a recipe and check it against the contract (never a ``model.fit`` script:
    importing one would run it)."""
    path = check_recipe_source(spec)
    if is_fit_script(spec):
        raise RecipeError(f"{path} is a model.fit script, not a recipe: `resilient-train run` runs it; this "
                          "command needs a recipe (build_model, dataset, ...)")
    module = _import(spec, path)
    inputs = INDEXED_INPUT if callable(getattr(module, "example", None)) else DATASET_INPUT
    missing = [name for name in (*REQUIRED, *inputs)
               if not callable(getattr(module, name, None)) and name not in FROM_COMPILE]
    if missing:
        raise RecipeError(f"Recipe {path}: {', '.join(missing)} must be functions")
    defaults = dict(getattr(module, "DEFAULTS", {}) or {})
    unknown = sorted(set(defaults) - set(DEFAULT_KEYS))
    if unknown:
        raise RecipeError(f"Recipe {path}: DEFAULTS has unknown keys {unknown}; accepted: {list(DEFAULT_KEYS)}")
    metrics = getattr(module, "metrics", None)
    eval_dataset = getattr(module, "eval_dataset", None)
    callbacks = getattr(module, "callbacks", None)
    build_optimizer, loss = getattr(module, "build_optimizer", None), getattr(module, "loss", None)
    return Recipe(
        name=recipe_name(spec),
        source=str(path),
        build_model=module.build_model,
        build_optimizer=build_optimizer if callable(build_optimizer) else None,
        loss=loss if callable(loss) else None,
        dataset=_optional(module, "dataset"),
        metrics=metrics if callable(metrics) else None,
        eval_dataset=eval_dataset if callable(eval_dataset) else None,
        callbacks=callbacks if callable(callbacks) else None,
        defaults=defaults,
        params=dict(getattr(module, "PARAMS", {}) or {}),
        num_examples=_optional(module, "num_examples"),
        example=_optional(module, "example"),
        augment=_optional(module, "augment"),
    )


def _optional(module: ModuleType, name: str) -> Callable[..., Any] | None:
    value = getattr(module, name, None)
    return value if callable(value) else None


def _import(spec: str, path: Path) -> ModuleType:
    try:
        if _is_path(spec):
            name = f"resilient_train_recipe_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(name, path)
            assert loader_spec is not None and loader_spec.loader is not None  # a .py path always has one
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except RecipeError:
        raise
    except Exception as exc:  # a recipe's own import error: report it, not a traceback wall
        raise RecipeError(f"Recipe {path} failed to import: {type(exc).__name__}: {exc}") from exc


def resolve_params(defaults: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, Any]:
    """Apply ``--set key=value`` overrides, coerced to the type of each default."""
    params = dict(defaults)
    for key, raw in overrides.items():
        if key not in defaults:
            accepted = ", ".join(sorted(defaults)) or "none (the recipe defines no PARAMS)"
            raise RecipeError(f"Unknown recipe parameter {key!r} in --set {key}={raw}; accepted: {accepted}")
        params[key] = _coerce(key, raw, defaults[key])
    return params


def _coerce(key: str, raw: str, default: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    kind = type(default)
    try:
        if kind is bool:
            lowered = raw.lower()
            if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(raw)
            return lowered in {"true", "1", "yes"}
        if kind in (int, float):
            return kind(raw)
    except ValueError:
        raise RecipeError(f"Recipe parameter {key}={raw!r} is not a valid {kind.__name__}") from None
    return raw
