"""`resilient-train check RECIPE`: two fresh processes, epochs built in
the orders 0,1 and 1,0; exit 0 when the batches agree, 1 naming what differs."""

from pathlib import Path

from resilient_train.cli import main
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

BASE = Path(__file__).resolve().parents[3] / "recipes" / "linear_regression.py"


def variant(tmp_path: Path, old: str, new: str) -> str:
    path = tmp_path / "r.py"
    path.write_text(BASE.read_text().replace(old, new))
    return str(path)


def test_seeded_and_unseeded_shuffles_are_deterministic(capsys, tmp_path):
    assert main(["check", str(BASE)]) == EXIT_OK
    unseeded = variant(tmp_path, "ds.shuffle(len(features), seed=seed * 1000 + epoch)", "ds.shuffle(len(features))")
    assert main(["check", unseeded]) == EXIT_OK
    assert capsys.readouterr().out.count("deterministic: the first 3 batches of epochs 0 and 1 are identical") == 2


def test_numpy_global_random_input_is_deterministic(capsys, tmp_path):
    recipe = variant(tmp_path, "ds = tf.data.Dataset.from_tensor_slices((features, labels))",
                     "order = np.random.permutation(24)\n"
                     "    ds = tf.data.Dataset.from_tensor_slices((features[order], labels[order]))")
    assert main(["check", recipe]) == EXIT_OK
    assert "deterministic: the first 3 batches of epochs 0 and 1 are identical" in capsys.readouterr().out


def test_input_from_fresh_entropy_is_reported(capsys, tmp_path):
    # np.random.permutation (the global generator) is reseeded per epoch like TensorFlow's
    # seed (runner/input/determinism.py); a generator with its own entropy is not.
    recipe = variant(tmp_path, "ds = tf.data.Dataset.from_tensor_slices((features, labels))",
                     "order = np.random.default_rng().permutation(24)\n"
                     "    ds = tf.data.Dataset.from_tensor_slices((features[order], labels[order]))")
    assert main(["check", recipe]) == EXIT_FAILURE
    out = capsys.readouterr().out
    assert out.startswith("NOT deterministic: epoch 0 batch 0 differs between two fresh processes")


def test_a_recipe_that_fails_is_one_line_and_exit_2(capsys, tmp_path):
    recipe = variant(tmp_path, "def dataset(input_context, epoch, seed):\n", "def dataset(input_context, epoch, seed):\n    raise ValueError('no data here')\n")
    assert main(["check", recipe]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == "resilient-train: error: the input probe failed (exit 1): ValueError: no data here"
