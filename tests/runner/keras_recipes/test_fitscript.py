"""The fit script's worker side: each worker's slice of the global batches, and the fit()
calls refused at run time (what the source check cannot see)."""

import numpy as np
import pytest
import tensorflow as tf

from resilient_train.cluster.tf_config import ClusterInfo
from resilient_train.errors import RecipeError
from resilient_train.job.config import JobConfig
from resilient_train.runner.keras_recipes.fitscript import (
    ArrayInput,
    ContinuousInput,
    FitScript,
    _worker_slices,
    array_steps,
    validation_split_at,
)


def global_batches(count=6, batch=4):
    """Global batch g holds rows 10*g .. 10*g+batch-1: (features, labels)."""
    rows = np.concatenate([np.arange(batch) + 10 * g for g in range(count)]).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((rows, -rows)).batch(batch)


def test_each_input_pipeline_gets_its_slice_of_every_global_batch():
    for index, expected in ((0, [[0, 1], [10, 11]]), (1, [[2, 3], [12, 13]])):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=2)
        batches = list(_worker_slices(global_batches(), 4, context).take(2))
        assert [features.numpy().tolist() for features, _ in batches] == expected
        assert [labels.numpy().tolist() for _, labels in batches] == [[-v for v in row] for row in expected]


def test_two_replicas_on_one_worker_get_consecutive_halves_of_its_slice():
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)
    batches = [f.numpy().tolist() for f, _ in _worker_slices(global_batches(), 4, context).take(3)]
    assert batches == [[0, 1], [2, 3], [10, 11]]


class OneWorker:
    """What ContinuousInput asks of a strategy: distribute_datasets_from_function (one pipeline)."""

    def distribute_datasets_from_function(self, dataset_fn):
        return dataset_fn(tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1))


def test_the_input_starts_at_global_batch_epoch_times_steps_plus_start_and_reads_on_across_epochs():
    source = ContinuousInput(OneWorker(), global_batches(), global_batch_size=4, steps_per_epoch=2)
    iterator = source(1, 1)  # epoch 1, step 1: global batch 3
    assert next(iterator)[0].numpy().tolist() == [30, 31, 32, 33]
    assert source(2, 0) is iterator  # the next epoch reads on from the same iterator
    assert next(iterator)[0].numpy().tolist() == [40, 41, 42, 43]
    with pytest.raises(RuntimeError, match="asked for global batch 1, the iterator is at 6"):
        source(0, 1)  # a second iterator would reshuffle: refused, never guessed


@pytest.fixture
def script(tmp_path):
    job = JobConfig(recipe=str(tmp_path / "train.py"), run_dir=str(tmp_path / "run"))
    cluster = ClusterInfo(num_workers=2, rank=0, task_type="worker", task_index=0)
    return FitScript(job, cluster, before_strategy=lambda: None, make_trainer=lambda *a: None, run_trainer=lambda t: None)


@pytest.mark.parametrize("args, kwargs, message", [
    ((np.zeros(4), np.zeros(4), 2), {}, r"fit\(\) got 3 positional arguments; pass all but x and y by name"),
    ((), {"x": np.zeros(4), "y": np.zeros(4), "steps_per_epoch": 2},
     r"fit\(steps_per_epoch=...\): not supported with arrays yet: an epoch is the arrays once over"),
    ((global_batches(),), {"steps_per_epoch": 2, "validation_split": 0.1},
     r"fit\(validation_split=...\): Keras splits arrays, not a dataset"),
    ((global_batches(),), {"steps_per_epoch": 2, "batch_size": 4}, r"fit\(batch_size=...\): batch the tf.data.Dataset"),
    ((global_batches(),), {"steps_per_epoch": 2}, r"fit\(\) was called without a tf.distribute.MultiWorkerMirroredStrategy"),
])
def test_fit_calls_refused_at_run_time_name_the_argument(script, args, kwargs, message):
    with pytest.raises(RecipeError, match=message):
        script._fit(object(), *args, **kwargs)


def test_a_second_fit_call_is_refused(script):
    script.strategy = OneWorker()
    with pytest.raises(RecipeError, match=r"fit\(steps_per_epoch=None\); expected a positive int"):
        script._fit(object(), global_batches())
    with pytest.raises(RecipeError, match=r"model.fit\(\) called a second time; one fit\(\) call is supported"):
        script._fit(object(), global_batches(), steps_per_epoch=2)


def test_a_finite_dataset_shorter_than_the_run_is_refused(script):
    script.strategy = OneWorker()
    with pytest.raises(RecipeError, match=r"the dataset has 6 batches; fit\(epochs=4, steps_per_epoch=2\) reads 8: "
                                          r"add .repeat\(\)"):
        script._fit(object(), global_batches(), epochs=4, steps_per_epoch=2)


