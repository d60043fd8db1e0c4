"""Collective operations on torch tensors, with Horovod's names and semantics.

This module is an adapter: the algorithms, checks and process sets live in
``fastps.collectives`` (framework-neutral, on host arrays). Here a tensor becomes a numpy
view of its host memory (CUDA tensors are copied to the host; bfloat16 travels as its bits),
results become tensors again, autograd functions define the gradients, and :class:`Handle`
wraps the layer's op.

The one exception is the optimizer's gradient allreduce (:func:`_allreduce_start`), which
goes straight to the core through ``staging`` (pinned CUDA buffers on a side stream) and
skips the per-op announcement: its names are fixed parameter names and it is the hot path.

Asynchronous variants return a :class:`Handle`; ``synchronize(handle)`` returns the output.
In-place variants (trailing ``_``) write the result into the tensor they were given.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import fastps
import numpy as np
import torch
from fastps.collectives import ops as C
from fastps.collectives.ops import ProcessSet, ReduceOp, global_process_set
from fastps.errors import FastPSError
from fastps.torch.compression import Compression, is_core
from fastps.torch.staging import Waitable, submit
from fastps.worker.api import auto_name
from fastps.worker.compression import spec_for as compression_spec_for

__all__ = [
    "ReduceOp",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
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
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "poll",
    "synchronize",
    "join",
    "barrier",
]

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM  # core/collectives/adasum.py
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
add_process_set = C.add_process_set
remove_process_set = C.remove_process_set

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
    return C.resolve_op(op, average)


# --------------------------------------------------------------------------- tensor <-> host


def _host(tensor: Any, name: str) -> Tuple[np.ndarray, str]:
    """A numpy view of ``tensor``'s values in host memory (a copy only when the tensor is
    on a device or not contiguous) and the core's dtype name."""
    dtype = core_dtype(tensor, name)
    base = tensor.detach()
    if base.device.type != "cpu":
        base = base.cpu()
    base = base.contiguous()
    if dtype == "bfloat16":
        return base.view(torch.int16).numpy().view(np.uint16), dtype
    return base.numpy(), dtype


def _tensor(arr: np.ndarray, dtype: str, like: torch.Tensor) -> torch.Tensor:
    """``arr`` as a tensor of ``like``'s dtype on ``like``'s device (no copy on the CPU)."""
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if dtype == "bfloat16":
        t = t.view(torch.int16).view(torch.bfloat16)
    return t if like.device.type == "cpu" else t.to(like.device)


def _process_set(process_set: Any) -> ProcessSet:
    return global_process_set if process_set is None else process_set


class Handle(Waitable):
    """A collective in progress. ``synchronize()`` waits and returns the output tensor."""

    def __init__(
        self,
        name: str,
        parts: Sequence[Union[Waitable, Handle, C.Op]],
        finish: Callable[[], Any],
    ) -> None:
        self.name = name
        self._parts: List[Union[Waitable, Handle, C.Op]] = list(parts)
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
                C.give_up(self._parts)  # the members not waited for yet
                raise
            finally:
                self._parts = []
        return self._result

    def give_up(self) -> None:
        """Nobody will synchronize this handle (its group's wait failed): its members
        leave the names in flight and their parts go to the sweep (``Op.give_up``)."""
        if self._finish is not None:
            self._finish = None
            self._error = C.CollectiveError(f"'{self.name}' was given up by its caller")
            C.give_up(self._parts)

    wait = synchronize
    __call__ = synchronize  # Horovod's sparse_allreduce_async returns a callable

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
    quorum: bool = True,
) -> Handle:
    """A gradient's allreduce, straight to the core (``quorum``: its round may close with
    FASTPS_ROUND_QUORUM pushes, docs/guide/async.md)."""
    if op in (Min, Max, Product, Adasum):  # gathered and reduced by the collective layer
        return _allreduce_op(
            tensor,
            inplace,
            name,
            op,
            prescale_factor,
            postscale_factor,
            None,
            compression,
            priority,
        )
    name = _name(name, "allreduce")
    dtype = core_dtype(tensor, name)
    size = fastps.size()
    base = tensor.detach()
    is_float = base.is_floating_point()
    if base.dtype == torch.bool and (
        op == Average or prescale_factor != 1 or postscale_factor != 1
    ):
        raise FastPSError(
            f"tensor '{name}' is boolean: only op=Sum (logical OR) without scale factors is "
            "defined for it"
        )
    spec = ""
    if is_core(compression):  # the core compresses on the wire
        spec = compression_spec_for(
            compression, name, base.numel() * base.element_size(), core_dtype(base, name)
        )
        compression = Compression.none
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
    part = submit(src, dst, dtype, name, priority, scale, spec, quorum)

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


