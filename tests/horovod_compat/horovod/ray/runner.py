"""``horovod.ray.runner``: ``RayExecutor`` is fastps's (through ``horovod.ray``, the shim).
``Coordinator`` and ``MiniSettings`` are Horovod internals (its rank bookkeeping) that
fastps has no counterpart of: the names exist so the test file imports, and using them
fails with this module's message."""

from typing import Any, NoReturn

from horovod.ray import RayExecutor

__all__ = ["Coordinator", "MiniSettings", "RayExecutor"]


def _internal(name: str) -> NoReturn:
    raise NotImplementedError(
        f"horovod.ray.runner.{name} is Horovod's internal class; fastps.ray has no "
        "counterpart (the executor numbers ranks itself)"
    )


class MiniSettings:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _internal("MiniSettings")


class Coordinator:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _internal("Coordinator")
