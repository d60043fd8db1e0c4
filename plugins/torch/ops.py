"""Collective operations on torch tensors, with Horovod's names and semantics.

Every collective ends up as one or more push_pulls of the core (the servers only sum):

* allreduce / push_pull: the sum, scaled by ``1/size`` for ``Average``;
* broadcast: the root contributes its tensor, every other rank zeros, so the sum is the
  root's tensor (exact: ``x + 0 == x``; boolean tensors are combined with OR);
* allgather: the first dimensions are exchanged first (an int64 vector, one slot per rank),
  then each rank writes its rows at its offset in a zero buffer of the total size and the
  buffer is summed;
* Min / Max / Product: an allgather of the tensors, reduced locally.

Asynchronous variants return a :class:`Handle`; ``synchronize(handle)`` returns the output.
In-place variants (trailing ``_``) write the result into the tensor they were given.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import fastps
import torch
from fastps.api import auto_name, submission_batch
from fastps.errors import FastPSError

from .compression import Compression
from .staging import Waitable, submit

__all__ = [
    "ReduceOp",
    "global_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Handle",
    "core_dtype",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "push_pull",
    "push_pull_",
    "push_pull_async",
    "push_pull_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "poll",
    "synchronize",
    "join",
    "barrier",
]


class ReduceOp(enum.IntEnum):
    """How an allreduce combines the workers' tensors."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM  # defined so that scripts can name it; using it raises
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

# torch dtype -> the core's dtype name. Everything else (complex, unsigned 16/32/64 bit,
# float8, quantized) is refused with an error naming the tensor.
_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.bool: "bool",
}

SUPPORTED_DTYPES: Tuple[torch.dtype, ...] = tuple(_DTYPES)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} on {t.device}"


def core_dtype(tensor: Any, name: str) -> str:
    """The core's name for ``tensor``'s dtype, or a FastPSError naming the tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise FastPSError(f"tensor '{name}': expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise FastPSError(
            f"tensor '{name}' ({_describe(tensor)}) has layout {tensor.layout}; fastps "
            "reduces dense tensors only (call .to_dense() first)"
        )
    dt = _DTYPES.get(tensor.dtype)
    if dt is None:
        names = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise FastPSError(
            f"tensor '{name}' ({_describe(tensor)}): dtype {tensor.dtype} is not supported by "
            f"fastps (supported: {names})"
        )
    return dt


def _name(name: Optional[str], prefix: str) -> str:
    if name is not None:
        if not isinstance(name, str) or not name:
            raise FastPSError(f"tensor names must be non-empty strings, got {name!r}")
        return name
    return auto_name(prefix)


def _resolve_op(op: Optional[int], average: Optional[bool]) -> ReduceOp:
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or the deprecated average argument, not both")
        return Average if average else Sum
    if op is None:
        return Average
    try:
        rop = ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}") from None
    if rop == Adasum:
        raise FastPSError(
            "op=Adasum is not supported by fastps (its servers only sum); use op=Average or "
            "op=Sum"
        )
    return rop


class _GlobalProcessSet:
    """Horovod's process set of all ranks, the only one fastps has."""

    process_set_id = 0

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def _check_process_set(process_set: Any) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise FastPSError("fastps supports only the global process set (all ranks)")


class Handle:
    """A collective in progress. ``synchronize()`` waits and returns the output tensor."""

    def __init__(
        self,
        name: str,
        parts: Sequence[Union[Waitable, Handle]],
        finish: Callable[[], Any],
    ) -> None:
        self.name = name
        self._parts: List[Union[Waitable, Handle]] = list(parts)
        self._finish: Optional[Callable[[], Any]] = finish
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def poll(self) -> bool:
        """True once the result is ready (``synchronize`` will not block)."""
        if self._finish is None:
            return True
        return all(p.poll() for p in self._parts)

    def synchronize(self, timeout: Optional[float] = None) -> Any:
        if self._error is not None:
            raise self._error
        if self._finish is not None:
            finish, self._finish = self._finish, None
            try:
                for part in self._parts:
                    part.synchronize(timeout)
                self._result = finish()
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._parts = []
        return self._result

    wait = synchronize

    def __repr__(self) -> str:
        state = "done" if self._finish is None else "running"
        return f"<fastps.torch.Handle {self.name!r} {state}>"


