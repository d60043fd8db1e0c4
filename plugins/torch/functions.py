"""Whole-model helpers: broadcasting parameters, optimizer state and Python objects.

Before touching data, the helpers that take a set of named tensors first compare the set
across ranks (names, shapes, dtypes, through one small allgather): a model that differs
between ranks raises a :class:`fastps.FastPSError` naming the tensor on every rank, instead
of leaving each rank waiting for tensors the others never send.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import fastps
import torch
from fastps.collectives import ops as C
from fastps.errors import FastPSError
from fastps.torch.ops import broadcast_async_, core_dtype

__all__ = [
    "broadcast_object",
    "allgather_object",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "check_same_tensors",
]

Signature = Tuple[str, Tuple[int, ...], str]

_calls = itertools.count()  # numbers the collective calls of this module (same on all ranks)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank (pickled; the root gets ``obj`` back)."""
    return C.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Returns the list of every rank's ``obj``, in rank order (each unpickled)."""
    return C.allgather_object(obj, name, process_set)


def check_same_tensors(
    named: Sequence[Tuple[str, torch.Tensor]], what: str, process_set: Any = None
) -> None:
    """Raises on every rank if the ranks' named tensors differ (by name, shape or dtype)."""
    C.check_same_everywhere(
        [(n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in named],
        what,
        process_set,
    )


ParamsArg = Union[
    Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]], Iterable[torch.Tensor]
]


def _named_tensors(params: ParamsArg) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: kv[0])
    else:
        items = []
        for i, item in enumerate(params):
            if isinstance(item, torch.Tensor):
                items.append((f"param.{i}", item))
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                items.append((str(item[0]), item[1]))
            else:
                raise ValueError(
                    "params must be a state_dict, a list of (name, tensor) pairs such as "
                    f"model.named_parameters(), or a list of tensors; got item {item!r}"
                )
    seen = set()
    for n, t in items:
        if not isinstance(t, torch.Tensor):
            raise FastPSError(
                f"broadcast_parameters: '{n}' is a {type(t).__name__}, not a tensor; "
                "use broadcast_object for other values"
            )
        if n in seen:
            raise ValueError(f"broadcast_parameters: the name '{n}' appears twice")
        seen.add(n)
    return items


def broadcast_parameters(params: ParamsArg, root_rank: int, process_set: Any = None) -> None:
    """Overwrites every rank's tensors with ``root_rank``'s, in place.

    ``params``: ``model.state_dict()``, ``model.named_parameters()`` or a list of such
    (name, tensor) pairs. All broadcasts run concurrently; the call returns when all are
    done.
    """
    items = _named_tensors(params)
    check_same_tensors(items, "broadcast_parameters", process_set)
    for n, t in items:
        core_dtype(t, n)
    with torch.no_grad():
        handles = [
            broadcast_async_(
                t, root_rank, name=f"broadcast_parameters.{n}", process_set=process_set
            )
            for n, t in items
        ]
        for h in handles:
            h.synchronize()


class _Slot:
    """Stands for a tensor inside the pickled skeleton of an optimizer's state."""

    def __init__(self, index: int, shape: Tuple[int, ...], dtype: torch.dtype) -> None:
        self.index = index
        self.shape = shape
        self.dtype = dtype


def _strip(value: Any, tensors: List[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a _Slot; the tensors are appended to
    ``tensors``."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(_strip(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(_fill(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, process_set: Any = None
) -> None:
    """Gives every rank ``root_rank``'s optimizer state: per-parameter state (momentum
    buffers, Adam moments, ``step``) and the param groups' hyperparameters (``lr``,
    ``momentum``, ...). Works when the other ranks have no state yet, e.g. when only the
    root loaded a checkpoint.

    The state's structure and its non-tensor values travel as one pickled object; the
    tensors then travel as tensors (one broadcast each, all concurrently), and every
    non-root rank loads the result with ``optimizer.load_state_dict``.
    """
    call = next(_calls)
    root = fastps.rank() == root_rank
    # As Horovod does: every trainable parameter gets a (zero) gradient if it has none, so
    # code that reads .grad right after this call finds a tensor.
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    tensors: List[torch.Tensor] = []
    skeleton = _strip(optimizer.state_dict(), tensors) if root else None
    skeleton = broadcast_object(
        skeleton, root_rank, name=f"broadcast_optimizer_state.{call}", process_set=process_set
    )
    if root:
        work = [t.detach().to("cpu", copy=True).contiguous() for t in tensors]
    else:
        slots: List[_Slot] = []
        _collect_slots(skeleton, slots)
        slots.sort(key=lambda s: s.index)
        work = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    for i, t in enumerate(work):
        core_dtype(t, f"optimizer state tensor {i}")
    handles = [
        broadcast_async_(
            t, root_rank, name=f"broadcast_optimizer_state.{call}.{i}", process_set=process_set
        )
        for i, t in enumerate(work)
    ]
    for h in handles:
        h.synchronize()
    if not root:
        optimizer.load_state_dict(_fill(skeleton, work))


def _collect_slots(value: Any, out: List[_Slot]) -> None:
    if isinstance(value, _Slot):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_slots(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_slots(v, out)
