"""Collectives on MXNet NDArrays: push_pull (allreduce) and broadcast, blocking and async.

fastps is not compiled against MXNet. A CPU NDArray is handed to the core by the address
of its memory (``MXNDArrayGetData`` through MXNet's own ctypes library handle), so nothing
is copied. MXNet's engine is asynchronous: before the core touches an array we wait for the
engine's pending writes (inputs) or pending reads and writes (outputs), and the core's
write into an output completes before :meth:`MXHandle.synchronize` returns. Arrays on other
devices (GPUs) are staged through a host copy.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import mxnet as mx
import numpy as np
from fastps import api as _api
from fastps.buffers import SUPPORTED_DTYPES, RawBuffer
from fastps.errors import FastPSError

__all__ = [
    "MXHandle",
    "push_pull",
    "push_pull_",
    "push_pull_async",
    "push_pull_async_",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "synchronize",
    "poll",
    "dtype_name",
    "check_same_everywhere",
]

if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray

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


class _Meta:
    """What the core needs to know of an NDArray, read once (each read is a C call)."""

    __slots__ = ("arr", "shape", "dtype", "host")

    def __init__(self, arr: Any, what: str) -> None:
        if not isinstance(arr, mx.nd.NDArray):
            raise FastPSError(f"{what}: expected an mxnet NDArray, got {type(arr).__name__}")
        stype = arr.stype
        if stype != "default":
            raise FastPSError(
                f"{what}: {stype} NDArrays are not supported; convert with .tostype('default')"
            )
        self.arr = arr
        self.dtype = dtype_name(arr)
        if self.dtype not in SUPPORTED_DTYPES:
            raise FastPSError(
                f"{what}: dtype {self.dtype} is not supported (supported: {SUPPORTED_DTYPES})"
            )
        self.shape = tuple(arr.shape)
        self.host = arr.context.device_type in _HOST_DEVICES

    def raw(self) -> RawBuffer:
        """A view of the (host) array's memory; the caller has waited for the engine."""
        ptr = ctypes.c_void_p()
        mx.base.check_call(mx.base._LIB.MXNDArrayGetData(self.arr.handle, ctypes.byref(ptr)))
        count = 1
        for d in self.shape:
            count *= d
        nbytes = count * np.dtype(self.arr.dtype).itemsize
        return RawBuffer(int(ptr.value or 0), nbytes, self.dtype, self.shape, self.arr)


def _check(arr: Any, what: str) -> NDArray:
    _Meta(arr, what)
    return arr


def _wait_to_read(arr: NDArray) -> None:
    """Blocks until every pending engine write of ``arr`` has landed (no engine round trip
    when there is none)."""
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToRead(arr.handle))


def _wait_to_write(arr: NDArray) -> None:
    """Blocks until the engine has no pending read or write of ``arr`` (always one engine
    round trip)."""
    mx.base.check_call(mx.base._LIB.MXNDArrayWaitToWrite(arr.handle))


class MXHandle:
    """A running collective on NDArrays; :meth:`synchronize` waits and returns the output."""

    def __init__(
        self, handle: _api.Handle, out: NDArray, finish: Optional[Callable[[], None]] = None
    ) -> None:
        self._handle = handle
        self._out = out
        self._finish = finish
        self._done = False
        self.name = handle.name

    def poll(self) -> bool:
        """True once the result is in (``synchronize`` will not block)."""
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


