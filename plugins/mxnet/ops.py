"""Collectives on MXNet NDArrays, with the names and semantics of ``horovod.mxnet``.

This module is an adapter: the algorithms, checks, process sets and op naming live in
``fastps.collectives`` (framework-neutral, on host arrays). Here an NDArray becomes a numpy
view of its host memory (arrays on other devices are staged through a host copy; bfloat16
travels as its bits), outputs are allocated as NDArrays and filled in place by the layer,
and MXNet's asynchronous engine is waited for before the layer touches an array.

fastps is not compiled against MXNet: an array's address comes from ``MXNDArrayGetData``
through MXNet's own ctypes library handle. Every op has an ``*_async`` form that returns a
:class:`MXHandle` at once (it never waits for other workers); the plain form synchronizes.
Errors (ranks that disagree on shape, dtype, root...) raise on every rank when the op is
synchronized, name both values, and leave the job usable.

:func:`_start` is the one path that bypasses the layer: the trainer's and the KVStore's
gradient sums, whose names are fixed per parameter (the hot path, like the torch
optimizer's). It hands the core the arrays' memory directly.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np
from fastps.collectives import ops as C
from fastps.collectives.ops import ProcessSet, ReduceOp, global_process_set
from fastps.errors import FastPSError
from fastps.mxnet.compression import Compression, is_core
from fastps.worker import api as _api
from fastps.worker import catch_up as CU
from fastps.worker.buffers import SUPPORTED_DTYPES, RawBuffer
from fastps.worker.waitable import Waitable

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
    "MXHandle",
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
    "barrier",
    "join",
    "synchronize",
    "poll",
    "dtype_name",
]

if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM  # core/collectives/adasum.py, through the collective layer
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
add_process_set = C.add_process_set
remove_process_set = C.remove_process_set

# Device types whose memory the CPU can address directly.
_HOST_DEVICES = ("cpu", "cpu_pinned", "cpu_shared")

_DTYPE_NAMES: dict = {}


def dtype_name(arr: NDArray) -> str:
    """The core's name for ``arr``'s element type (MXNet spells bfloat16 as a record)."""
    t = arr.dtype
    name = _DTYPE_NAMES.get(t)
    if name is None:
        dt = np.dtype(t)
        name = "bfloat16" if dt.names == ("bfloat16",) else dt.name
        _DTYPE_NAMES[t] = name
    return name


# --------------------------------------------------------------------------- engine glue


def _wait_to_read(arr: NDArray) -> None:
    """Blocks until every pending engine write of ``arr`` has landed."""
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToRead(arr.handle))


def _wait_to_write(arr: NDArray) -> None:
    """Blocks until the engine has no pending read or write of ``arr``."""
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToWrite(arr.handle))


def _address(arr: NDArray) -> int:
    ptr = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return int(ptr.value or 0)


def _check(arr: Any, what: str) -> str:
    """``arr``'s core dtype name, or a FastPSError naming it."""
    if not isinstance(arr, mx.nd.NDArray):
        raise FastPSError(f"{what}: expected an mxnet NDArray, got {type(arr).__name__}")
    if arr.stype != "default":
        raise FastPSError(
            f"{what}: {arr.stype} NDArrays are not supported; convert with .tostype('default')"
        )
    dtype = dtype_name(arr)
    if dtype not in C.DTYPES:
        raise FastPSError(
            f"{what}: dtype {dtype} is not supported (supported: {', '.join(C.DTYPES)})"
        )
    return dtype


def _view(arr: NDArray, dtype: str) -> np.ndarray:
    """A numpy array over a host NDArray's memory (the caller waited for the engine)."""
    shape = tuple(arr.shape)
    npdt = C.DTYPES[dtype]
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count == 0:
        return np.empty(shape, dtype=npdt)
    raw = (ctypes.c_char * (count * npdt.itemsize)).from_address(_address(arr))
    return np.frombuffer(memoryview(raw).cast("B"), dtype=npdt).reshape(shape)


