"""export.py in-process: formats, the digest check, reloading (no workers)."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

from resilient_train.errors import CheckpointIncompatibleError  # noqa: E402
from resilient_train.runner.outputs.model_export import export_model, exported_weights_sha256  # noqa: E402
from resilient_train.runner.state.model_state import weight_paths  # noqa: E402
from resilient_train.runner.state.model_state import weights_digest  # noqa: E402


def small_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])


def test_reloaded_model_has_the_digest_and_predicts_the_same(tmp_path):
    model = small_model(1)
    digest = weights_digest(model)
    record = export_model(model, tmp_path / "model", paths=weight_paths(model), weights_sha256=digest,
                          info={"global_step": 7})
    assert (record["weights_sha256"], record["global_step"]) == (digest, 7)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["export.json", "model.keras", "saved_model"]
    assert json.loads((tmp_path / "model" / "export.json").read_text())["weight_paths"] == weight_paths(model)

    loaded = keras.models.load_model(tmp_path / "model" / "model.keras")
    assert weights_digest(loaded) != digest  # Keras renamed the variables on load (no "sequential/")...
    assert exported_weights_sha256(loaded, tmp_path / "model") == digest  # ...export.json names them back
    batch = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    expected = model.predict(batch, verbose=0)
    np.testing.assert_array_equal(loaded.predict(batch, verbose=0), expected)
    serving = tf.saved_model.load(str(tmp_path / "model" / "saved_model"))  # keep it: it owns the variables
    np.testing.assert_array_equal(serving.serve(batch).numpy(), expected)


def test_one_format_and_replacing_an_earlier_export(tmp_path):
    first, second = small_model(1), small_model(2)
    export_model(first, tmp_path / "m", paths=weight_paths(first), weights_sha256=weights_digest(first))
    record = export_model(second, tmp_path / "m", paths=weight_paths(second), weights_sha256=weights_digest(second),
                          formats=("keras",))
    assert record["files"] == {"keras": "model.keras"}
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["export.json", "model.keras"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no staging or old copies left behind


def test_weights_that_do_not_match_the_checkpoint_are_not_exported(tmp_path):
    model = small_model(1)
    with pytest.raises(CheckpointIncompatibleError, match=r"the model to export has weights_sha256 \w{16}\.\.\., the checkpoint 0{16}"):
        export_model(model, tmp_path / "m", paths=weight_paths(model), weights_sha256="0" * 64)
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match=r"Received formats=\['onnx'\]; expected some of \['keras', 'saved_model'\]"):
        export_model(model, tmp_path / "m", paths=weight_paths(model), weights_sha256=weights_digest(model), formats=("onnx",))


class Pair(keras.Model):
    """keras.io's VAE shape: a subclass made of models, no get_config (Keras cannot write model.keras)."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x):
        return self.inner(x)


def test_a_subclass_without_get_config_is_exported_as_its_weights_and_says_what_to_add(tmp_path):
    model = Pair(small_model(1))
    batch = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    expected = model(batch).numpy()
    with pytest.raises(NotImplementedError):  # plain Keras' own, with no message
        model.save(tmp_path / "plain.keras")
    record = export_model(model, tmp_path / "m", paths=weight_paths(model), weights_sha256=weights_digest(model))
    assert record["files"] == {"weights": "model.weights.h5", "saved_model": "saved_model"}
    assert record["skipped"] == {"keras": "Pair has no get_config(): add get_config() to Pair for model.keras, or "
                                          "rebuild Pair(...) in code and call load_weights('model.weights.h5')"}
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["export.json", "model.weights.h5", "saved_model"]
    rebuilt = Pair(small_model(2))
    rebuilt(batch)
    rebuilt.load_weights(tmp_path / "m" / "model.weights.h5")
    np.testing.assert_array_equal(rebuilt(batch).numpy(), expected)
    assert exported_weights_sha256(rebuilt, tmp_path / "m") == weights_digest(model)


def test_without_call_the_savedmodel_is_skipped_too_and_says_why(tmp_path):
    class NoCall(Pair):  # keras.io's VAE: train_step only, no call()
        call = keras.Model.call

    model = NoCall(small_model(1))
    model.inner(np.zeros((1, 3), np.float32))
    record = export_model(model, tmp_path / "m", paths=weight_paths(model), weights_sha256=weights_digest(model))
    assert record["files"] == {"weights": "model.weights.h5"}
    assert sorted(record["skipped"]) == ["keras", "saved_model"]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["export.json", "model.weights.h5"]
    # Never called, never built: Keras' load_weights refuses such a model, so the line says what to do first.
    assert record["skipped"]["keras"].endswith("rebuild NoCall(...) in code and set its built = True (it is never "
                                               "called) and call load_weights('model.weights.h5')")
    rebuilt = NoCall(small_model(2))
    with pytest.raises(ValueError, match="not yet been built"):
        rebuilt.load_weights(tmp_path / "m" / "model.weights.h5")
    rebuilt.built = True
    rebuilt.load_weights(tmp_path / "m" / "model.weights.h5")
    assert exported_weights_sha256(rebuilt, tmp_path / "m") == weights_digest(model)