def _allreduce_op(
    tensor: torch.Tensor,
    inplace: bool,
    name: Optional[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any,
    compression: Any,
    priority: int,
) -> Handle:
    core = compression if is_core(compression) else None  # the core compresses on the wire
    compression = Compression.none if core is not None else compression or Compression.none
    label = name or "allreduce"
    sent, ctx = compression.compress(tensor.detach())
    arr, dtype = _host(sent, label)
    out = arr if inplace and sent.device.type == "cpu" and arr.flags.writeable else None
    cop = C.allreduce_async(
        arr,
        dtype,
        name,
        op,
        prescale,
        postscale,
        _process_set(process_set),
        priority,
        out=out,
        compression=core,
    )

    def finish() -> torch.Tensor:
        result = compression.decompress(_tensor(cop.synchronize(), dtype, sent), ctx)
        result = result.view(tensor.shape)
        if inplace:
            if result.data_ptr() != tensor.data_ptr():
                tensor.detach().copy_(result)
            return tensor
        return result

    return Handle(cop.name, [cop], finish)


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
    """Starts averaging (``op=Average``, default) or reducing ``tensor`` over the process set
    into a new tensor. Never waits for other ranks."""
    return _allreduce_op(
        tensor,
        False,
        name,
        C.resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
        priority,
    )


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
    """In-place :func:`allreduce_async`: do not touch ``tensor`` until synchronized."""
    return _allreduce_op(
        tensor,
        True,
        name,
        C.resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
        priority,
    )


class _AllreduceFunction(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the same reduction of the gradients."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: Optional[str],
        op: ReduceOp,
        prescale: float,
        postscale: float,
        process_set: Any,
        compression: Any,
    ) -> torch.Tensor:
        ctx.args = (name, op, prescale, postscale, process_set, compression)
        return _allreduce_op(
            tensor, False, name, op, prescale, postscale, process_set, compression, 0
        ).synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        name, op, prescale, postscale, process_set, compression = ctx.args
        grad_name = f"{name}.grad" if name else None
        out = _allreduce_op(
            grad.contiguous(),
            False,
            grad_name,
            op,
            prescale,
            postscale,
            process_set,
            compression,
            0,
        ).synchronize()
        return out, None, None, None, None, None, None


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
    """Averages (default) or reduces ``tensor`` over the process set; returns a new tensor.
    Differentiable for ``op`` Average and Sum: the gradient is reduced the same way."""
    rop = C.resolve_op(op, average)
    if rop in (Average, Sum) and torch.is_grad_enabled() and tensor.requires_grad:
        return _AllreduceFunction.apply(
            tensor, name, rop, prescale_factor, postscale_factor, process_set, compression
        )
    return _allreduce_op(
        tensor,
        False,
        name,
        rop,
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
        priority,
    ).synchronize()


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
    return allreduce_async_(
        tensor,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
        priority,
    ).synchronize()


# BytePS spells it push_pull; same operations.
push_pull = allreduce
push_pull_ = allreduce_
push_pull_async = allreduce_async
push_pull_async_ = allreduce_async_


def _group(name: str, handles: List[Handle]) -> Handle:
    # Handles are waitables themselves; a finished one returns its cached result.
    return Handle(name, handles, lambda: [h.synchronize() for h in handles])


def _grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    inplace: bool,
    average: Optional[bool],
    name: Optional[str],
    op: Optional[int],
    prescale_factor: float,
    postscale_factor: float,
    process_set: Any,
    compression: Any,
) -> Handle:
    rop = C.resolve_op(op, average)
    ps = _process_set(process_set)
    names = C.group_names(ps, name, len(tensors))
    with fastps.submission_batch():  # every worker queues the whole group in one step
        handles = [
            _allreduce_op(t, inplace, n, rop, prescale_factor, postscale_factor, ps, compression, 0)
            for t, n in zip(tensors, names)
        ]
    return _group(name or "grouped_allreduce", handles)


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
    return _grouped_allreduce(
        tensors,
        False,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
    )


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
    return _grouped_allreduce(
        tensors,
        True,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        compression,
    )


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        name: Optional[str],
        op: ReduceOp,
        prescale: float,
        postscale: float,
        process_set: Any,
        *tensors: torch.Tensor,
    ) -> Tuple[torch.Tensor, ...]:
        ctx.args = (name, op, prescale, postscale, process_set)
        return tuple(
            _grouped_allreduce(
                tensors, False, None, name, op, prescale, postscale, process_set, None
            ).synchronize()
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        name, op, prescale, postscale, process_set = ctx.args
        grad_name = f"{name}.grad" if name else None
        out = _grouped_allreduce(
            [g.contiguous() for g in grads],
            False,
            None,
            grad_name,
            op,
            prescale,
            postscale,
            process_set,
            None,
        ).synchronize()
        return (None, None, None, None, None, *out)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> List[Any]:
    rop = C.resolve_op(op, average)
    if rop in (Average, Sum) and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(
            _GroupedAllreduceFunction.apply(
                name, rop, prescale_factor, postscale_factor, process_set, *tensors
            )
        )
    return _grouped_allreduce(
        tensors, False, None, name, rop, prescale_factor, postscale_factor, process_set, compression
    ).synchronize()


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> List[Any]:
    return grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    ).synchronize()


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: Optional[int] = None,
    process_set: Any = None,
    priority: int = 0,
) -> Handle:
    """Reduces a sparse COO tensor: its indices and values are allgathered and summed into
    a coalesced sparse result (averaged for ``op=Average``). ``priority``: the data plane's
    (the optimizer gives a sparse gradient its forward-order priority)."""
    return _sparse_allreduce(tensor, name, op, process_set, priority, coalesce=True)


