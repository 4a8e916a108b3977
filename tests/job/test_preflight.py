"""Pre-flight: mistakes knowable without TensorFlow end in exit 2
and one or two lines before any worker starts (no attempt directory is created)."""

import pytest

from resilient_train.cli import main
from resilient_train.errors import EXIT_USAGE

RECIPE = "recipes/linear_regression.py"  # DEFAULTS global_batch_size 4, PARAMS learning_rate 0.05


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def assert_refused(code, err, run_dir, fragment):
    assert code == EXIT_USAGE
    assert fragment in err
    assert len(err.splitlines()) <= 2 and "Traceback" not in err
    assert not (run_dir / "attempt-1").exists()


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--set", "learning_rat=0.1"], "Unknown recipe parameter 'learning_rat' in --set learning_rat=0.1; accepted: fail_at_step, learning_rate"),
        (["--set", "learning_rate=fast"], "Recipe parameter learning_rate='fast' is not a valid float"),
        (["--workers", "3"], "global_batch_size=4 (from the recipe's DEFAULTS) is not divisible by workers=3"),
        (["--workers", "2:4"], "global_batch_size=4 (from the recipe's DEFAULTS) is not divisible by 3 workers, a size in --workers 2:4"),
        (["--workers", "3:2"], "Received --workers '3:2'; expected MIN <= MAX"),
        (["--storage", "memory://bucket/ckpts"], "--storage memory://bucket/ckpts: memory:// lives inside one process"),
    ],
)
def test_flag_mistakes_exit_2_before_any_worker(capsys, tmp_path, extra, fragment):
    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "run", RECIPE, "--run-dir", str(run_dir), *extra)
    assert_refused(code, err, run_dir, fragment)


@pytest.mark.parametrize(
    "toml, fragment",
    [
        ("[params]\nlearnig_rate = 0.1\n", "Unknown recipe parameter 'learnig_rate'"),
        ("[params]\nlearning_rate = true\n", "Recipe parameter learning_rate=True in [params] is a bool; recipe linear_regression.py expects type float"),
        ("[params]\nfail_at_step = 1.5\n", "Recipe parameter fail_at_step=1.5 in [params] is a float; recipe linear_regression.py expects type int"),
    ],
)
def test_config_file_param_mistakes_exit_2(capsys, tmp_path, toml, fragment):
    config = tmp_path / "job.toml"
    config.write_text(toml)
    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "run", RECIPE, "--run-dir", str(run_dir), "--config", str(config))
    assert_refused(code, err, run_dir, fragment)


