from tests.support.raycluster import one_cpu_ray_cluster, ray_cluster  # noqa: F401
