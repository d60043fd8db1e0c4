"""``horovod.ray`` -> ``fastps.ray`` (Horovod's ``test/single/test_ray.py`` imports it)."""

from types import SimpleNamespace
from typing import Any

from fastps.ray import BaseHorovodWorker
from fastps.ray import RayExecutor as _FastPSRayExecutor

__all__ = ["BaseHorovodWorker", "RayExecutor"]


class RayExecutor(_FastPSRayExecutor):
    """fastps's executor under Horovod's name, plus the one attribute of Horovod's internals
    that Horovod's test reads (``test_horovod_train_in_pg``):
    ``adapter.strategy._created_placement_group``, whether ``start()`` reserved a placement
    group of its own. It is answered from fastps's public ``created_placement_group``."""

    @property
    def adapter(self) -> Any:
        strategy = SimpleNamespace(_created_placement_group=self.created_placement_group)
        return SimpleNamespace(strategy=strategy)
