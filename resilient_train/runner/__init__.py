"""Worker side: one training process of the group (``python -m resilient_train.runner``).

Independent of how it was launched: the local supervisor starts it, but so can Kubernetes,
Slurm or Ray, as long as TF_CONFIG is set and the job's flags (or job file) are passed.

The entry points and the training loop sit here; everything they use is grouped below::

    __main__, worker_main    the worker process: argv/job file, TF_CONFIG, events, exit code
    bootstrap                the start-up and exit a worker and a ps_roles process share
    warm_standby             a process with TensorFlow imported, waiting for its worker argv
    ps_roles                 the parameter-server tier's coordinator, servers and workers
    preemption_notices       this node's preemption notices, turned into the worker's stop request
    startup_phases           where a worker's start-up time goes, up to its first step
    training/                the custom training loop under MultiWorkerMirroredStrategy: the
                             Trainer, its training call, strategy, call sizing, control row
    input/                   per-epoch pipelines, re-entry, iterator state, batches, checks
    state/                   the checkpoint's object graph (its format), checkpointers, the
                             model's named state, the save schedule, the memory tier
    keras_recipes/           compiled models, unchanged fit scripts, callbacks
    outputs/                 evaluation, TensorBoard, export, the chief's print()
    failures/                recipe errors explained, injected faults
"""
