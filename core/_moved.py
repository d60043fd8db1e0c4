"""Old module paths of the flat layout (``fastps.api``, ``fastps.launcher``, ...) keep
working: importing one gives the very module that now lives in a subpackage (the same
object, so its state and any patch of it are shared), for user code written against the
old names. New code imports the new paths; tests/unit/test_layout.py checks that nothing
in this repository uses the old ones."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

# old name -> new name (relative to fastps)
MOVED = {
    "api": "worker.api",
    "buffers": "worker.buffers",
    "compression": "worker.compression",
    "async_mode": "worker.async_mode",
    "catch_up": "worker.catch_up",
    "fusion_plan": "worker.fusion_plan",
    "topology": "worker.topology",
    "stall": "worker.stall",
    "elastic.rerouting_worker": "worker.rerouting",
    "adasum": "collectives.adasum",
    "anon_names": "collectives.anon_names",
    "sfb": "collectives.sfb",
    "capabilities": "collectives.capabilities",
    "coordinator": "control.coordinator",
    "placement": "control.placement",
    "linkspeed": "control.linkspeed",
    "netif": "control.netif",
    "elastic.server_pool": "control.server_pool",
    "elastic.wire": "control.elastic_wire",
    "elastic.errors": "errors",
    "cluster_cli": "launch.cluster_cli",
    "cluster_launcher": "launch.cluster",
    "hosts": "launch.hosts",
    "remote": "launch.remote",
    "remote_agent": "launch.remote_agent",
    "slurm": "launch.slurm",
    "progress": "launch.progress",
    "elastic.driver": "launch.elastic_driver",
    "elastic.cli": "launch.elastic_cli",
    "elastic.discovery": "launch.discovery",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: Optional[importlib.machinery.ModuleSpec] = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The target ran when it was imported; the import system set the old name's spec
        # on it, so give it back its own.
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith("fastps."):
            return None
        new = MOVED.get(fullname[len("fastps.") :])
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias("fastps." + new))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
