"""``horovod.ray`` -> ``fastps.ray`` (Horovod's ``test/single/test_ray.py`` imports it)."""

from fastps.ray import BaseHorovodWorker, RayExecutor

__all__ = ["BaseHorovodWorker", "RayExecutor"]
