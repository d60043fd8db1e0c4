"""``horovod.ray.worker`` -> fastps's worker actor class."""

from fastps.ray import BaseHorovodWorker

__all__ = ["BaseHorovodWorker"]
