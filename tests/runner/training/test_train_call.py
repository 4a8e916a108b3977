"""The training call (runner/training/train_call.py) on its own, under a one-replica
MirroredStrategy: what a call of N steps returns is what N calls of one step return (weights
bit for bit, the epoch's sums, the counters), the votes come back agreed, the agreed size of
the next call is adopted, and step faults fire at a call's end in step order."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from resilient_train.job.recipe import Recipe
from resilient_train.runner.health.anomaly_policy import HealthGuard
from resilient_train.runner.health.injection import BitFlip, NanInjection
from resilient_train.rundir.stepmarker import StepMarker
from resilient_train.runner.state import ckpt_layout
from resilient_train.runner.training.epoch_end import EpochStats
from resilient_train.runner.training.train_call import CallOutcome, TrainCall, hit_step_faults

_BATCH = 4
_STEPS = 6


def _recipe() -> Recipe:
    return Recipe(
        name="tiny", source="tiny.py",
        build_model=lambda params: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
        build_optimizer=lambda params: keras.optimizers.SGD(0.1),
        loss=lambda labels, predictions: tf.reduce_mean(tf.square(labels - predictions), axis=-1),
        dataset=None,
        metrics=lambda labels, predictions: {"mae": tf.reduce_mean(tf.abs(labels - predictions), axis=-1)},
    )


def _dataset(strategy: tf.distribute.Strategy) -> tf.distribute.DistributedDataset:
    rng = np.random.default_rng(7)
    features = rng.normal(size=(_BATCH * _STEPS, 3)).astype(np.float32)
    labels = rng.normal(size=(_BATCH * _STEPS, 1)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(_BATCH)
    return strategy.experimental_distribute_dataset(data)


def _train(steps_per_call: int, *, stop: float = 0.0, save: float = 0.0) -> tuple[list[np.ndarray], EpochStats,
                                                                                    tuple[int, int], TrainCall,
                                                                                    list[CallOutcome]]:
    """``_STEPS`` steps in calls of ``steps_per_call``, from the same seeded start every time."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    recipe = _recipe()
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = recipe.build_model({})
        optimizer = recipe.build_optimizer({})
        optimizer.build(model.trainable_variables)
        counters = ckpt_layout.new_counters()
    global_step, step_in_epoch = counters["global_step"], counters["step_in_epoch"]
    call = TrainCall(strategy=strategy, model=model, optimizer=optimizer, recipe=recipe, own_step=None,
                     counters=(global_step, step_in_epoch), global_batch_size=_BATCH,
                     steps_per_execution=steps_per_call, tier=None, is_chief=True, stop_vote=lambda ends: stop,
                     save_vote=lambda: save, save_at=lambda step: False, indices=None,
                     health=HealthGuard("rollback", emit=lambda *a, **k: None), settle=lambda: None,
                     position=lambda steps: (0, 0), nan_injection=NanInjection(()), bitflip=BitFlip(()),
                     marker=StepMarker(None), replica_check_every=2, rank=0, sum_over_workers=lambda t: t)
    stats = EpochStats()
    iterator = iter(_dataset(strategy))
    outcomes = []
    done = 0
    while done < _STEPS:
        outcomes.append(call.run(iterator, steps_per_call, done, stats))
        done += steps_per_call
    return ([v.numpy() for v in model.weights], stats, (int(global_step.numpy()), int(step_in_epoch.numpy())), call,
            outcomes)


def test_a_call_of_n_steps_trains_and_sums_as_n_calls_of_one():
    weights_1, stats_1, counters_1, _, _ = _train(1)
    weights_3, stats_3, counters_3, call, outcomes = _train(3)
    assert counters_1 == counters_3 == (_STEPS, _STEPS)
    assert all(np.array_equal(a, b) for a, b in zip(weights_1, weights_3, strict=True))
    assert stats_1.batches == stats_3.batches == _STEPS
    assert stats_1.sums == stats_3.sums  # exact: the host adds each step's row, whatever the call size
    assert set(stats_3.sums) == {"loss", "mae"}
    # One variant: the first call traced it; the second (checked for replicas that differ: it
    # ends at a multiple of --replica-check-every) did not trace again (issue 45: two variants
    # stalled every attempt twice).
    assert outcomes == [CallOutcome(stop=False, save=False, traced=True), CallOutcome(stop=False, save=False)]
    assert call.replicas is not None and call.replicas.checked_at == _STEPS
    assert call.trained
    assert call.steps == 3  # a fixed size: the chief proposes it, every worker adopts it from the row


def test_the_votes_come_back_agreed():
    _, _, _, call, outcomes = _train(2, stop=1.0, save=1.0)
    assert outcomes == [CallOutcome(stop=True, save=True, traced=True)] + [CallOutcome(stop=True, save=True)] * 2


class _Recorder:
    def __init__(self) -> None:
        self.hits: list[tuple[str, int]] = []

    def hit(self, point: str, global_step: int) -> None:
        self.hits.append((point, global_step))


def test_step_faults_fire_in_step_order_at_the_call_end():
    recorder = _Recorder()
    hit_step_faults(recorder, 5, 7)  # a FaultPlan's hit, recorded
    assert recorder.hits == [("raise", 5), ("after_step", 5), ("raise", 6), ("after_step", 6),
                             ("raise", 7), ("after_step", 7)]