def _sparse_allreduce(
    tensor: torch.Tensor,
    name: Optional[str],
    op: Optional[int],
    process_set: Any,
    priority: int,
    coalesce: bool,
) -> Handle:
    """``sparse_allreduce_async``; ``coalesce=False`` leaves every rank's rows side by side
    (a row several ranks touched appears once per rank; a sparse tensor's value is the sum
    of its duplicates), as Horovod's sparse gradients are: sorting and summing ~4 x 1,800
    rows of 768 floats took 4-130 ms on a busy host, in front of the next forward pass."""
    rop = C.resolve_op(op, None)
    if rop not in (Average, Sum):
        raise FastPSError("sparse_allreduce supports op=Average and op=Sum only")
    ps = _process_set(process_set)
    base = tensor.detach().coalesce()
    label = name or "sparse_allreduce"
    names = C.group_names(ps, name, 2)
    indices = _allgather_op(base.indices().t().contiguous(), names[0], ps, priority=priority)
    values = _allgather_op(base.values().contiguous(), names[1], ps, priority=priority)

    def finish() -> torch.Tensor:
        idx = indices.synchronize().t()
        vals = values.synchronize()
        if rop == Average:
            # The gathered values are a buffer of this op's own: dividing in place spares
            # a second allocation of every rank's rows (and its page faults), which sat on
            # the next forward pass's critical path for an embedding table. Integers keep
            # the true division's float result.
            vals = vals.div_(ps.size()) if vals.is_floating_point() else vals / ps.size()
        out = torch.sparse_coo_tensor(idx, vals, base.shape)
        return out.coalesce() if coalesce else out

    return Handle(label, [indices, values], finish)


# --------------------------------------------------------------------------- allgather