def poll(handle: Handle) -> bool:
    """True if the operation behind ``handle`` has finished."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Waits for ``handle`` and returns the operation's output tensor."""
    return handle.synchronize()


# --------------------------------------------------------------------------- allreduce


def _allreduce_start(
    tensor: torch.Tensor,
    inplace: bool,
    name: Optional[str],
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    compression: Any,
    priority: int,
) -> Handle:
    if op in (Min, Max, Product):
        return _reduce_by_gather(tensor, inplace, name, op, prescale_factor, postscale_factor)
    name = _name(name, "allreduce")
    dtype = core_dtype(tensor, name)
    size = fastps.size()
    base = tensor.detach()
    is_float = base.is_floating_point()
    if base.dtype == torch.bool and (op == Average or prescale_factor != 1 or
                                     postscale_factor != 1):
        raise FastPSError(
            f"tensor '{name}' is boolean: only op=Sum (logical OR) without scale factors is "
            "defined for it"
        )
    compression = compression or Compression.none
    sent, ctx = compression.compress(base)
    dtype = core_dtype(sent, name)
    private = sent is not base  # the compressor made a copy we may overwrite
    if not sent.is_contiguous():
        sent = sent.contiguous()
        private = True
    prescale_here = is_float and prescale_factor != 1.0
    if private or inplace:
        src = dst = sent
        if prescale_here:
            src.mul_(prescale_factor)
    elif prescale_here:
        src = dst = sent * prescale_factor
    else:
        src, dst = sent, torch.empty_like(sent, memory_format=torch.contiguous_format)
    if is_float:
        scale = float(postscale_factor) * (1.0 / size if op == Average else 1.0)
    else:
        scale = 1.0  # integer scaling is done below, with defined rounding
    part = submit(src, dst, dtype, name, priority, scale)

    def finish() -> torch.Tensor:
        result = dst
        if not is_float and base.dtype != torch.bool:
            if op == Average:
                result.div_(size, rounding_mode="floor")
            factor = float(prescale_factor) * float(postscale_factor)
            if factor != 1.0:
                result.copy_(result.double() * factor)
        result = compression.decompress(result, ctx)
        if inplace:
            if result.data_ptr() != base.data_ptr():
                base.copy_(result.view(base.shape))
            return tensor
        return result.view(base.shape)

    return Handle(name, [part], finish)


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
    priority: int = 0,
) -> Handle:
    """Starts averaging (``op=Average``, default) or summing ``tensor`` over all ranks into a
    new tensor. ``priority``: larger goes first among operations in flight."""
    _check_process_set(process_set)
    rop = _resolve_op(op, average)
    return _allreduce_start(tensor, False, name, rop, prescale_factor, postscale_factor,
                            compression, priority)


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
    priority: int = 0,
) -> Handle:
    """In-place :func:`allreduce_async`: the result replaces ``tensor``'s values. Do not
    touch ``tensor`` until the handle is synchronized."""
    _check_process_set(process_set)
    rop = _resolve_op(op, average)
    return _allreduce_start(tensor, True, name, rop, prescale_factor, postscale_factor,
                            compression, priority)


class _AllreduceFunction(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the same reduction of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], op: ReduceOp,
                prescale: float, postscale: float, compression: Any) -> torch.Tensor:
        ctx.args = (name, op, prescale, postscale, compression)
        return _allreduce_start(tensor, False, name, op, prescale, postscale, compression,
                                0).synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        name, op, prescale, postscale, compression = ctx.args
        grad_name = f"{name}.grad" if name else None
        out = _allreduce_start(grad.contiguous(), False, grad_name, op, prescale, postscale,
                               compression, 0).synchronize()
        return out, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    priority: int = 0,
) -> torch.Tensor:
    """Averages (default) or sums ``tensor`` over all ranks and returns a new tensor.

    Differentiable for ``op`` Average and Sum: the gradient is reduced the same way.
    """
    _check_process_set(process_set)
    rop = _resolve_op(op, average)
    if (rop in (Average, Sum) and torch.is_grad_enabled() and tensor.requires_grad):
        return _AllreduceFunction.apply(tensor, name, rop, prescale_factor, postscale_factor,
                                        compression)
    return _allreduce_start(tensor, False, name, rop, prescale_factor, postscale_factor,
                            compression, priority).synchronize()


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
    priority: int = 0,
) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set, compression, priority).synchronize()


