"""What a worker saves and when: the checkpoint's object graph, i.e. its file format (``ckpt_layout``),
the async/sync checkpointers (``checkpointing``), the model's named state (``model_state``: weights
digest, global RNG guard), and the save schedule (``save_policy``).
"""
