"""Numerical health (issue 48): failures that kill no process but ruin the run.

A batch that makes the loss or the gradients non-finite makes every later step non-finite,
and without this package the runner would go on committing that state until retention rotated
the last healthy checkpoint out. What it owns:

* ``detector``: the in-graph test of one step (one ``is_finite`` on the loss, one on the
  global gradient norm), whose 0/1 rides the packed all-reduce's ``__nonfinite__`` column
  (runner/training/control_row.py): every worker learns it at the same step, with no collective of its
  own; and the host's reading of a call's rows (the first step that had it).
* ``anomaly_policy``: what the run does about it (``--on-anomaly``: rollback and the replay's
  verdict, stop, ignore) and the commit's finiteness check.
* ``injection``: a NaN loss at a chosen global step (``RT_FAULTS`` point ``nan_loss``), for the
  chaos catalogue and for users' own recipes.

The guard before a commit (a twin holding a non-finite tensor is never committed) is called
by the commit path: runner/state/checkpointing.py ``persist_twin``.
"""