# BytePS spells it push_pull; same operations.
push_pull = allreduce
push_pull_ = allreduce_
push_pull_async = allreduce_async
push_pull_async_ = allreduce_async_


def _group_names(name: Optional[str], count: int) -> List[Optional[str]]:
    if name is None:
        return [None] * count
    return [f"{name}.{i}" for i in range(count)]


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
) -> Handle:
    """Starts one allreduce per tensor; the handle's result is the list of outputs."""
    _check_process_set(process_set)
    rop = _resolve_op(op, average)
    with submission_batch():  # every worker queues the whole group in one step
        handles = [
            _allreduce_start(t, False, n, rop, prescale_factor, postscale_factor,
                             compression, 0)
            for t, n in zip(tensors, _group_names(name, len(tensors)))
        ]
    return _group(name or "grouped_allreduce", handles)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = None,
) -> Handle:
    _check_process_set(process_set)
    rop = _resolve_op(op, average)
    with submission_batch():  # every worker queues the whole group in one step
        handles = [
            _allreduce_start(t, True, n, rop, prescale_factor, postscale_factor,
                             compression, 0)
            for t, n in zip(tensors, _group_names(name, len(tensors)))
        ]
    return _group(name or "grouped_allreduce", handles)


def _group(name: str, handles: List[Handle]) -> Handle:
    # Handles are waitables themselves; a finished one returns its cached result.
    return Handle(name, handles, lambda: [h.synchronize() for h in handles])


def grouped_allreduce(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> List[Any]:
    return grouped_allreduce_async(tensors, *args, **kwargs).synchronize()


def grouped_allreduce_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> List[Any]:
    return grouped_allreduce_async_(tensors, *args, **kwargs).synchronize()


# --------------------------------------------------------------------------- allgather


def _exchange_counts(name: str, rows: int) -> List[int]:
    """Every rank's first dimension, in rank order (one small blocking push_pull)."""
    counts = torch.zeros(fastps.size(), dtype=torch.int64)
    counts[fastps.rank()] = rows
    submit(counts, counts, "int64", f"{name}.counts", 0, 1.0).synchronize()
    return [int(c) for c in counts.tolist()]


def _allgather_start(tensor: torch.Tensor, name: Optional[str]) -> Tuple[Handle, List[int]]:
    name = _name(name, "allgather")
    dtype = core_dtype(tensor, name)
    base = tensor.detach()
    if base.dim() == 0:
        base = base.reshape(1)
    counts = _exchange_counts(name, base.shape[0])
    rank = fastps.rank()
    total = sum(counts)
    offset = sum(counts[:rank])
    buf = torch.zeros((total, *base.shape[1:]), dtype=base.dtype, device=base.device)
    buf[offset:offset + counts[rank]].copy_(base)
    # The total is part of the name: calls with other totals are other tensors to the core.
    part = submit(buf, buf, dtype, f"{name}.rows{total}", 0, 1.0)
    return Handle(name, [part], lambda: buf), counts


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Any = None) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension (which may
    differ between ranks; the other dimensions must agree). The first dimensions are
    exchanged before this returns."""
    _check_process_set(process_set)
    return _allgather_start(tensor, name)[0]


class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: each rank's gradient is the sum over ranks of the
    gradient of its rows (the gradient of the sum of every rank's loss)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str]) -> torch.Tensor:
        handle, counts = _allgather_start(tensor, name)
        rank = fastps.rank()
        ctx.slice = (sum(counts[:rank]), counts[rank])
        ctx.shape = tensor.shape
        ctx.name = name
        return handle.synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        grad_name = f"{ctx.name}.grad" if ctx.name else None
        summed = _allreduce_start(grad.contiguous(), False, grad_name, Sum, 1.0, 1.0, None,
                                  0).synchronize()
        start, length = ctx.slice
        return summed.narrow(0, start, length).reshape(ctx.shape), None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order."""
    _check_process_set(process_set)
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _AllgatherFunction.apply(tensor, name)
    return _allgather_start(tensor, name)[0].synchronize()


