"""The worker's input: per-epoch pipelines, mid-epoch re-entry, iterator state, batches, checks.

``data`` builds epoch e's pipeline from (seed, e, shard) and positions it; ``indexed`` is the
``example(index)`` contract; ``iterator_state`` says how a resumed worker gets back to its place;
``reentry`` holds the epoch's iterator over its life (entered, recorded by saves, retired or kept);
``batches`` checks what a step takes from a batch; ``determinism`` seeds per-epoch RNGs and checks
the input at epoch boundaries; ``check_input`` is ``resilient-train check``; ``teardown`` retires
finished epochs' iterators off the training thread.
"""