def _allgather_op(
    tensor: torch.Tensor,
    name: Optional[str],
    process_set: Any,
    counts: Optional[List[int]] = None,
    priority: int = 0,
) -> Handle:
    arr, dtype = _host(tensor, name or "allgather")
    cop = C.allgather_async(arr, dtype, name, _process_set(process_set), priority)

    def finish() -> torch.Tensor:
        data, rows = cop.synchronize()
        if counts is not None:
            counts[:] = rows
        return _tensor(data, dtype, tensor)

    return Handle(cop.name, [cop], finish)


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension (which may
    differ between ranks; the other dimensions must agree)."""
    return _allgather_op(tensor, name, process_set)


class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: each rank's gradient is its rows of the averaged gradient."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, name: Optional[str], process_set: Any
    ) -> torch.Tensor:
        counts: List[int] = []
        out = _allgather_op(tensor, name, process_set, counts).synchronize()
        ps = _process_set(process_set)
        me = ps.rank()
        ctx.slice = (sum(counts[:me]), counts[me])
        ctx.shape = tensor.shape
        ctx.name = name
        ctx.process_set = process_set
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        grad_name = f"{ctx.name}.grad" if ctx.name else None
        averaged = _allreduce_op(
            grad.contiguous(), False, grad_name, Average, 1.0, 1.0, ctx.process_set, None, 0
        ).synchronize()
        start, length = ctx.slice
        return averaged.narrow(0, start, length).reshape(ctx.shape), None, None


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order."""
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _AllgatherFunction.apply(tensor, name, process_set)
    return _allgather_op(tensor, name, process_set).synchronize()


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: Any = None
) -> Handle:
    ps = _process_set(process_set)
    names = C.group_names(ps, name, len(tensors))
    handles = [_allgather_op(t, n, ps) for t, n in zip(tensors, names)]
    return _group(name or "grouped_allgather", handles)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: Any = None
) -> List[torch.Tensor]:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        ps = _process_set(process_set)
        names = C.group_names(ps, name, len(tensors))
        return [_AllgatherFunction.apply(t, n, process_set) for t, n in zip(tensors, names)]
    return grouped_allgather_async(tensors, name, process_set).synchronize()


# --------------------------------------------------------------------------- broadcast


def _broadcast_op(
    tensor: torch.Tensor, root_rank: int, name: Optional[str], inplace: bool, process_set: Any
) -> Handle:
    arr, dtype = _host(tensor, name or "broadcast")
    out = (
        arr
        if inplace
        and tensor.device.type == "cpu"
        and arr.flags.writeable
        and arr.ctypes.data == tensor.data_ptr()
        else None
    )
    cop = C.broadcast_async(arr, dtype, root_rank, name, _process_set(process_set), out=out)

    def finish() -> torch.Tensor:
        result = _tensor(cop.synchronize(), dtype, tensor).view(tensor.shape)
        if inplace:
            if result.data_ptr() != tensor.data_ptr():
                tensor.detach().copy_(result)
            return tensor
        return result

    return Handle(cop.name, [cop], finish)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    """Starts copying ``root_rank``'s ``tensor`` to every rank (into a new tensor)."""
    return _broadcast_op(tensor, root_rank, name, False, process_set)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    """In-place :func:`broadcast_async`: every rank's ``tensor`` receives the root's."""
    return _broadcast_op(tensor, root_rank, name, True, process_set)


class _BroadcastFunction(torch.autograd.Function):
    """Differentiable broadcast: the root receives the averaged gradient, the others zero."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str], process_set: Any
    ) -> torch.Tensor:
        ctx.root_rank = root_rank
        ctx.name = name
        ctx.process_set = process_set
        return _broadcast_op(tensor, root_rank, name, False, process_set).synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        grad_name = f"{ctx.name}.grad" if ctx.name else None
        averaged = _allreduce_op(
            grad.contiguous(), False, grad_name, Average, 1.0, 1.0, ctx.process_set, None, 0
        ).synchronize()
        if fastps.rank() != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank."""
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _BroadcastFunction.apply(tensor, root_rank, name, process_set)
    return _broadcast_op(tensor, root_rank, name, False, process_set).synchronize()


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return broadcast_async_(tensor, root_rank, name, process_set).synchronize()


# --------------------------------------------------------------------------- alltoall


