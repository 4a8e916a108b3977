"""resilient-train: fault-tolerant TensorFlow training under MultiWorkerMirroredStrategy.

The command line (``resilient-train``, resilient_train/cli.py) is the main interface. The
names below are the small public API for code that drives a run or reads its checkpoints;
importing this package does not import TensorFlow.
"""

from resilient_train.checkpoint import CheckpointStore, Manifest
from resilient_train.job.config import JobConfig
from resilient_train.errors import ConfigError, RecipeError, StorageError

__all__ = ["CheckpointStore", "ConfigError", "JobConfig", "Manifest", "RecipeError", "StorageError"]
__version__ = "0.1.0"
