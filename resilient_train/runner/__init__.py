"""Worker side: one training process of the group (``python -m resilient_train.runner``).

Independent of how it was launched: the local supervisor starts it, but so can Kubernetes,
Slurm or Ray, as long as TF_CONFIG is set and the job's flags (or job file) are passed.
"""
