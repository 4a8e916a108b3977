"""The plain ParameterServerStrategy loop of the migration guide, for benchmarks/ps_throughput.py.

``python benchmarks/_plain_ps.py ROLE INDEX CLUSTER_JSON STEPS EVERY``: a ps or worker serves
(``tf.distribute.Server(...).join()``); the chief trains the linear regression of
recipes/linear_regression.py (Dense(1), Adagrad(0.05), batch 4) with one closure per step
and ``join()`` every EVERY steps, no checkpoints, and prints ``{"steps_per_s": ...}``
measured from the first join to the last.
"""

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf


def main() -> None:
    """Serve (ps, worker) or train and print the rate (chief); see the module docstring."""
    role, index, cluster, steps, every = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    spec = tf.train.ClusterSpec(cluster)
    if role != "chief":
        tf.distribute.Server(spec, job_name=role, task_index=index, protocol="grpc").join()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adagrad(0.05)
        optimizer.build(model.trainable_variables)
    features = np.tile(np.asarray([[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]], np.float32), (8, 1))
    labels = np.tile(np.asarray([[0.3], [0.5], [0.7]], np.float32), (8, 1))

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(24).repeat().batch(4, drop_remainder=True)

    iterator = iter(coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(y - model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    started = None
    for i in range(1, steps + 1):
        coordinator.schedule(step, args=(iterator,))
        if i % every == 0:
            coordinator.join()
            if started is None:
                started, first = time.perf_counter(), i
    print(json.dumps({"steps_per_s": (steps - first) / (time.perf_counter() - started)}), flush=True)


if __name__ == "__main__":
    main()
