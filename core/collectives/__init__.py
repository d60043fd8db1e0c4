"""The collective layer: Horovod's operations (allreduce, allgather, broadcast, alltoall,
reducescatter, barrier, join) over the workers' data plane, for every plugin alike.

``ops`` holds the operations, process sets and the checks that make every rank agree before
bytes move; ``adasum`` the Adasum reduction, ``anon_names`` the numbering of unnamed ops,
``sfb`` sufficient-factor broadcasting, ``capabilities`` what this build supports,
``basics`` what every plugin's session shares (init, rank, size, the cross-barrier and SFB
decisions).

``from fastps import collectives`` as before: attributes are those of ``ops``.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    # Read live from ops on every access (its module state included), never copied.
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("fastps.collectives.ops"), name)
