"""Pre-flight: every mistake knowable without TensorFlow, caught before any worker starts.

Starting a worker costs seconds (TensorFlow import, strategy start-up), and a mistake found
there ends as exit 3 with a traceback in a worker log. The README promises exit 2 and one
line before anything runs, so the supervisor (``cli.py``) calls :func:`preflight` first.

What it checks, reading the recipe's *source* (never importing it: an import may run
TensorFlow ops, which must not happen in the supervisor):

* the recipe parses and defines the required functions (``recipe.check_recipe_source``);
* ``DEFAULTS`` / ``PARAMS`` when they are literal dicts (a computed value is left to the
  worker, which checks the imported recipe the same way): unknown ``DEFAULTS`` keys,
  unknown ``--set`` / ``[params]`` keys, values that do not fit the type of the default;
* the effective global batch size (flag, recipe default, fallback) divides by ``--workers``;
* ``--run-dir`` is (or can become) a directory, not a file;
* ``--storage`` is not ``memory://``: each worker process has its own memory filesystem,
  so every checkpoint would be lost with the process that wrote it;
* an object store's endpoint resolves and accepts a TCP connection within seconds
  (checkpoint/endpoint.py): the storage client's own retries against a dead endpoint take
  minutes, and the supervisor's probe of the store would wait through all of them;
* ``--strategy parameter-server``: the recipe defines ``build_optimizer`` and ``loss`` itself
  (a recipe that leaves them to ``model.compile()`` trains through Keras ``fit``, which Keras 3
  cannot run under ParameterServerStrategy; docs/parameter_server.md).

Each failure raises :class:`~resilient_train.errors.ConfigError`,
:class:`~resilient_train.errors.RecipeError` or (the endpoint)
:class:`~resilient_train.errors.StorageError` naming the bad value and what is accepted.

One thing is a warning, not a failure (:func:`command_line_secret_warning`): a credential
given as ``--storage-option`` works, and is kept off disk (rundir/redact.py), but a command
line is visible to every user of the host (``ps``) and stays in shell history, so the
storage library's own environment variable is the better place.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Iterable, Mapping

from resilient_train.checkpoint.endpoint import check_reachable
from resilient_train.job.config import FALLBACK_DEFAULTS, JobConfig
from resilient_train.errors import ConfigError, RecipeError
from resilient_train.job.recipe import DEFAULT_KEYS, check_recipe_source, is_fit_script, resolve_params
from resilient_train.rundir.redact import is_secret_key

__all__ = ["preflight", "literal_recipe_dicts", "command_line_secret_warning"]

# Where each backend's library reads credentials from instead (botocore for s3fs, google-auth for gcsfs).
_S3_VARIABLES = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN",
                 "aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
                 "aws_session_token": "AWS_SESSION_TOKEN"}
_S3_ALL = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_GCS = "GOOGLE_APPLICATION_CREDENTIALS"

_PROCESS_LOCAL_SCHEMES = ("memory://", "faulty://memory://")


def preflight(job: JobConfig) -> None:
    """Raise ``ConfigError`` / ``RecipeError`` for the first mistake found in ``job``."""
    path = check_recipe_source(job.recipe, eval_every_epochs=job.eval_every_epochs, record_indices=job.record_indices)
    if is_fit_script(job.recipe):
        _check_fit_script_flags(path, job)
    literals = literal_recipe_dicts(path)
    defaults = literals.get("DEFAULTS")
    if defaults is not None:
        _check_defaults(path, defaults)
    if job.strategy == "parameter-server":
        _check_parameter_server_recipe(path)
    else:  # under parameter servers one step is one worker's batch: nothing to divide
        _check_batch_divisibility(job, defaults)
    recipe_params = literals.get("PARAMS")
    if recipe_params is not None:
        _check_params(path, recipe_params, job.params)
    _check_run_dir(Path(job.run_dir))
    _check_storage(job)


def _check_fit_script_flags(path: Path, job: JobConfig) -> None:
    """A fit script's fit() call sets the sizes; a flag that would differ is refused."""
    for name in ("epochs", "steps_per_epoch", "global_batch_size"):
        if getattr(job, name) is not None:
            raise ConfigError(
                f"--{name.replace('_', '-')} {getattr(job, name)} with the fit() script {path}: the script's "
                "fit() call and its dataset's batch set it; leave the flag out"
            )
    if job.eval_every_epochs:
        raise ConfigError(f"--eval-every-epochs {job.eval_every_epochs} with the fit() script {path}: a script "
                          "has no eval_dataset(); pass fit(validation_data=..., validation_freq=N) in the script")
    if job.record_indices:
        raise ConfigError(f"--record-indices with the fit() script {path}: it needs the indexed recipe contract "
                          "(num_examples + example); a script's input is its own tf.data.Dataset")
    if job.elastic:
        raise ConfigError(f"--workers {job.world_sizes.start}:{job.workers} with the fit() script {path}: a script's "
                          "batch and input are its own, so resizing it is not supported; pass --workers N")


