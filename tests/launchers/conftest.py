from tests.launchers.raycluster import ray_cluster  # noqa: F401
