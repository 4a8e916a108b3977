"""What a worker saves and when: the checkpoint's object graph, i.e. its file format (``ckpt_layout``),
the async/sync checkpointers (``checkpointing``), the model's named state (``model_state``: weights
digest, global RNG guard), the save schedule (``save_policy``), one worker's save and restore as the
Trainer holds them (``saving``), and the memory tier: every worker's
newest in-memory snapshot (``memory_tier``; ``tier``: one worker's tier as the Trainer holds it)
and the check that the workers' snapshots agree before a non-chief rescues the run from its own
(``worker_agreement``).
"""
