"""Asynchronous training for torch (docs/guide/async.md): ``DistributedOptimizer(opt, async=True)``.

The servers keep the parameters (``fastps.async_mode``). At construction every worker's
parameters become rank 0's, which the servers keep. ``step()`` runs the wrapped optimizer on
this worker's own gradients (no averaging, no waiting for other workers' gradients), pushes
the change it made (the delta, as BytePS does) and receives the parameters as they now stand
on the servers, every worker's deltas included, in the same exchange. ``FASTPS_STALENESS``
bounds how far a worker may run ahead of the slowest (the servers hold its answer).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Type

import torch
from fastps.errors import FastPSError
from fastps.worker import async_mode as _async
from fastps.worker.async_mode import async_requested

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


class _Param:
    """One parameter: its name and the host memory the exchange reads and writes."""

    def __init__(self, name: str, param: torch.Tensor) -> None:
        if param.dtype not in _HOST_DTYPES:
            raise FastPSError(
                f"async parameter '{name}': dtype {param.dtype} is not supported "
                "(float32, float64, float16)"
            )
        self.name = name
        self.param = param
        on_host = param.device.type == "cpu" and param.is_contiguous()
        self.host = param.data if on_host else param.detach().to("cpu").contiguous()
        self.staged = not on_host
        self.before = torch.empty_like(self.host)
        self.delta = torch.empty_like(self.host)

    def load(self) -> None:
        """Copies the host copy back into a parameter that does not live in host memory."""
        if self.staged:
            with torch.no_grad():
                self.param.copy_(self.host)

    def stage(self) -> None:
        if self.staged:
            self.host.copy_(self.param.detach())


class _AsyncState:
    def __init__(self, params: List[_Param]) -> None:
        self.params = params
        # The core session whose servers hold the parameters: an elastic membership
        # change brings new servers, which start from rank 0's (restored) parameters.
        self.session: Any = None

    def named(self) -> List[Tuple[str, Any]]:
        return [(p.name, p.host.numpy()) for p in self.params]


class _AsyncMixin:
    _fastps_async: _AsyncState

    def step(self, closure: Any = None) -> Any:
        st = self._fastps_async
        if st.session is not _async.session():
            self._fastps_init()
        with torch.no_grad():
            for p in st.params:
                p.stage()
                p.before.copy_(p.host)
        loss = super().step(closure)  # type: ignore[misc]
        with torch.no_grad():
            for p in st.params:
                p.stage()
                torch.sub(p.host, p.before, out=p.delta)
            handles = _async.update_async(
                [(p.name, p.delta.numpy(), p.host.numpy()) for p in st.params]
            )
            for h in handles:
                h.synchronize()
            for p in st.params:
                p.load()
        return loss

    def _fastps_init(self) -> None:
        """The servers of this session start from rank 0's parameters, every worker too."""
        st = self._fastps_async
        for p in st.params:
            p.stage()
        _async.init_params(st.named())
        for p in st.params:
            p.load()
        st.session = _async.session()

    def pull_parameters(self) -> None:
        """Loads the parameters the servers hold (e.g. before a checkpoint on any worker)."""
        st = self._fastps_async
        _async.read_params(st.named())
        for p in st.params:
            p.load()

    def push_parameters(self) -> None:
        """Rank 0's parameters replace the servers' (and every worker's): call it on every
        worker, e.g. after rank 0 loaded a checkpoint."""
        st = self._fastps_async
        for p in st.params:
            p.stage()
        _async.replace_params(st.named())
        for p in st.params:
            p.load()
        st.session = _async.session()


_AsyncMixin.step.hooked = True  # type: ignore[attr-defined]  # torch wraps the base step

__all__ = ["make_async_optimizer", "async_requested"]

_classes: Dict[type, Type[Any]] = {}
_ADOPT_SKIP = ("step", "zero_grad", "_opt_called", "_fastps_async")


def make_async_optimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
) -> Any:
    """A subclass instance of ``type(optimizer)`` sharing its state whose ``step`` trains
    asynchronously against the parameters the servers keep."""
    names: Dict[int, str] = {}
    taken: Dict[str, int] = {}
    for name, p in named_parameters or ():
        if taken.setdefault(name, id(p)) != id(p):
            raise ValueError(f"named_parameters names two parameters '{name}'")
        names[id(p)] = name
    params: List[_Param] = []
    seen = set()
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) in seen:
                continue
            seen.add(id(p))
            params.append(_Param(names.get(id(p), f"group{g}.param{i}"), p))
    base = type(optimizer)
    cls: Any = _classes.get(base)
    if cls is None:
        cls = type(f"Async{base.__name__}", (_AsyncMixin, base), {"__module__": __name__})
        _classes[base] = cls
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in _ADOPT_SKIP})
    wrapped._fastps_async = _AsyncState(params)
    wrapped.push_parameters()  # the servers start from rank 0's parameters
    return wrapped
