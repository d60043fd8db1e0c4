"""Elastic training: workers that leave and join a running job (docs/guide/elastic.md).

The worker side, framework-neutral: the state base classes (``state``), the run loop
(``run``), the worker's rendezvous client (``rendezvous``), host-change notifications
(``notifications``), in-place replacement of a lost peer (``inplace``) and the plugins'
binding (``binding``). fastpsrun's elastic driver and host discovery are launcher code
(``fastps.launch.elastic_driver``, ``fastps.launch.discovery``); the workers' rerouting over
elastic servers is ``fastps.worker.rerouting``. Names are loaded on first use, so importing
this package starts nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "HorovodInternalError": "..errors",
    "HostsUpdatedInterrupt": "..errors",
    "HostUpdateResult": ".notifications",
    "ObjectState": ".state",
    "State": ".state",
    "run_fn": ".run",
    "enabled": "..control.elastic_wire",
    "WorkerLostError": "..errors",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'fastps.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