class _Host:
    """An NDArray as the layer sees it: a host array (the NDArray itself, or a staged copy
    for other devices) and a numpy view of its memory. ``write=True``: the layer will write
    it, so pending engine reads must finish first too."""

    def __init__(self, arr: NDArray, what: str, write: bool = False) -> None:
        self.dtype = _check(arr, what)
        self.arr = arr
        self.staged = arr.context.device_type not in _HOST_DEVICES
        self.host = arr.copyto(mx.cpu()) if self.staged else arr
        if write:
            _wait_to_write(self.host)
        else:
            _wait_to_read(self.host)
        self.view = _view(self.host, self.dtype)

    def publish(self) -> NDArray:
        """The layer's writes, back on the array's own device."""
        if self.staged:
            self.host.copyto(self.arr)
        return self.arr


def _new_like(shape: Sequence[int], like: NDArray) -> NDArray:
    """An output NDArray on the host (its device's copy is made when the op finishes)."""
    return mx.nd.empty(tuple(shape), ctx=mx.cpu(), dtype=like.dtype)


def _to_nd(data: np.ndarray, like: NDArray, dtype: str) -> NDArray:
    """A layer result (numpy) as an NDArray of ``like``'s dtype on ``like``'s device."""
    out = _new_like(data.shape, like)
    if data.size:
        _view(out, dtype)[...] = data
    return out if like.context.device_type in _HOST_DEVICES else out.as_in_context(like.context)


def _process_set(process_set: Any) -> ProcessSet:
    return global_process_set if process_set is None else process_set


def _resolve_op(op: Optional[int], average: Optional[bool]) -> ReduceOp:
    return C.resolve_op(op, average)


class MXHandle(Waitable):
    """A collective in progress; :meth:`synchronize` waits and returns the output. The
    handle holds the input arrays, so they live as long as the layer may read them."""

    def __init__(
        self,
        name: str,
        parts: Sequence[Any],
        finish: Callable[[], Any],
        keep: Sequence[Any] = (),
    ) -> None:
        self.name = name
        self._parts = list(parts)
        self._finish: Optional[Callable[[], Any]] = finish
        self._keep = list(keep)
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def poll(self) -> bool:
        """True once the result is in (``synchronize`` will not block)."""
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
                self._parts, self._keep = [], []
        return self._result

    def give_up(self) -> None:
        """Nobody will synchronize this handle (its group's wait failed): its members
        leave the names in flight and their parts go to the sweep (``Op.give_up``)."""
        if self._finish is not None:
            self._finish = None
            self._error = C.CollectiveError(f"'{self.name}' was given up by its caller")
            C.give_up(self._parts)

    wait = synchronize

    def __repr__(self) -> str:
        return f"<fastps.mxnet.MXHandle {self.name!r} {'running' if self._finish else 'done'}>"


def synchronize(handle: MXHandle) -> Any:
    """Waits for an async collective and returns its output."""
    return handle.synchronize()


def poll(handle: MXHandle) -> bool:
    """True once an async collective has finished."""
    return handle.poll()


def _grouped(
    kind: str,
    start_one: Callable[[NDArray, str, ProcessSet], MXHandle],
    tensors: Sequence[NDArray],
    name: Optional[str],
    process_set: Any,
) -> MXHandle:
    """The one grouped form of every op: member i is ``start_one(tensor_i, name_i, set)``,
    named by the layer's group rule (``<name>.<i>``, anonymous groups numbered like any
    op), and the whole group reaches the core in one submission batch. The handle's
    result is the list of the members' results (empty for no tensors)."""
    if not tensors:
        return MXHandle(name or f"grouped_{kind}", [], lambda: [])
    ps = _process_set(process_set)
    names = C.group_names(ps, name, len(tensors))
    with _api.submission_batch():
        handles = [start_one(t, n, ps) for t, n in zip(tensors, names)]
    return MXHandle(name or f"grouped_{kind}", handles, lambda: [h.synchronize() for h in handles])


# --------------------------------------------------------------------------- allreduce


def _core_compression(compression: Any) -> Any:
    """The core compressor ``compression`` names, or None; a cast compressor (``none``,
    ``fp16``) is the trainer's business, not an op's: refused by name."""
    if compression is None or compression is Compression.none:
        return None
    if is_core(compression):
        return compression
    raise FastPSError(
        f"allreduce takes the core's compressors (fastps.Compression.onebit, .topk(k), ...), "
        f"not {getattr(compression, '__name__', compression)!r}"
    )


