"""What a run produces besides checkpoints: evaluation at epoch ends (``evaluation``), the TensorBoard
log (``tensorboard``), the exported model (``model_export``) and the chief's ``print()`` on the
console (``script_output``).
"""
