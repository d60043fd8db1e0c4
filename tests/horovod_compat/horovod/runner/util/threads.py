"""``in_thread``: Horovod's test helpers start background work with it."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence


def in_thread(
    target: Callable[..., Any],
    args: Sequence[Any] = (),
    name: Optional[str] = None,
    daemon: bool = True,
    silent: bool = False,
) -> threading.Thread:
    """Runs ``target(*args)`` in a started thread; ``silent`` swallows its exception."""

    def run() -> None:
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread
