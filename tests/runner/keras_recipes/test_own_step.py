"""A model's own train_step (runner/keras_recipes/own_step.py): its epoch logs as Keras picks
them, its trackers in the checkpoint graph, and a twin of a subclass Keras cannot clone."""


import numpy as np
import pytest
import tensorflow as tf

from resilient_train.errors import RecipeError
from resilient_train.job.recipe import Recipe
from resilient_train.runner.keras_recipes.fitscript import model_then_twins
from resilient_train.runner.keras_recipes.own_step import (build_twin_optimizers, equal_share, LastLogs, OwnStep,
                                                           from_own_step, has_own_step, own_optimizers)
from resilient_train.runner.state import ckpt_layout


def vae_like(keras):
    class Pair(keras.Model):  # keras.io's VAE shape: sub-models as arguments, no get_config, trackers
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder, self.decoder = encoder, decoder
            self.total = keras.metrics.Mean(name="total")

        @property
        def metrics(self):
            return [self.total]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self.decoder(self.encoder(data)) - data))
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total.update_state(loss)
            return {"total": self.total.result()}

    def dense(units, width=3):
        inputs = keras.Input((width,))
        return keras.Model(inputs, keras.layers.Dense(units)(inputs))

    return Pair, dense


def recipe():
    return Recipe(name="s", source="/x/s.py", build_model=lambda p: None, build_optimizer=None, loss=None,
                  dataset=None)


def test_the_step_runs_train_step_and_the_epoch_logs_are_the_trackers_or_the_last_logs():
    import keras

    Pair, dense = vae_like(keras)
    model = Pair(dense(2), dense(3, width=2))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    assert has_own_step(model) and not has_own_step(dense(2))
    own = OwnStep(model, tf.distribute.get_strategy(), from_own_step(recipe(), model))
    data = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    own.step(data)
    second = own.step(data)
    assert float(model.total.count) == 2.0
    assert float(second["total"]) == float(model.total.total) / 2  # the tracker's mean over both steps
    # names that are model.metrics': their results; other names: the last step's logs (Keras' choice)
    assert own.epoch_logs({"total": 0.0}) == {"total": float(model.total.result())}
    assert own.epoch_logs({"loss": 1.5}) == {"loss": 1.5}
    own.reset()
    assert float(model.total.count) == 0.0
    logs = LastLogs()
    logs.add({"total": 1.0})
    logs.add({"total": 2.0})
    assert (logs.means(), logs.batches) == ({"total": 2.0}, 2)


