from tests.integration.conftest import digits_reference  # noqa: F401  (session fixture: the local run's digest)
from tests.launchers.raycluster import ray_cluster  # noqa: F401