def _splits_list(splits: Any) -> Optional[List[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"alltoall splits must be an int32/int64 tensor, got {splits.dtype}")
        return [int(s) for s in splits.cpu().tolist()]
    return [int(s) for s in splits]


def _alltoall_op(
    tensor: torch.Tensor, splits: Any, name: Optional[str], process_set: Any
) -> Handle:
    arr, dtype = _host(tensor, name or "alltoall")
    cop = C.alltoall_async(arr, dtype, _splits_list(splits), name, _process_set(process_set))

    def finish() -> Tuple[torch.Tensor, torch.Tensor]:
        data, received = cop.synchronize()
        return _tensor(data, dtype, tensor), torch.tensor(received, dtype=torch.int32)

    return Handle(cop.name, [cop], finish)


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    """Starts sending ``splits[j]`` rows to rank j; the result is (tensor, received splits)."""
    return _alltoall_op(tensor, splits, name, process_set)


class _AlltoallFunction(torch.autograd.Function):
    """Differentiable alltoall: gradients travel back along the received splits."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: Optional[str], process_set: Any
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        out, received = _alltoall_op(tensor, splits, name, process_set).synchronize()
        ctx.received = received
        ctx.name = name
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> Tuple[Any, ...]:
        grad_name = f"{ctx.name}.grad" if ctx.name else None
        back, _ = _alltoall_op(
            grad.contiguous(), ctx.received, grad_name, ctx.process_set
        ).synchronize()
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """Returns (rows received from every rank, concatenated; splits received) when
    ``splits`` is given, else only the tensor (Horovod's two forms)."""
    if torch.is_grad_enabled() and tensor.requires_grad:
        out, received = _AlltoallFunction.apply(tensor, splits, name, process_set)
    else:
        out, received = _alltoall_op(tensor, splits, name, process_set).synchronize()
    return out if splits is None else (out, received)


# --------------------------------------------------------------------------- reducescatter


def _reducescatter_op(
    tensor: torch.Tensor,
    name: Optional[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any,
) -> Handle:
    arr, dtype = _host(tensor, name or "reducescatter")
    cop = C.reducescatter_async(
        arr, dtype, name, op, prescale, postscale, _process_set(process_set)
    )
    return Handle(cop.name, [cop], lambda: _tensor(cop.synchronize(), dtype, tensor))


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: Optional[int] = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts reducing ``tensor`` over the set; each rank keeps its share of the rows."""
    return _reducescatter_op(
        tensor, name, C.resolve_op(op, None), prescale_factor, postscale_factor, process_set
    )


class _ReducescatterFunction(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgathered gradient, scaled as the
    forward op scaled (times the set size for Sum)."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        name: Optional[str],
        op: ReduceOp,
        prescale: float,
        postscale: float,
        process_set: Any,
    ) -> torch.Tensor:
        ctx.args = (name, op, prescale, postscale, process_set)
        return _reducescatter_op(tensor, name, op, prescale, postscale, process_set).synchronize()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        name, op, prescale, postscale, process_set = ctx.args
        grad_name = f"{name}.grad" if name else None
        gathered = _allgather_op(grad.contiguous(), grad_name, process_set).synchronize()
        factor = prescale * postscale * (_process_set(process_set).size() if op == Sum else 1)
        return gathered * factor, None, None, None, None, None


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: Any = None,
    op: Optional[int] = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    rop = C.resolve_op(op, None)
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _ReducescatterFunction.apply(
            tensor, name, rop, prescale_factor, postscale_factor, process_set
        )
    return _reducescatter_op(
        tensor, name, rop, prescale_factor, postscale_factor, process_set
    ).synchronize()


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: Optional[int] = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    rop = C.resolve_op(op, None)
    ps = _process_set(process_set)
    names = C.group_names(ps, name, len(tensors))
    handles = [
        _reducescatter_op(t, n, rop, prescale_factor, postscale_factor, ps)
        for t, n in zip(tensors, names)
    ]
    return _group(name or "grouped_reducescatter", handles)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: Any = None,
    op: Optional[int] = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[torch.Tensor]:
    rop = C.resolve_op(op, None)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        ps = _process_set(process_set)
        names = C.group_names(ps, name, len(tensors))
        return [
            _ReducescatterFunction.apply(t, n, rop, prescale_factor, postscale_factor, process_set)
            for t, n in zip(tensors, names)
        ]
    return grouped_reducescatter_async(
        tensors, name, rop, process_set, prescale_factor, postscale_factor
    ).synchronize()


# --------------------------------------------------------------------------- join, barrier


def join(device: int = -1, process_set: Any = None) -> int:
    """Waits until every rank joined; meanwhile this rank stands in with zeros for the
    others' allreduces (no rows for allgathers). Returns the rank that joined last."""
    return C.join(_process_set(process_set))


def barrier(process_set: Any = None) -> None:
    """Returns once every rank of the set has called ``barrier``."""
    C.barrier(_process_set(process_set))