def _start(
    tensor: NDArray,
    out: NDArray,
    name: str,
    priority: int,
    scale: float,
    zero_input: bool = False,
    out_wait: str = "write",
) -> MXHandle:
    """Starts sum-times-``scale`` of ``tensor`` over all workers into ``out``.

    ``zero_input`` contributes zeros instead of ``tensor`` (broadcast from another rank).
    ``out_wait`` says what to wait for before the core writes ``out``: ``"write"`` every
    pending engine read and write of it (safe for any array), ``"read"`` pending writes
    only (enough where every reader is ordered before the last writer, like gradients
    written by backward), ``"none"`` nothing (a new array).
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

    if zero_input:
        src, src_m = dst, dst_m
        if out_wait == "write":
            _wait_to_write(dst)
        dst[:] = 0  # an engine write, waited for below
        out_wait = "read"
    elif not src_m.host:
        src = tensor.copyto(mx.cpu())
        src_m = _Meta(src, name)
    else:
        src = tensor
    # Inputs: every pending write must have landed before the core reads them.
    if src is not dst:
        _wait_to_read(src)
    if out_wait == "write":
        _wait_to_write(dst)
    elif out_wait == "read":
        _wait_to_read(dst)
    handle = _api.push_pull_raw(
        src_m.raw(), dst_m.raw(), name, priority, scale, out=out, keep=(src, dst)
    )
    return MXHandle(handle, out, finish)


def _scale(average: bool, prescale_factor: float, postscale_factor: float) -> float:
    factor = float(prescale_factor) * float(postscale_factor)
    if average:
        factor /= _api.size()
    return factor


def push_pull_async(
    tensor: NDArray,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> MXHandle:
    """Starts averaging (or summing) ``tensor`` over all workers into a new NDArray."""
    name = name or _api.auto_name("allreduce")
    _check(tensor, f"tensor '{name}'")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    return _start(
        tensor,
        out,
        name,
        priority,
        _scale(average, prescale_factor, postscale_factor),
        out_wait="none",
    )


def push_pull_async_(
    tensor: NDArray,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> MXHandle:
    """Starts averaging (or summing) ``tensor`` over all workers in place."""
    name = name or _api.auto_name("allreduce")
    return _start(
        tensor, tensor, name, priority, _scale(average, prescale_factor, postscale_factor)
    )


def push_pull(
    tensor: NDArray,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> NDArray:
    """The average (or sum) of ``tensor`` over all workers, as a new NDArray.

    Integer averages are truncated toward zero; bool tensors are OR-ed.
    """
    return push_pull_async(
        tensor, average, name, priority, prescale_factor, postscale_factor
    ).synchronize()


def push_pull_(
    tensor: NDArray,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> NDArray:
    """Averages (or sums) ``tensor`` over all workers in place and returns it."""
    return push_pull_async_(
        tensor, average, name, priority, prescale_factor, postscale_factor
    ).synchronize()


# Horovod's names for the same operations.
allreduce = push_pull
allreduce_ = push_pull_
allreduce_async = push_pull_async
allreduce_async_ = push_pull_async_


def grouped_allreduce(
    tensors: Sequence[NDArray],
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[NDArray]:
    """Allreduces several tensors at once (all in flight together); new NDArrays."""
    base = name or _api.auto_name("grouped_allreduce")
    with _api.submission_batch():
        handles = [
            push_pull_async(t, average, f"{base}.{i}", priority, prescale_factor, postscale_factor)
            for i, t in enumerate(tensors)
        ]
    return [h.synchronize() for h in handles]


def grouped_allreduce_(
    tensors: Sequence[NDArray],
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[NDArray]:
    """In-place :func:`grouped_allreduce`."""
    base = name or _api.auto_name("grouped_allreduce")
    with _api.submission_batch():
        handles = [
            push_pull_async_(t, average, f"{base}.{i}", priority, prescale_factor, postscale_factor)
            for i, t in enumerate(tensors)
        ]
    return [h.synchronize() for h in handles]


def _check_root(root_rank: int) -> None:
    n = _api.size()
    if not 0 <= int(root_rank) < n:
        raise FastPSError(f"broadcast root_rank {root_rank} is not a rank of this job (size {n})")


def broadcast_async(
    tensor: NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0
) -> MXHandle:
    """Starts copying ``root_rank``'s ``tensor`` to every worker, into a new NDArray."""
    _check_root(root_rank)
    name = name or _api.auto_name("broadcast")
    _check(tensor, f"tensor '{name}'")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    return _start(
        tensor, out, name, priority, 1.0, zero_input=_api.rank() != root_rank, out_wait="none"
    )


def broadcast_async_(
    tensor: NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0
) -> MXHandle:
    """Starts overwriting ``tensor`` with ``root_rank``'s value, in place."""
    _check_root(root_rank)
    name = name or _api.auto_name("broadcast")
    return _start(tensor, tensor, name, priority, 1.0, zero_input=_api.rank() != root_rank)


def broadcast(
    tensor: NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0
) -> NDArray:
    """``root_rank``'s ``tensor`` on every worker, as a new NDArray."""
    return broadcast_async(tensor, root_rank, name, priority).synchronize()


def broadcast_(
    tensor: NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0
) -> NDArray:
    """Overwrites ``tensor`` with ``root_rank``'s value on every worker and returns it."""
    return broadcast_async_(tensor, root_rank, name, priority).synchronize()


def synchronize(handle: MXHandle) -> NDArray:
    """Waits for an async collective and returns its output."""
    return handle.synchronize()


def poll(handle: MXHandle) -> bool:
    """True once an async collective has finished."""
    return handle.poll()


def check_same_everywhere(
    entries: Sequence[str], labels: Sequence[str], what: str, name: str
) -> None:
    """Raises the same FastPSError on every worker unless all hold equal ``entries``.

    ``entries`` describe what must match (e.g. ``float32[16, 10]`` per parameter);
    ``labels`` name them for the message (may be empty strings). One small collective
    (the descriptions, a few bytes each), so a worker with different or extra tensors
    fails at once instead of waiting on a tensor the others never send.
    """
    n = _api.size()
    if n == 1:
        return
    r = _api.rank()
    text = "\n".join(f"{e}\t{lab}" for e, lab in zip(entries, labels)).encode()
    lengths = np.zeros(n, dtype=np.int64)
    lengths[r] = len(text)
    lengths = _api.push_pull(lengths, average=False, name=f"{name}.lengths")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    blob = np.zeros(int(offsets[-1]), dtype=np.uint8)
    blob[offsets[r] : offsets[r + 1]] = np.frombuffer(text, dtype=np.uint8)
    _api.push_pull(blob, average=False, name=f"{name}.data", out=blob)
    lists = []
    for q in range(n):
        raw = blob[offsets[q] : offsets[q + 1]].tobytes().decode()
        lists.append([tuple(line.split("\t", 1)) for line in raw.split("\n")] if raw else [])
    ref = [e for e, _ in lists[0]]
    for q in range(1, n):
        theirs = [e for e, _ in lists[q]]
        if theirs == ref:
            continue
        parts = [
            f"{what} differ between workers: rank 0 has {len(ref)}, rank {q} has {len(theirs)}"
        ]
        for i in range(max(len(ref), len(theirs))):
            a = " ".join(reversed(lists[0][i])).strip() if i < len(ref) else "nothing"
            b = " ".join(reversed(lists[q][i])).strip() if i < len(theirs) else "nothing"
            if i >= len(ref) or i >= len(theirs) or ref[i] != theirs[i]:
                parts.append(f"first difference at #{i}: rank 0 has {a}, rank {q} has {b}")
                break
        raise FastPSError("; ".join(parts))
