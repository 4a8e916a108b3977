"""What a worker saves and when: the async/sync checkpointers (``checkpointing``), the model's named
state (``model_state``: weights digest, RNG state), and the save schedule (``save_policy``).
"""