def _reduce_by_gather(
    tensor: torch.Tensor,
    inplace: bool,
    name: Optional[str],
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
) -> Handle:
    """Min, Max and Product: gather every rank's tensor, reduce locally."""
    name = _name(name, "allreduce")
    core_dtype(tensor, name)
    base = tensor.detach()
    if prescale_factor != 1.0:
        base = base * prescale_factor
    gathered, _ = _allgather_start(base.reshape(1, *base.shape), f"{name}.{op.name.lower()}")

    def finish() -> torch.Tensor:
        stacked = gathered.synchronize()
        if op == Min:
            result = stacked.amin(dim=0) if stacked.dtype != torch.bool else stacked.all(dim=0)
        elif op == Max:
            result = stacked.amax(dim=0) if stacked.dtype != torch.bool else stacked.any(dim=0)
        else:
            result = stacked.prod(dim=0).to(stacked.dtype)
        if postscale_factor != 1.0:
            result = result * postscale_factor
        if inplace:
            tensor.detach().copy_(result)
            return tensor
        return result.to(tensor.dtype)

    return Handle(name, [gathered], finish)


# --------------------------------------------------------------------------- broadcast


def _check_root(root_rank: int) -> None:
    size = fastps.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise FastPSError(f"root_rank {root_rank!r} is not a rank of this job (size {size})")


def _broadcast_start(tensor: torch.Tensor, root_rank: int, name: Optional[str],
                     inplace: bool) -> Handle:
    _check_root(root_rank)
    name = _name(name, "broadcast")
    dtype = core_dtype(tensor, name)
    base = tensor.detach()
    root = fastps.rank() == root_rank
    if inplace:
        work = base if base.is_contiguous() else base.contiguous()
        if not root:
            work.zero_()
        src = dst = work
    elif root:
        src = base if base.is_contiguous() else base.contiguous()
        dst = torch.empty_like(src, memory_format=torch.contiguous_format)
    else:
        src = dst = torch.zeros_like(base, memory_format=torch.contiguous_format)
    part = submit(src, dst, dtype, name, 0, 1.0)

    def finish() -> torch.Tensor:
        if inplace:
            if dst.data_ptr() != base.data_ptr():
                base.copy_(dst)
            return tensor
        return dst

    return Handle(name, [part], finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = None) -> Handle:
    """Starts copying ``root_rank``'s ``tensor`` to every rank (into a new tensor)."""
    _check_process_set(process_set)
    return _broadcast_start(tensor, root_rank, name, False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = None) -> Handle:
    """In-place :func:`broadcast_async`: every rank's ``tensor`` receives the root's."""
    _check_process_set(process_set)
    return _broadcast_start(tensor, root_rank, name, True)


class _BroadcastFunction(torch.autograd.Function):
    """Differentiable broadcast: the root receives the sum of every rank's gradient, the
    other ranks zero."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int,
                name: Optional[str]) -> torch.Tensor:
        ctx.root_rank = root_rank
        ctx.name = name
        return _broadcast_start(tensor, root_rank, name, False).synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        grad_name = f"{ctx.name}.grad" if ctx.name else None
        summed = _allreduce_start(grad.contiguous(), False, grad_name, Sum, 1.0, 1.0, None,
                                  0).synchronize()
        if fastps.rank() != ctx.root_rank:
            summed = torch.zeros_like(summed)
        return summed, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank."""
    _check_process_set(process_set)
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _BroadcastFunction.apply(tensor, root_rank, name)
    return _broadcast_start(tensor, root_rank, name, False).synchronize()


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return broadcast_async_(tensor, root_rank, name, process_set).synchronize()


# --------------------------------------------------------------------------- join, barrier

_JOIN_NAME = "fastps.torch.join"


def join(device: int = -1) -> int:
    """Blocks until every rank has called ``join`` and returns the rank that joined last.

    "Last" is judged by each rank's wall clock when it entered ``join`` (clocks of
    different machines are assumed close). Unlike Horovod, ranks that joined early do not
    take part in other ranks' collectives in the meantime: every rank must have finished
    its collectives before calling ``join`` (``device`` is accepted and ignored).
    """
    stamps = torch.zeros(fastps.size(), dtype=torch.float64)
    stamps[fastps.rank()] = time.time()
    submit(stamps, stamps, "float64", _JOIN_NAME, 0, 1.0).synchronize()
    return int(torch.argmax(stamps).item())


def barrier(process_set: Any = None) -> None:
    """Returns once every rank has called ``barrier``."""
    _check_process_set(process_set)
    fastps.barrier()