def test_the_async_checkpoints_twin_of_a_script_model_has_its_own_variables():
    """The first build_model call is the live model; later ones (the async checkpoint's twin,
    the export copy) are clones with their own variables: a twin that IS the live model makes
    the snapshot a no-op and the background write read variables training is updating."""
    import keras

    from resilient_train.runner.keras_recipes.fitscript import model_then_twins

    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.25, momentum=0.5), loss="mse")
    build_model = model_then_twins(model)
    assert build_model({}) is model
    twin = build_model({})
    assert twin is not model
    assert [v.shape for v in twin.weights] == [v.shape for v in model.weights]
    assert not {id(v) for v in twin.weights} & {id(v) for v in model.weights}
    assert type(twin.optimizer) is keras.optimizers.SGD and twin.optimizer is not model.optimizer
    assert (float(twin.optimizer.learning_rate), twin.optimizer.momentum) == (0.25, 0.5)
    model.weights[0].assign(model.weights[0] + 1.0)  # training the live model...
    assert not np.array_equal(twin.weights[0].numpy(), model.weights[0].numpy())  # ...leaves the twin


def test_a_script_model_keras_cannot_clone_is_refused_naming_the_sync_mode():
    import keras

    from resilient_train.runner.keras_recipes.fitscript import model_then_twins

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, inputs):
            return self.dense(inputs)

    model = Subclassed()
    model(np.zeros((1, 3), np.float32))
    model.compile(optimizer="sgd", loss="mse")
    build_model = model_then_twins(model)
    assert build_model({}) is model
    with pytest.raises(RecipeError, match=r"the fit\(\) model cannot be copied for the asynchronous checkpoint .*; "
                                          r"pass --checkpoint-mode sync$"):
        build_model({})


def test_a_callback_refused_at_run_time_names_the_script_and_its_fit_line(script):
    """A callback the source check cannot see (built by a helper, not named literally) is
    refused in the script's terms: its file, the line of its fit() call, fit's callbacks index."""
    import keras

    script.strategy = OneWorker()
    source = "\n\ncallbacks = [keras.callbacks.History(), make()]\nmodel.fit(dataset, steps_per_epoch=2, callbacks=callbacks)\n"
    code = compile(source, str(script.path), "exec")  # frames of this code are the script's own
    model = type("Model", (), {"fit": lambda self, *a, **k: script._fit(self, *a, **k)})()
    namespace = {"keras": keras, "make": keras.callbacks.ProgbarLogger, "model": model, "dataset": global_batches()}
    with pytest.raises(RecipeError) as caught:
        exec(code, namespace)
    assert str(caught.value) == (f"Script {script.path}: the fit() call at line 4: callbacks[1] ProgbarLogger: "
                                 "not supported yet: the runner reports progress as events (remove it)")


@pytest.mark.parametrize("examples, fraction, expected", [(1797, 0.2, 1437), (10, 0.25, 7), (100, 0.1, 90), (3, 0.5, 1)])
def test_validation_split_trains_on_the_first_floor_n_times_one_minus_f_as_keras(examples, fraction, expected):
    from keras.src.trainers.data_adapters.array_slicing import train_validation_split

    assert validation_split_at(examples, fraction) == expected
    train, held = train_validation_split((np.arange(examples),), validation_split=fraction)
    assert (len(train[0]), held[0].tolist()) == (expected, list(range(expected, examples)))  # Keras' own split


@pytest.mark.parametrize("examples, fraction", [(1, 0.5), (3, 0.9), (10, 1.0), (10, 0.0)])
def test_a_validation_split_that_leaves_nothing_on_one_side_is_refused(examples, fraction):
    with pytest.raises(ValueError, match=rf"Received validation_split={fraction}"):
        validation_split_at(examples, fraction)


def test_an_epoch_of_arrays_is_its_full_global_batches():
    assert [array_steps(n, 64) for n in (64, 127, 128, 1500)] == [1, 1, 2, 23]
    with pytest.raises(ValueError, match="Received 63 examples for batch_size=64; expected at least one batch"):
        array_steps(63, 64)


def _array_batches(shuffle, epoch, start, examples=37, batch=8, steps=4):
    x = np.arange(examples, dtype=np.float32) * 10.0
    source = ArrayInput(OneWorker(), ({"pixels": x}, np.arange(examples)), seed=3, shuffle=shuffle,
                        global_batch_size=batch, steps_per_epoch=steps)
    return [(features["pixels"].numpy().tolist(), labels.numpy().tolist()) for features, labels in source(epoch, start)]


