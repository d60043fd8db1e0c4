"""``fastps.ray``: fastps jobs on a Ray cluster, with Horovod's ``horovod.ray`` API.

    import ray
    from fastps.ray import RayExecutor

    ray.init()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=4)
    executor.start()
    results = executor.run(train_fn)  # train_fn calls fastps.torch's hvd.init()
    executor.shutdown()

With ``min_workers`` (``RayExecutor(settings, min_workers=2, max_workers=4)``) it is the
elastic form: ``run(fn)`` with ``fn`` using ``hvd.elastic.run`` goes on when a worker actor
dies (``fastps.launch.ray.elastic``).

The code lives in ``fastps.launch.ray``; docs/guide/ray.md has the whole story (Ray Train's
``TorchTrainer`` with the ``fastps`` backend).
"""

from __future__ import annotations

from fastps.launch.ray.actors import WorkerActor
from fastps.launch.ray.executor import RayExecutor
from fastps.launch.ray.settings import RaySettings, create_settings

BaseHorovodWorker = WorkerActor  # Horovod's name for the worker actor's class

__all__ = [
    "BaseHorovodWorker",
    "RayExecutor",
    "RaySettings",
    "WorkerActor",
    "create_settings",
]
