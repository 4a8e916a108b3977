"""Bad input: one or two lines naming the bad value, a non-zero exit, nothing started."""

import subprocess
import sys
from pathlib import Path

import pytest

from resilient_train.cli import main
from resilient_train.errors import EXIT_USAGE
from resilient_train.runner.process.worker_main import main as worker_main

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "recipes/linear_regression.py", "--workers", "0"], "Received workers=0; expected an integer >= 1"),
        (["run", "recipes/linear_regression.py", "--steps-per-epoch", "-5"], "Received steps_per_epoch=-5; expected an integer >= 1"),
        (["run", "recipes/missing.py"], "Recipe file 'recipes/missing.py' does not exist"),
        (["run", "recipes/linear_regression.py", "--set", "oops"], "Received --set 'oops'; expected key=value"),
        (["run", "recipes/linear_regression.py", "--storage", "nope://x"], "nope://x"),
        (["run"], "No recipe given"),
        (["run", "tests/recipes/slow_digits.py", "--eval-every-epochs", "1"], "defines no eval_dataset(input_context, seed)"),
        (["run", "recipes/linear_regression.py", "--eval-steps", "0"], "Received eval_steps=0; expected an integer >= 1"),
    ],
)
def test_bad_run_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, err = run_cli(capsys, *argv, "--run-dir", str(tmp_path / "run"))
    assert code == EXIT_USAGE
    assert message in err
    assert len(err.splitlines()) <= 2 and "Traceback" not in err
    assert not (tmp_path / "run" / "attempt-1").exists()


def test_recipe_without_required_function(capsys, tmp_path):
    recipe = tmp_path / "partial.py"
    recipe.write_text("def build_model(params):\n    return None\n")
    code, err = run_cli(capsys, "run", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert code == EXIT_USAGE
    assert err == (
        f"resilient-train: error: Recipe {recipe} does not define build_optimizer, loss, dataset; "
        "a recipe must define build_model, build_optimizer, loss, dataset "
        "(build_optimizer and loss may come from model.compile(); dataset may be num_examples + example "
        "instead; see resilient_train/job/recipe.py)"
    )


def test_unwritable_storage_is_named_and_nothing_committed_is_touched(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, err = run_cli(capsys, "run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run"), "--storage", str(blocker / "ckpts"))
    assert code == EXIT_USAGE
    assert str(blocker / "ckpts") in err and "Traceback" not in err
    assert blocker.read_text() == "not a directory"


def test_malformed_tf_config_for_a_worker(capsys, tmp_path):
    code = worker_main(["recipes/linear_regression.py", "--run-dir", str(tmp_path)], environ={"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 4}}'})
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE
    assert err == "resilient-train worker: TF_CONFIG task index 4 is out of range; cluster['worker'] has 1 entries"


def test_console_script_and_module_are_the_same_entry_point():
    out = subprocess.run([sys.executable, "-m", "resilient_train", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "run" in out.stdout and "verify" in out.stdout
    script = Path(sys.executable).parent / "resilient-train"
    assert script.exists()
    out2 = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd=REPO)
    assert out2.returncode == 0 and out2.stdout == out.stdout


def test_export_without_a_committed_checkpoint_is_one_line_and_exit_2(capsys, tmp_path):
    code, err = run_cli(capsys, "export", str(tmp_path / "empty"), "--recipe", "recipes/linear_regression.py",
                        "--out", str(tmp_path / "out"))
    assert (code, err) == (EXIT_USAGE, f"resilient-train export: no committed checkpoint under {tmp_path / 'empty'}")
    assert not (tmp_path / "out").exists()


def test_a_user_error_never_prints_url_user_info(capsys, tmp_path):
    code, err = run_cli(capsys, "run", "recipes/linear_regression.py", "--run-dir", str(tmp_path / "run"),
                        "--storage", "memory://me:pa55word@bucket/ckpts")
    assert code == EXIT_USAGE
    assert "pa55word" not in err and "memory://***@bucket/ckpts" in err


@pytest.mark.parametrize(
    "argv, line",
    [
        (["run", "recipes/linear_regression.py", "--wokers", "2"],
         "resilient-train run: error: unrecognized arguments: --wokers 2; did you mean --workers?"),
        # Abbreviations are refused: --epoch 1 --steps-per-ep 20 used to train 20 steps silently.
        (["run", "recipes/linear_regression.py", "--epoch", "1", "--steps-per-ep", "20"],
         "resilient-train run: error: unrecognized arguments: --epoch 1 --steps-per-ep 20; "
         "did you mean --epochs (for --epoch), --steps-per-epoch (for --steps-per-ep)?"),
        (["verify", "/tmp/x", "--jsn"], "resilient-train verify: error: unrecognized arguments: --jsn; did you mean --json?"),
        (["ls", "/tmp/x", "--xyzzy"], "resilient-train ls: error: unrecognized arguments: --xyzzy"),
    ],
)
def test_an_unknown_or_abbreviated_flag_is_two_lines_with_the_closest_flag_and_exit_2(capsys, argv, line):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE
    prog = line.partition(": error:")[0]
    assert capsys.readouterr().err.splitlines() == [line, f"{prog} --help lists what is accepted"]


def test_no_parser_accepts_abbreviations():
    import argparse

    from resilient_train.cli import _parser

    top = _parser()
    (subparsers,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = {"resilient-train": top, **subparsers.choices}
    assert {name: p.allow_abbrev for name, p in parsers.items()} == {name: False for name in parsers}
    assert sorted(subparsers.choices) == ["check", "diff", "doctor", "export", "ls", "report", "run", "verify", "worker"]


def test_a_mistyped_flag_in_a_real_process_is_refused_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "resilient_train", "run", "recipes/linear_regression.py",
                           "--run-dir", str(tmp_path / "run"), "--wokers", "2"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.splitlines() == [
        "resilient-train run: error: unrecognized arguments: --wokers 2; did you mean --workers?",
        "resilient-train run --help lists what is accepted",
    ]
    assert not (tmp_path / "run").exists()
