"""Elastic training: workers that leave and join a running job (docs/elastic.md).

Framework-neutral parts: the state base classes (``state``), the run loop (``run``), the
worker's rendezvous client (``rendezvous``) and fastpsrun's elastic driver (``driver``).
Names are loaded on first use: ``fastps.api`` imports ``rendezvous`` while ``fastps.
collectives`` (which ``state`` and ``run`` need) imports ``fastps.api``.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "HorovodInternalError": "..collectives",
    "HostsUpdatedInterrupt": "..collectives",
    "HostUpdateResult": ".notifications",
    "ObjectState": ".state",
    "State": ".state",
    "run_fn": ".run",
    "enabled": ".wire",
    "WorkerLostError": ".errors",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'fastps.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
