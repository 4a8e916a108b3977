from tests.support.raycluster import ray_cluster  # noqa: F401
