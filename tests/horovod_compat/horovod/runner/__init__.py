"""``horovod.runner``: ``run`` is fastps.run; ``_HorovodArgs`` the argument holder Horovod's
interactive-run test fills for ``launch._run`` (the pieces Horovod's test files import)."""

from typing import Any

from fastps import run  # noqa: F401


class _HorovodArgs:
    """horovodrun's arguments, every one unset until a test sets it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None