def test_run_dir_that_is_a_file_is_named(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    code, err = run_cli(capsys, "run", RECIPE, "--run-dir", str(run_dir))
    assert code == EXIT_USAGE
    assert err == f"resilient-train: error: --run-dir {run_dir}: {run_dir} is a file; expected a directory (created if missing)"
    assert run_dir.read_text() == "not a directory"


def test_recipe_defaults_with_unknown_key_found_from_source(capsys, tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text(
        'DEFAULTS = {"epochs": 1, "batch_size": 8}\n'
        "def build_model(p): ...\ndef build_optimizer(p): ...\ndef loss(y, p): ...\ndef dataset(c, e, s): ...\n"
    )
    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "run", str(recipe), "--run-dir", str(run_dir))
    assert_refused(code, err, run_dir, "DEFAULTS has unknown keys ['batch_size']")


def test_computed_defaults_are_left_to_the_worker(tmp_path):
    from resilient_train.job.preflight import literal_recipe_dicts

    recipe = tmp_path / "r.py"
    recipe.write_text("BASE = 8\nDEFAULTS = {'global_batch_size': BASE * 2}\nPARAMS: dict = {'lr': 0.1}\n")
    assert literal_recipe_dicts(recipe) == {"DEFAULTS": None, "PARAMS": {"lr": 0.1}}


# ------------------------------------------------------------ credentials on the command line
from resilient_train.job.preflight import command_line_secret_warning  # noqa: E402

_VISIBLE = "on the command line is visible to other users of this host (ps, shell history)"


@pytest.mark.parametrize(
    "pairs, storage, instead",
    [
        (["key=AKIA1", "secret=s"], "s3://b/p",
         "set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY in the environment instead (s3fs reads them)"),
        (["token=t"], "faulty://s3://b/p", "set AWS_SESSION_TOKEN in the environment instead (s3fs reads them)"),
        (["client_kwargs.password=x"], "s3://b/p",
         "set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN in the environment instead (s3fs reads them)"),
        (["token=/k.json"], "gs://b/p",
         "set GOOGLE_APPLICATION_CREDENTIALS to a key file in the environment instead (gcsfs reads it)"),
        (["password=x"], "sftp://h/p", "use the storage library's own environment variables or config file instead"),
    ],
)
def test_a_secret_storage_option_warns_with_the_backend_variable(pairs, storage, instead):
    keys = ", ".join(p.partition("=")[0] for p in pairs)
    assert command_line_secret_warning(pairs, storage) == (
        f"resilient-train: warning: --storage-option {keys} {_VISIBLE}; {instead}"
    )


def test_public_storage_options_do_not_warn():
    assert command_line_secret_warning(["anon=true", "client_kwargs.endpoint_url=http://x"], "s3://b") is None


def test_run_prints_the_warning_once_and_never_the_value(capsys, tmp_path, monkeypatch):
    import resilient_train.job.preflight as preflight_module
    import resilient_train.supervisor.supervisor as supervisor_module

    class Started:
        def __init__(self, job, **kwargs):
            self.job = job

        def run(self):
            return 0

    monkeypatch.setattr(supervisor_module, "Supervisor", Started)
    monkeypatch.setattr(preflight_module, "check_reachable", lambda url, options: None)  # no network here
    code, err = run_cli(capsys, "run", RECIPE, "--run-dir", str(tmp_path / "run"), "--storage", "s3://b/p",
                        "--storage-option", "key=AKIAEXAMPLE", "--storage-option", "secret=wJalrEXAMPLE")
    assert code == 0
    assert err.splitlines() == [
        f"resilient-train: warning: --storage-option key, secret {_VISIBLE}; "
        "set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY in the environment instead (s3fs reads them)"
    ]


@pytest.mark.parametrize("mode", ["0649", "0600", "rw"])
def test_a_bad_run_dir_mode_is_one_line_and_exit_2(capsys, tmp_path, mode):
    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "run", RECIPE, "--run-dir", str(run_dir), "--run-dir-mode", mode)
    assert_refused(code, err, run_dir, "")
    assert err == (
        f"resilient-train: error: Received run_dir_mode={mode!r}; expected an octal mode from 0700 to 0777 "
        "that gives the owner rwx, e.g. 0700 or 0750"
    )
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "recipe, extra, fragment",
    [
        ("recipes/digits_keras.py", [], "does not define build_optimizer and loss; --strategy parameter-server needs both"),
        (RECIPE, ["--launcher", "ray"], "Received launcher='ray' with strategy='parameter-server'; expected 'local'"),
        (RECIPE, ["--ps", "0"], "Received ps=0"),
        (RECIPE, ["--workers", "1:2"], "Received --workers 1:2 with strategy='parameter-server'; expected a fixed N"),
    ],
)
def test_parameter_server_refusals_exit_2_before_any_process(capsys, tmp_path, recipe, extra, fragment):
    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "run", recipe, "--run-dir", str(run_dir), "--strategy", "parameter-server", *extra)
    assert_refused(code, err, run_dir, fragment)


def test_worker_command_refuses_the_parameter_server_tier(capsys):
    code, err = run_cli(capsys, "worker", RECIPE, "--strategy", "parameter-server")
    assert code == EXIT_USAGE
    assert err == ("resilient-train: error: resilient-train worker runs MultiWorkerMirroredStrategy workers only; "
                   "--strategy parameter-server runs under `resilient-train run` on one host (docs/parameter_server.md)")


def test_parameter_server_batch_need_not_divide_by_workers(capsys, tmp_path):
    """One parameter-server step is one worker's batch: --workers 3 with batch 4 passes pre-flight."""
    from resilient_train.errors import ConfigError
    from resilient_train.job.config import JobConfig
    from resilient_train.job.preflight import preflight

    preflight(JobConfig(RECIPE, workers=3, strategy="parameter-server", run_dir=str(tmp_path / "run")))
    with pytest.raises(ConfigError, match="not divisible by workers=3"):
        preflight(JobConfig(RECIPE, workers=3, run_dir=str(tmp_path / "run")))