def _allreduce_op(
    tensor: NDArray,
    inplace: bool,
    name: Optional[str],
    op: ReduceOp,
    priority: int,
    prescale: float,
    postscale: float,
    process_set: Any,
    layer_name: Optional[str] = None,
    compression: Any = None,
) -> MXHandle:
    what = f"allreduce '{name}'" if name else "allreduce"
    compression = _core_compression(compression)
    src = _Host(tensor, what, write=inplace)
    if inplace:
        dst, out = src, src.view
    else:
        dst = _Host(_new_like(tensor.shape, tensor), what, write=False)
        out = dst.view
    cop = C.allreduce_async(
        src.view,
        src.dtype,
        layer_name or name,
        op,
        prescale,
        postscale,
        _process_set(process_set),
        priority,
        out=out,
        compression=compression,
    )
    if inplace:
        return MXHandle(cop.name, [cop], src.publish, keep=[src])

    def finish() -> NDArray:
        result = dst.arr
        if tensor.context.device_type not in _HOST_DEVICES:
            return result.as_in_context(tensor.context)
        return result

    return MXHandle(cop.name, [cop], finish, keep=[src, dst])


def allreduce_async(
    tensor: NDArray,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
    compression: Any = None,
) -> MXHandle:
    """Starts averaging (default) or reducing ``tensor`` over the process set into a new
    NDArray. ``op``: Average, Sum, Min, Max, Product or Adasum (floating-point tensors;
    core/collectives/adasum.py); ``average`` is the older flag. ``compression``: one of the core's
    compressors (``Compression.onebit``, ``.topk(k)``, ...; docs/guide/compression.md) for a
    Sum/Average over the global set; every rank must choose alike."""
    return _allreduce_op(
        tensor,
        False,
        name,
        _resolve_op(op, average),
        priority,
        prescale_factor,
        postscale_factor,
        process_set,
        compression=compression,
    )


def allreduce_async_(
    tensor: NDArray,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
    compression: Any = None,
) -> MXHandle:
    """In-place :func:`allreduce_async`: ``tensor`` receives the result."""
    return _allreduce_op(
        tensor,
        True,
        name,
        _resolve_op(op, average),
        priority,
        prescale_factor,
        postscale_factor,
        process_set,
        compression=compression,
    )


def allreduce(
    tensor: NDArray,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
    compression: Any = None,
) -> NDArray:
    """The average (default) or reduction of ``tensor`` over the process set, as a new
    NDArray; ``tensor`` is not modified. Integer averages round toward zero."""
    return allreduce_async(
        tensor,
        average,
        name,
        priority,
        prescale_factor,
        postscale_factor,
        process_set,
        op,
        compression,
    ).synchronize()


def allreduce_(
    tensor: NDArray,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
    compression: Any = None,
) -> NDArray:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return allreduce_async_(
        tensor,
        average,
        name,
        priority,
        prescale_factor,
        postscale_factor,
        process_set,
        op,
        compression,
    ).synchronize()


# BytePS spells it push_pull; same operations.
push_pull = allreduce
push_pull_ = allreduce_
push_pull_async = allreduce_async
push_pull_async_ = allreduce_async_


def grouped_allreduce_async(
    tensors: Sequence[NDArray],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
) -> MXHandle:
    """Starts one allreduce per tensor, announced together; the result is the list of
    new NDArrays."""
    rop = _resolve_op(op, average)
    return _grouped(
        "allreduce",
        lambda t, n, ps: _allreduce_op(
            t, False, n, rop, priority, prescale_factor, postscale_factor, ps
        ),
        tensors,
        name,
        process_set,
    )


def grouped_allreduce_async_(
    tensors: Sequence[NDArray],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
) -> MXHandle:
    """In-place :func:`grouped_allreduce_async`: each tensor receives its result."""
    rop = _resolve_op(op, average)
    return _grouped(
        "allreduce",
        lambda t, n, ps: _allreduce_op(
            t, True, n, rop, priority, prescale_factor, postscale_factor, ps
        ),
        tensors,
        name,
        process_set,
    )


def grouped_allreduce(
    tensors: Sequence[NDArray],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
) -> List[NDArray]:
    """Allreduces several tensors at once; new NDArrays, in order."""
    return grouped_allreduce_async(
        tensors, average, name, priority, prescale_factor, postscale_factor, process_set, op
    ).synchronize()