def literal_recipe_dicts(path: Path) -> dict[str, dict[str, Any] | None]:
    """``DEFAULTS`` and ``PARAMS`` from the recipe's source, where they are literal dicts.

    A name that is absent maps to ``{}`` (the recipe has none); one assigned something that
    is not a literal dict maps to ``None`` (unknown before import; the worker checks it).
    A ``model.fit`` script's sizes come from its fit() call at run time: ``DEFAULTS`` is
    ``None`` (unknown before it runs).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    if is_fit_script(str(path)):
        return {"DEFAULTS": None, "PARAMS": {}}
    found: dict[str, dict[str, Any] | None] = {"DEFAULTS": {}, "PARAMS": {}}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and target.id in found:
                found[target.id] = _literal_dict(value)
    return found


def _literal_dict(node: ast.AST | None) -> dict[str, Any] | None:
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _check_defaults(path: Path, defaults: Mapping[str, Any]) -> None:
    unknown = sorted(set(defaults) - set(DEFAULT_KEYS))
    if unknown:
        raise RecipeError(f"Recipe {path}: DEFAULTS has unknown keys {unknown}; accepted: {list(DEFAULT_KEYS)}")


def _check_batch_divisibility(job: JobConfig, defaults: Mapping[str, Any] | None) -> None:
    if job.global_batch_size is not None:
        return  # JobConfig already checked the flag's value
    if defaults is None:
        return  # computed DEFAULTS: the worker checks after import
    batch = defaults.get("global_batch_size", FALLBACK_DEFAULTS["global_batch_size"])
    if not isinstance(batch, int) or isinstance(batch, bool):
        return
    source = "the recipe's DEFAULTS" if "global_batch_size" in defaults else "the default"
    indivisible = job.size_not_dividing(batch)
    if indivisible is not None and job.elastic:
        raise ConfigError(
            f"global_batch_size={batch} (from {source}) is not divisible by {indivisible} workers, a size in "
            f"--workers {job.min_workers}:{job.workers}; pass a --global-batch-size that every size in MIN..MAX divides"
        )
    if indivisible is not None:
        raise ConfigError(
            f"global_batch_size={batch} (from {source}) is not divisible by workers={job.workers}; "
            "pass --global-batch-size with a multiple of --workers, or change --workers"
        )


def _check_parameter_server_recipe(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [name for name in ("build_optimizer", "loss") if name not in defined]
    if missing:
        raise RecipeError(
            f"Recipe {path} does not define {' and '.join(missing)}; --strategy parameter-server needs both "
            "(Keras 3's fit, which a compiled model trains with, has no ParameterServerStrategy support)"
        )


def _check_params(path: Path, recipe_params: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    resolve_params(recipe_params, overrides)  # unknown keys, strings that do not parse
    for key, value in overrides.items():
        if isinstance(value, str):
            continue  # --set values: resolve_params coerced (or refused) them
        default = recipe_params[key]
        if not _same_kind(value, default):
            raise ConfigError(
                f"Recipe parameter {key}={value!r} in [params] is a {type(value).__name__}; "
                f"recipe {path.name} expects type {type(default).__name__} (its PARAMS default is {default!r})"
            )


def _same_kind(value: Any, default: Any) -> bool:
    """A TOML value fits a default of the same type; an int also fits a float default."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return default is None or isinstance(value, type(default))


def _check_run_dir(run_dir: Path) -> None:
    for candidate in (run_dir, *run_dir.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise ConfigError(
                    f"--run-dir {run_dir}: {candidate} is a file; expected a directory (created if missing)"
                )
            return


def _check_storage(job: JobConfig) -> None:
    if job.storage.startswith(_PROCESS_LOCAL_SCHEMES):
        raise ConfigError(
            f"--storage {job.storage}: memory:// lives inside one process and every worker is its own "
            "process, so no checkpoint would survive a restart; use a directory, file:// or s3://"
        )
    check_reachable(job.storage, job.storage_options)


def command_line_secret_warning(pairs: Iterable[str], storage: str) -> str | None:
    """One warning line when ``--storage-option`` items on the command line look like credentials.

    ``pairs`` are the raw ``KEY=VALUE`` items (the TOML file's ``[storage_options]`` is not a
    command line: no warning); ``storage`` picks the backend's variables. None when none looks
    secret. The line never contains a value.
    """
    keys = []
    for item in pairs:
        key = item.partition("=")[0].strip()
        if any(is_secret_key(part) for part in key.split(".")) and key not in keys:
            keys.append(key)
    if not keys:
        return None
    scheme = storage.removeprefix("faulty://").partition("://")[0] if "://" in storage else "file"
    if scheme in ("s3", "s3a"):
        leaves = [_S3_VARIABLES.get(k.rsplit(".", 1)[-1].lower()) for k in keys]
        named = list(dict.fromkeys(v for v in leaves if v)) if all(leaves) else list(_S3_ALL)
        instead = f"set {', '.join(named)} in the environment instead (s3fs reads them)"
    elif scheme in ("gs", "gcs"):
        instead = f"set {_GCS} to a key file in the environment instead (gcsfs reads it)"
    else:
        instead = "use the storage library's own environment variables or config file instead"
    return (
        f"resilient-train: warning: --storage-option {', '.join(keys)} on the command line is visible to "
        f"other users of this host (ps, shell history); {instead}"
    )
