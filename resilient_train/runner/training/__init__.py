"""The training side of a worker: the custom training loop under MultiWorkerMirroredStrategy.

Everything that runs between the restore and the final save, grouped so that a new per-step
signal or a new kind of call is found here and nowhere else::

    loop          the Trainer: build, restore, train epoch by epoch, save (the worker's run)
    train_call    the compiled training call: N steps per call, one packed all-reduce per step
    epoch_end     the epoch's running sums of loss and metrics, and what its end does
    progress      first_step once per attempt, then train_progress every few seconds
    strategy      the strategy, with heartbeat, registration and collective timeouts
    call_size     how many steps the next call runs (``--steps-per-execution``, auto: by time)
    control_row   the packed all-reduce's control columns (stop and save votes, the chief's
                  proposals): one table, the single definition of the row's layout

Save and restore live beside it in ``runner/state/`` (what a worker saves, and when).
"""