def grouped_allreduce_(
    tensors: Sequence[NDArray],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    op: Optional[int] = None,
) -> List[NDArray]:
    """In-place :func:`grouped_allreduce`; returns ``tensors``."""
    return grouped_allreduce_async_(
        tensors, average, name, priority, prescale_factor, postscale_factor, process_set, op
    ).synchronize()


# --------------------------------------------------------------------------- allgather


def _allgather_op(tensor: NDArray, name: Optional[str], process_set: Any) -> MXHandle:
    src = _Host(tensor, f"allgather '{name}'" if name else "allgather")
    cop = C.allgather_async(src.view, src.dtype, name, _process_set(process_set))

    def finish() -> NDArray:
        data, _ = cop.synchronize()
        return _to_nd(data, tensor, src.dtype)

    return MXHandle(cop.name, [cop], finish, keep=[src])


def allgather_async(
    tensor: NDArray,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> MXHandle:
    """Starts concatenating every member's ``tensor`` along the first dimension."""
    return _allgather_op(tensor, name, process_set)


def allgather(
    tensor: NDArray,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> NDArray:
    """Every member's ``tensor`` concatenated along the first dimension, in rank order.
    First dimensions may differ between ranks; the other dimensions must agree."""
    return _allgather_op(tensor, name, process_set).synchronize()


def grouped_allgather_async(
    tensors: Sequence[NDArray],
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> MXHandle:
    """Starts :func:`allgather` of several tensors, announced together."""
    return _grouped("allgather", _allgather_op, tensors, name, process_set)


def grouped_allgather(
    tensors: Sequence[NDArray],
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> List[NDArray]:
    """:func:`allgather` of several tensors at once."""
    return grouped_allgather_async(tensors, name, priority, process_set).synchronize()


# --------------------------------------------------------------------------- broadcast


def _broadcast_op(
    tensor: NDArray, root_rank: int, name: Optional[str], inplace: bool, process_set: Any
) -> MXHandle:
    what = f"broadcast '{name}'" if name else "broadcast"
    src = _Host(tensor, what, write=inplace)
    dst = src if inplace else _Host(_new_like(tensor.shape, tensor), what, write=False)
    cop = C.broadcast_async(
        src.view, src.dtype, root_rank, name, _process_set(process_set), out=dst.view
    )

    def finish() -> NDArray:
        if inplace:
            return src.publish()
        if tensor.context.device_type not in _HOST_DEVICES:
            return dst.arr.as_in_context(tensor.context)
        return dst.arr

    return MXHandle(cop.name, [cop], finish, keep=[src, dst])


def broadcast_async(
    tensor: NDArray,
    root_rank: int,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> MXHandle:
    """Starts copying ``root_rank``'s ``tensor`` to every member, into a new NDArray."""
    return _broadcast_op(tensor, root_rank, name, False, process_set)


def broadcast_async_(
    tensor: NDArray,
    root_rank: int,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> MXHandle:
    """Starts overwriting ``tensor`` with ``root_rank``'s value, in place."""
    return _broadcast_op(tensor, root_rank, name, True, process_set)


def broadcast(
    tensor: NDArray,
    root_rank: int,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> NDArray:
    """``root_rank``'s ``tensor`` on every member, as a new NDArray."""
    return broadcast_async(tensor, root_rank, name, priority, process_set).synchronize()


def broadcast_(
    tensor: NDArray,
    root_rank: int,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> NDArray:
    """Overwrites ``tensor`` with ``root_rank``'s value on every member; returns it."""
    return broadcast_async_(tensor, root_rank, name, priority, process_set).synchronize()


# --------------------------------------------------------------------------- alltoall


def _splits_list(splits: Any) -> Optional[List[int]]:
    """Horovod takes splits as an int32 NDArray; lists and integer numpy arrays are
    accepted too. Anything else is refused (ValueError), before any rank waits."""
    if splits is None:
        return None
    if isinstance(splits, mx.nd.NDArray):
        if np.dtype(splits.dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(
                f"alltoall splits must be an int32 (or int64) NDArray, got {splits.dtype}"
            )
        return [int(s) for s in splits.asnumpy().ravel()]
    values = np.asarray(splits)
    if values.dtype.kind not in "iu":
        raise ValueError(f"alltoall splits must be integers, got {values.dtype}")
    return [int(s) for s in values.ravel()]


def _alltoall_op(tensor: NDArray, splits: Any, name: Optional[str], process_set: Any) -> MXHandle:
    wanted = _splits_list(splits)
    src = _Host(tensor, f"alltoall '{name}'" if name else "alltoall")
    cop = C.alltoall_async(src.view, src.dtype, wanted, name, _process_set(process_set))

    def finish() -> Tuple[NDArray, NDArray]:
        data, received = cop.synchronize()
        counts = mx.nd.array(np.asarray(received, dtype=np.int32), ctx=mx.cpu(), dtype="int32")
        return _to_nd(data, tensor, src.dtype), counts

    return MXHandle(cop.name, [cop], finish, keep=[src])


def alltoall_async(
    tensor: NDArray,
    splits: Any = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> MXHandle:
    """Starts sending ``splits[j]`` rows to member j; the result is (tensor, received
    splits)."""
    return _alltoall_op(tensor, splits, name, process_set)


def alltoall(
    tensor: NDArray,
    splits: Any = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
) -> Any:
    """Rows received from every member, concatenated in rank order; with ``splits`` given,
    ``(tensor, received_splits)`` (Horovod's two forms). Without ``splits`` the first
    dimension is divided evenly."""
    out, received = _alltoall_op(tensor, splits, name, process_set).synchronize()
    return out if splits is None else (out, received)


# --------------------------------------------------------------------------- reducescatter


def _reducescatter_op(
    tensor: NDArray,
    op: ReduceOp,
    name: Optional[str],
    prescale: float,
    postscale: float,
    process_set: Any,
) -> MXHandle:
    src = _Host(tensor, f"reducescatter '{name}'" if name else "reducescatter")
    cop = C.reducescatter_async(
        src.view, src.dtype, name, op, prescale, postscale, _process_set(process_set)
    )
    return MXHandle(
        cop.name, [cop], lambda: _to_nd(cop.synchronize(), tensor, src.dtype), keep=[src]
    )


def reducescatter_async(
    tensor: NDArray,
    op: Optional[int] = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> MXHandle:
    """Starts reducing ``tensor`` over the set; each member keeps its share of the rows
    (the first ``rows % size`` members one more)."""
    return _reducescatter_op(
        tensor, _resolve_op(op, None), name, prescale_factor, postscale_factor, process_set
    )


def reducescatter(
    tensor: NDArray,
    op: Optional[int] = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> NDArray:
    """This member's share of the average (default) or sum of ``tensor`` over the set."""
    return reducescatter_async(
        tensor, op, name, priority, process_set, prescale_factor, postscale_factor
    ).synchronize()


def grouped_reducescatter_async(
    tensors: Sequence[NDArray],
    op: Optional[int] = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> MXHandle:
    """Starts :func:`reducescatter` of several tensors, announced together."""
    rop = _resolve_op(op, None)
    return _grouped(
        "reducescatter",
        lambda t, n, ps: _reducescatter_op(t, rop, n, prescale_factor, postscale_factor, ps),
        tensors,
        name,
        process_set,
    )


def grouped_reducescatter(
    tensors: Sequence[NDArray],
    op: Optional[int] = None,
    name: Optional[str] = None,
    priority: int = 0,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[NDArray]:
    """:func:`reducescatter` of several tensors at once."""
    return grouped_reducescatter_async(
        tensors, op, name, priority, process_set, prescale_factor, postscale_factor
    ).synchronize()


# --------------------------------------------------------------------------- barrier, join


def barrier(process_set: Any = global_process_set) -> None:
    """Returns once every member of the set has called ``barrier``."""
    C.barrier(_process_set(process_set))


def join(process_set: Any = global_process_set) -> int:
    """Waits until every member joined; meanwhile this rank stands in with zeros for the
    others' allreduces. Returns the rank that joined last."""
    return C.join(_process_set(process_set))


# --------------------------------------------------------------------------- hot path


class _Meta:
    """What the core needs to know of an NDArray, read once (each read is a C call)."""

    __slots__ = ("arr", "shape", "dtype", "host")

    def __init__(self, arr: Any, what: str) -> None:
        self.dtype = _check(arr, what)
        if self.dtype not in SUPPORTED_DTYPES:
            raise FastPSError(f"{what}: dtype {self.dtype} is not supported by the core")
        self.arr = arr
        self.shape = tuple(arr.shape)
        self.host = arr.context.device_type in _HOST_DEVICES

    def raw(self) -> RawBuffer:
        """A view of the (host) array's memory; the caller has waited for the engine."""
        count = 1
        for d in self.shape:
            count *= d
        nbytes = count * np.dtype(self.arr.dtype).itemsize
        return RawBuffer(_address(self.arr), nbytes, self.dtype, self.shape, self.arr)


class _CoreHandle(Waitable):
    """The gradient path's handle: the core's sum into ``out``, then a device copy."""

    def __init__(self, handle: Any, out: NDArray, finish: Optional[Callable[[], None]]) -> None:
        self._handle = handle
        self._out = out
        self._finish = finish
        self._done = False
        self.name = handle.name
        self.host = finish is None  # the core writes the sum into ``out`` itself

    def poll(self) -> bool:
        return self._done or self._handle.poll()

    def synchronize(self, timeout: Optional[float] = None) -> NDArray:
        if not self._done:
            self._done = True
            self._handle.synchronize(timeout)
            if self._finish is not None:
                self._finish()
                self._finish = None
        return self._out

    wait = synchronize

    @property
    def lag(self) -> int:
        """Once synchronized: the quorum lag of its wait (``fastps.api.Handle.lag``)."""
        return int(self._handle.lag)


def _fetch_target(arr: NDArray, name: str, priority: int, scale: float) -> CU.Target:
    """Where a catch-up fetch (``fastps.catch_up``) writes the next round of ``name``'s sum:
    ``arr``'s host memory, once the engine has no pending read or write of it (the last
    update may still read the gradient)."""
    meta = _Meta(arr, f"gradient '{name}'")
    if not meta.host:
        raise FastPSError(f"gradient '{name}': a catch-up fetch needs a host array")
    _wait_to_write(arr)
    raw = meta.raw()
    return CU.Target(raw.ptr, raw.nbytes, raw.dtype, raw.shape, name, priority, scale)


def _start(
    tensor: NDArray,
    out: NDArray,
    name: str,
    priority: int,
    scale: float,
    out_wait: str = "write",
    compression: Any = None,
    quorum: bool = False,
) -> _CoreHandle:
    """Starts the core's sum-times-``scale`` of ``tensor`` over all workers into ``out``
    (the gradient path: fixed names, no per-op announcement).

    ``out_wait`` says what to wait for before the core writes ``out``: ``"write"`` every
    pending engine read and write of it (safe for any array), ``"read"`` pending writes
    only (enough where every reader is ordered before the last writer, like gradients
    written by backward), ``"none"`` nothing (a new array). ``compression``: a core
    compressor (docs/guide/compression.md) or None. ``quorum``: a gradient's sum, a quorum round
    under FASTPS_ROUND_QUORUM (docs/guide/async.md).
    """
    src_m = _Meta(tensor, f"tensor '{name}'")
    out_m = src_m if out is tensor else _Meta(out, f"output of tensor '{name}'")
    if out_m.shape != src_m.shape or out_m.dtype != src_m.dtype:
        raise FastPSError(
            f"tensor '{name}': output {out_m.dtype}{list(out_m.shape)} does not match input "
            f"{src_m.dtype}{list(src_m.shape)}"
        )
    finish: Optional[Callable[[], None]] = None
    if out_m.host:
        dst, dst_m = out, out_m
    else:
        dst = mx.nd.empty(out_m.shape, ctx=mx.cpu(), dtype=out.dtype)
        dst_m = _Meta(dst, name)
        out_wait = "none"

        def finish() -> None:
            dst.copyto(out)

    if not src_m.host:
        src = tensor.copyto(mx.cpu())
        src_m = _Meta(src, name)
    else:
        src = tensor
    if src is not dst:
        _wait_to_read(src)
    if out_wait == "write":
        _wait_to_write(dst)
    elif out_wait == "read":
        _wait_to_read(dst)
    handle = _api.push_pull_raw(
        src_m.raw(),
        dst_m.raw(),
        name,
        priority,
        scale,
        out=out,
        keep=(src, dst),
        compression=compression,
        quorum=quorum,
    )
    return _CoreHandle(handle, out, finish)
