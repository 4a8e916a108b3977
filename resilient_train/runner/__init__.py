"""Worker side: one training process of the group (``python -m resilient_train.runner``).

Independent of how it was launched: the local supervisor starts it, but so can Kubernetes,
Slurm or Ray, as long as TF_CONFIG is set and the job's flags (or job file) are passed.

Only the entry point (``__main__``) sits at the top; everything else is grouped below::

    process/        the process around the training: worker main (argv/job file, TF_CONFIG,
                    exit code), the start-up and exit every worker shares, warm standbys and
                    their template, preemption notices, start-up phases, the parameter-server
                    tier's processes
    training/       the custom training loop under MultiWorkerMirroredStrategy: the loop, the
                    train call, the strategy, call sizing, the packed row's control columns
    input/          per-epoch pipelines, re-entry, iterator state, batches, checks
    state/          what a worker saves and when: the checkpoint's object graph (its format),
                    checkpointers, the model's named state, the save schedule, the memory tier
    keras_recipes/  compiled models, unchanged fit scripts, callbacks
    outputs/        evaluation, TensorBoard, export, the chief's print()
    failures/       recipe errors explained, injected faults
"""
