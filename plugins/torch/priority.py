"""Learning the order in which the forward pass uses the parameters (P3 priorities).

P3 (SysML'19, §3) sends the gradients of the layers that the *next* forward pass needs
first ahead of the others: the first layer of the forward pass gets the highest priority.
The order in which modules are registered often differs from the order in which they run
(a head defined before the trunk, shared blocks, custom ``forward`` code), so the order is
observed instead: a process-wide module forward pre-hook records, during the first
iteration, when each parameter's module starts its forward pass. Parameters that no module
forward announces (used functionally, or never used) keep a fallback rank after all
observed ones, in registration order.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch

__all__ = ["ForwardOrder"]


class ForwardOrder:
    """Records the first forward use of each of a set of parameters."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self._wanted = {id(p) for p in params}
        self._position: Dict[int, int] = {}
        # Modules whose forward announced a watched parameter (cross-barrier hooks them).
        self._owners: weakref.WeakValueDictionary[int, torch.nn.Module] = (
            weakref.WeakValueDictionary()
        )
        ref = weakref.ref(self)

        def pre_hook(module: torch.nn.Module, args: Any) -> None:
            me = ref()
            if me is not None:
                me._saw(module)

        self._handle: Optional[Any] = torch.nn.modules.module.register_module_forward_pre_hook(
            pre_hook
        )
        # A recorder dropped while still learning removes its global hook.
        self._finalizer = weakref.finalize(self, self._handle.remove)

    def _saw(self, module: torch.nn.Module) -> None:
        for p in module._parameters.values():
            if p is None:
                continue
            key = id(p)
            if key in self._wanted:
                self._owners[id(module)] = module
                if key not in self._position:
                    self._position[key] = len(self._position)

    def add(self, params: Iterable[torch.Tensor]) -> None:
        """Also watch ``params`` (a param group added later)."""
        self._wanted.update(id(p) for p in params)

    @property
    def learning(self) -> bool:
        return self._handle is not None

    @property
    def seen(self) -> int:
        """How many parameters have been seen so far."""
        return len(self._position)

    def stop(self) -> None:
        """Freezes the order learned so far and removes the hook."""
        if self._handle is not None:
            self._finalizer()
            self._handle = None

    def position(self, param: torch.Tensor) -> Optional[int]:
        """0 for the first parameter the forward pass used, 1 for the next, ...; None if
        the parameter has not been seen."""
        return self._position.get(id(param))

    def positions(self) -> Mapping[int, int]:
        """id(parameter) -> ``position``, for every parameter seen (read-only)."""
        return self._position

    def owners(self) -> List[torch.nn.Module]:
        """The live modules whose forward pass announced a watched parameter."""
        return list(self._owners.values())

    def ranked(self, params: List[torch.Tensor]) -> List[torch.Tensor]:
        """``params`` sorted first-used first; unseen ones last, in their given order."""
        seen = [p for p in params if id(p) in self._position]
        seen.sort(key=lambda p: self._position[id(p)])
        return seen + [p for p in params if id(p) not in self._position]