def _saved_then_restored(shares: np.ndarray, replicas: int, order: str) -> np.ndarray:
    """What a save (the replicas' float32 sum, added ``order``-wise) and a restore (that sum
    divided by the replicas: TensorFlow's get_on_read_restore_ops) give back for equal shares."""
    parts = [shares] * replicas
    if order == "ring":
        total = parts[0]
        for part in parts[1:]:
            total = (total + part).astype(np.float32)
    else:  # pairwise, as a tree
        while len(parts) > 1:
            parts = [(parts[i] + parts[i + 1]).astype(np.float32) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        total = parts[0]
    return (tf.constant(total) / replicas).numpy()


@pytest.mark.parametrize("replicas", range(1, 9))
def test_an_equal_share_of_a_trackers_sum_comes_back_exactly_from_a_save_and_a_restore(replicas):
    rng = np.random.default_rng(replicas)
    totals = np.concatenate([rng.normal(scale=1e3, size=4000), rng.uniform(0, 1, 4000),
                             np.arange(1, 4000)]).astype(np.float32)
    shares = equal_share(tf.constant(totals), replicas).numpy()
    for order in ("ring", "pairwise"):
        assert np.array_equal(_saved_then_restored(shares, replicas, order), shares), order
    if replicas <= 2:  # a halving: the sum itself, bit for bit
        assert np.array_equal(shares * np.float32(replicas), totals)
    else:  # its lowest ceil(log2(replicas)) <= 3 bits cleared: within 2**-20 (and two roundings) of the sum
        assert np.allclose(shares * replicas, totals, rtol=2.0 ** -19, atol=0)
    # Without the cleared bits, the plain quotient does not always come back: measured, with 3-5
    # replicas it happens to, with 6-8 not (here and in 2e6 draws).
    naive = (tf.constant(totals) / replicas).numpy()
    assert replicas < 6 or not np.array_equal(_saved_then_restored(naive, replicas, "ring"), naive)


def test_the_trackers_are_in_the_graph_under_the_metrics_key_only_for_an_own_step():
    import keras

    Pair, dense = vae_like(keras)
    model = Pair(dense(2), dense(3, width=2))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    counters = ckpt_layout.new_counters()
    graph = ckpt_layout.training_graph(model=model, optimizer=model.optimizer, counters=counters, rng={},
                                       metrics=ckpt_layout.metric_state(model))
    assert sorted(ckpt_layout.metric_state(model)) == ["total_count", "total_total"]
    plain = ckpt_layout.training_graph(model=model, optimizer=model.optimizer, counters=counters, rng={})
    assert "metrics" in dir(graph) and "metrics" not in dir(plain)


def test_a_subclass_keras_cannot_clone_is_twinned_from_its_arguments():
    import keras

    Pair, dense = vae_like(keras)
    encoder, decoder = dense(2), dense(3, width=2)
    model = Pair(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    arguments = {id(model): ((encoder, decoder), {})}
    build_model = model_then_twins(model, lambda m: arguments.get(id(m)))
    assert build_model({}) is model
    twin = build_model({})
    assert type(twin) is Pair and twin is not model
    assert [v.shape for v in twin.weights] == [v.shape for v in model.weights]
    assert not {id(v) for v in twin.weights} & {id(v) for v in model.weights}  # its own variables
    assert twin.encoder is not encoder and type(twin.optimizer) is keras.optimizers.Adam
    assert len(ckpt_layout.twin_metric_state(model, twin)) == 2
    unrecorded = model_then_twins(model)
    assert unrecorded({}) is model
    with pytest.raises(RecipeError, match=r"pass --checkpoint-mode sync$"):  # no recorded arguments
        unrecorded({})


def test_validation_and_run_eagerly_are_refused_in_the_users_terms():
    import dataclasses

    import keras

    from resilient_train.errors import RecipeRefused

    Pair, dense = vae_like(keras)
    model = Pair(dense(2), dense(3, width=2))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    script = dataclasses.replace(recipe(), source="examples/keras_vae.py", eval_dataset=lambda context, seed: None)
    with pytest.raises(RecipeRefused) as caught:
        from_own_step(script, model)
    assert str(caught.value) == ("Script keras_vae.py: its model has its own train_step and validation, but Keras' own "
                                 "test_step; not supported: it evaluates compile()'s loss, which this model does not "
                                 "have: override test_step too")
    eager = Pair(dense(2), dense(3, width=2))
    eager.compile(optimizer="sgd", run_eagerly=True)
    with pytest.raises(RecipeRefused) as caught:
        from_own_step(recipe(), eager)
    assert str(caught.value) == ("recipe s: build_model() returned a model with its own train_step and "
                                 "run_eagerly=True; the runner compiles its step (leave run_eagerly unset)")


def test_a_recipes_own_optimizers_are_accepted_and_its_twins_built_at_the_live_ones_positions():
    import keras

    Pair, dense = vae_like(keras)

    class Gan(Pair):
        def train_step(self, data):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self.decoder(self.encoder(data)) - data))
            grads = tape.gradient(loss, self.decoder.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.decoder.trainable_weights))
            self.total.update_state(loss)
            return {"total": self.total.result()}

    def build():  # a recipe's build_model: called again for the asynchronous checkpoint's twin
        model = Gan(dense(2), dense(3, width=2))
        model.compile(optimizer="sgd")
        model.d_optimizer, model.g_optimizer = keras.optimizers.Adam(), keras.optimizers.Adam()
        return model

    model, twin = build(), build()
    assert from_own_step(recipe(), model).build_optimizer({}) is model.optimizer  # a recipe's: accepted
    OwnStep(model, tf.distribute.get_strategy(), recipe()).build_own_optimizers(tf.TensorSpec([4, 3], tf.float32))
    assert model.g_optimizer.built and not model.d_optimizer.built and not twin.g_optimizer.built
    build_twin_optimizers(model, twin)
    assert [v.path for v in twin.g_optimizer._trainable_variables] == [v.path for v in twin.decoder.trainable_weights]
    assert not twin.d_optimizer.built  # as the live one: never applied
    live, theirs = (tf.train.Checkpoint(model=m) for m in (model, twin))
    assert sorted(_keys(live)) == sorted(_keys(theirs))


def test_own_optimizers_are_built_by_a_trace_that_runs_nothing_and_twinned_at_the_same_positions():
    import keras

    Pair, dense = vae_like(keras)

    class Gan(Pair):  # each sub-model has its optimizer, the decoder's applied first
        def train_step(self, data):
            for net, optimizer in ((self.decoder, self.g_optimizer), (self.encoder, self.d_optimizer)):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(self.decoder(self.encoder(data)) - data))
                grads = tape.gradient(loss, net.trainable_weights)
                optimizer.apply_gradients(zip(grads, net.trainable_weights))
            self.total.update_state(loss)
            return {"total": self.total.result()}

    encoder, decoder = dense(2), dense(3, width=2)
    model = Gan(encoder, decoder)
    model.compile(optimizer="sgd")
    model.d_optimizer, model.g_optimizer = keras.optimizers.Adam(), keras.optimizers.Adam()
    before = [v.numpy().copy() for v in model.weights]
    OwnStep(model, tf.distribute.get_strategy(), recipe()).build_own_optimizers(tf.TensorSpec([4, 3], tf.float32))
    assert [v.path for v in model.g_optimizer._trainable_variables] == [v.path for v in decoder.trainable_weights]
    assert [v.path for v in model.d_optimizer._trainable_variables] == [v.path for v in encoder.trainable_weights]
    assert all(int(o.iterations.numpy()) == 0 for o in own_optimizers(model).values())  # no step ran
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.weights, strict=True))
    arguments = {id(model): ((encoder, decoder), {})}
    build_model = model_then_twins(model, lambda m: arguments.get(id(m)))
    assert build_model({}) is model
    copy = build_model({})  # the asynchronous checkpoint's twin
    assert copy.g_optimizer is not model.g_optimizer and copy.total is not model.total
    assert [v.path for v in copy.g_optimizer._trainable_variables] == [v.path for v in copy.decoder.trainable_weights]
    live, theirs = (tf.train.Checkpoint(model=m) for m in (model, copy))
    assert sorted(_keys(live)) == sorted(_keys(theirs))  # model/d_optimizer/... at the same keys


def _keys(checkpoint):
    import tempfile

    path = checkpoint.write(tempfile.mkdtemp() + "/ckpt")
    return [name for name, _ in tf.train.list_variables(path) if "optimizer" in name]