def test_arrays_each_epoch_a_permutation_of_seed_and_epoch_cut_into_full_batches():
    for epoch in (0, 2):
        batches = _array_batches(True, epoch, 0)
        order = [int(tf.random.experimental.index_shuffle(tf.constant(k, tf.int64), tf.constant([3, epoch], tf.int64),
                                                          tf.constant(36, tf.int64))) for k in range(32)]
        assert [labels for _, labels in batches] == [order[i:i + 8] for i in range(0, 32, 8)]  # 5 of 37 left out
        assert [features for features, _ in batches] == [[10.0 * i for i in order[i:i + 8]] for i in range(0, 32, 8)]
    assert _array_batches(True, 0, 0) != _array_batches(True, 1, 0)  # a new permutation every epoch


def test_arrays_reentry_starts_the_epoch_at_the_step_and_shuffle_false_keeps_their_order():
    assert _array_batches(True, 1, 3) == _array_batches(True, 1, 0)[3:]
    assert [labels for _, labels in _array_batches(False, 1, 1)] == [list(range(8, 16)), list(range(16, 24)),
                                                                     list(range(24, 32))]


def _eval_rows(eval_dataset, rank):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=rank, num_replicas_in_sync=2)
    return [labels.numpy().tolist() for _, labels in eval_dataset(context, 0)]


def test_validation_arrays_are_batched_at_the_validation_batch_each_worker_its_share_the_last_batch_kept(script):
    x_val, y_val = np.zeros((10, 2), np.float32), np.arange(10)
    eval_dataset = script._validation((x_val, y_val), {"validation_batch_size": 4}, 8)
    assert [_eval_rows(eval_dataset, rank) for rank in (0, 1)] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], []]]
    dataset = script._validation(global_batches(count=2), {}, 8)  # a finite dataset: its own global batches
    assert _eval_rows(dataset, 1) == [[-2, -3], [-12, -13]]


@pytest.mark.parametrize("data, kwargs, message", [
    ((np.zeros(4), np.zeros(4), np.ones(4)), {}, r"expected \(x_val, y_val\) or a tf.data.Dataset"),
    ((np.zeros(4), np.zeros(3)), {}, r"the arrays have different numbers of examples \(\[3, 4\]\)"),
    (global_batches().repeat(), {}, r"a repeated dataset without validation_steps=N"),
])
def test_validation_data_the_runner_cannot_evaluate_is_refused(script, data, kwargs, message):
    with pytest.raises(RecipeError, match=message):
        script._validation(data, kwargs, 4)


def test_class_weight_is_kerass_own_mapping_and_sample_weight_one_per_example():
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

    from resilient_train.runner.keras_recipes.fitscript import sample_weights

    labels = np.array([0, 2, 1, 2, 0], np.int64)
    weights = sample_weights(labels, None, {0: 2.0, 2: 0.5}, 5)
    assert weights.dtype == np.float32 and weights.tolist() == [2.0, 0.5, 1.0, 0.5, 2.0]
    assert weights.tolist() == class_weight_to_sample_weights(labels, {0: 2.0, 2: 0.5}).tolist()
    one_hot = np.eye(3, dtype=np.float32)[labels]  # the class is the argmax
    assert sample_weights(one_hot, None, {2: 3.0}, 5).tolist() == [1.0, 3.0, 1.0, 3.0, 1.0]
    assert sample_weights(labels, np.ones((5, 1)), None, 5).shape == (5,)
    assert sample_weights(labels, None, None, 5) is None
    with pytest.raises(ValueError, match=r"sample_weight has shape \(4,\) for 5 training examples"):
        sample_weights(labels, np.ones(4), None, 5)
    with pytest.raises(ValueError, match=r"class_weight is only supported for a single output's labels"):
        sample_weights({"a": labels, "b": labels}, None, {0: 2.0}, 5)


def test_weights_for_a_model_with_several_outputs_are_refused_at_run_time(script):
    import keras

    inputs = keras.Input((3,))
    model = keras.Model(inputs, [keras.layers.Dense(1)(inputs), keras.layers.Dense(1)(inputs)])
    with pytest.raises(RecipeError, match=r"fit\(sample_weight=...\) for a model with 2 outputs: not supported yet with "
                                          r"several outputs: Keras weighs each <output>_loss by it"):
        script._fit(model, np.zeros((4, 3)), [np.zeros(4), np.zeros(4)], sample_weight=np.ones(4))
    script._fit_calls = 0  # a refused call, not a second fit()
    with pytest.raises(RecipeError, match=r"fit\(sample_weight=..., class_weight=...\): Keras refuses both at once"):
        script._fit(model, np.zeros((4, 3)), np.zeros(4), sample_weight=np.ones(4), class_weight={0: 1.0})
