"""A pytest plugin for running Horovod's ``test/single/test_ray.py`` on today's Ray
(``-p horovod.ray._pytest_ray_compat``): its ``ray_start_4_cpus`` fixture passes
``ray.init(_redis_max_memory=...)``, a private argument Ray has since removed (Ray 2.60
raises "Unknown keyword argument(s): _redis_max_memory" before any fastps code runs). The
plugin drops that one argument; everything else reaches Ray as the test wrote it."""

from typing import Any

REMOVED_RAY_INIT_ARGS = ("_redis_max_memory",)


def pytest_configure(config: Any) -> None:
    import ray

    original = ray.init
    if getattr(original, "_fastps_compat", False):
        return

    def init(*args: Any, **kwargs: Any) -> Any:
        for name in REMOVED_RAY_INIT_ARGS:
            kwargs.pop(name, None)
        return original(*args, **kwargs)

    init._fastps_compat = True  # type: ignore[attr-defined]
    ray.init = init
