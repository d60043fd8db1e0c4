"""Moving tensors between torch memory and the core.

The core reads and writes host memory only. CPU tensors are handed over as they are (their
``data_ptr``); nothing is copied. CUDA tensors travel through page-locked (pinned) host
buffers:

1. on a side stream that first waits for the stream that produced the tensor, the tensor is
   copied into a pinned buffer without blocking the caller, and an event marks the end of
   that copy;
2. a background thread waits for the event and only then hands the pinned buffer to the
   core, so neither the caller nor the autograd engine ever blocks on the device;
3. when the caller synchronizes, the result is copied back to the device on the side
   stream, and the caller's current stream is made to wait for that copy. The host never
   waits for the copy back; kernels queued afterwards on the current stream see the result.

Pinned buffers are pooled by size class and reused once the copy that last used them has
finished. Other devices (MPS, XPU, ...) are staged through ordinary host tensors with
blocking copies.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Tuple

import torch
from fastps.errors import FastPSError
from fastps.worker import waitable as _waitable
from fastps.worker.api import Handle as CoreHandle
from fastps.worker.api import push_pull_raw
from fastps.worker.buffers import RawBuffer

__all__ = ["Waitable", "submit", "raw"]


def raw(t: torch.Tensor, dtype: str) -> RawBuffer:
    """The core's view of a contiguous host tensor; the tensor stays referenced."""
    return RawBuffer(t.data_ptr(), t.numel() * t.element_size(), dtype, tuple(t.shape), t)


class Waitable(_waitable.Waitable, ABC):
    """Anything a torch handle waits on (the core's protocol, core/worker/waitable.py):
    ``poll()``, ``synchronize(timeout)`` and ``wait``."""

    @abstractmethod
    def poll(self) -> bool:
        """Implemented by each kind of handle."""

    @abstractmethod
    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Implemented by each kind of handle."""

    def wait(self, timeout: Optional[float] = None) -> None:
        self.synchronize(timeout)


class _CoreOp(Waitable):
    """A push_pull the core runs straight on the tensors' memory."""

    def __init__(self, handle: CoreHandle) -> None:
        self._handle = handle

    def poll(self) -> bool:
        return self._handle.poll()

    def synchronize(self, timeout: Optional[float] = None) -> None:
        self._handle.synchronize(timeout)


class _HostCopyOp(Waitable):
    """A device tensor staged through an ordinary host copy (devices without streams)."""

    def __init__(self, host: torch.Tensor, dst: torch.Tensor, handle: CoreHandle) -> None:
        self._host = host
        self._dst = dst
        self._handle = handle
        self._done = False

    def poll(self) -> bool:
        return self._done or self._handle.poll()

    def synchronize(self, timeout: Optional[float] = None) -> None:
        if self._done:
            return
        self._handle.synchronize(timeout)
        self._done = True
        with torch.no_grad():
            self._dst.copy_(self._host.view(self._dst.shape))


def submit(
    src: torch.Tensor,
    dst: torch.Tensor,
    dtype: str,
    name: str,
    priority: int,
    scale: float,
    compression: str = "",
    quorum: bool = False,
) -> Waitable:
    """Starts summing ``src`` over the workers into ``dst`` (both contiguous, same device,
    shape and dtype; they may be the same tensor), compressed by the core with the spec
    ``compression`` when given (docs/guide/compression.md). ``quorum``: a gradient's sum, a
    quorum round under FASTPS_ROUND_QUORUM (``fastps.api.push_pull_raw``)."""
    if src.device != dst.device:
        raise FastPSError(f"tensor '{name}': input on {src.device} but output on {dst.device}")
    kind = src.device.type
    if kind == "cpu":
        in_buf = raw(src, dtype)
        out_buf = in_buf if dst.data_ptr() == src.data_ptr() else raw(dst, dtype)
        return _CoreOp(
            push_pull_raw(
                in_buf,
                out_buf,
                name,
                priority,
                scale,
                out=dst,
                compression=compression,
                quorum=quorum,
            )
        )
    if kind == "cuda" and not compression:
        return _cuda_stager().submit(src, dst, dtype, name, priority, scale, quorum)
    host = src.detach().to("cpu").contiguous()
    if host.data_ptr() == src.data_ptr():  # pragma: no cover - a device sharing host memory
        host = host.clone()
    buf = raw(host, dtype)
    return _HostCopyOp(
        host,
        dst,
        push_pull_raw(
            buf, buf, name, priority, scale, out=host, compression=compression, quorum=quorum
        ),
    )


# --------------------------------------------------------------------------- CUDA staging

_MIN_BUCKET = 4096


def _bucket(nbytes: int) -> int:
    """Size class of a pinned buffer: the next power of two, at least one page."""
    size = _MIN_BUCKET
    while size < nbytes:
        size *= 2
    return size


class _StagedOp(Waitable):
    """One CUDA tensor on its way through a pinned host buffer."""

    def __init__(
        self,
        stager: _CudaStager,
        block: torch.Tensor,
        src: torch.Tensor,
        dst: torch.Tensor,
        host: torch.Tensor,
        dtype: str,
        name: str,
        priority: int,
        scale: float,
        stream: Any,
        ready: Any,
        quorum: bool = False,
    ) -> None:
        self.stager = stager
        self.quorum = quorum
        self.block = block  # the pooled pinned buffer that ``host`` is a view of
        self.src = src
        self.dst = dst
        self.host = host  # pinned, exactly nbytes long, dtype of the tensor
        self.dtype = dtype
        self.name = name
        self.priority = priority
        self.scale = scale
        self.stream = stream
        self.ready = ready  # event: device -> host copy finished
        self.started = threading.Event()  # set by the stager thread
        self.core: Optional[CoreHandle] = None
        self.error: Optional[BaseException] = None
        self.finished = False

    def poll(self) -> bool:
        if self.finished:
            return True
        if not self.started.is_set():
            return False
        if self.error is not None or self.core is None:
            return True
        return self.core.poll()

    def synchronize(self, timeout: Optional[float] = None) -> None:
        if self.finished:
            return
        if not self.started.wait(timeout):
            raise FastPSError(
                f"tensor '{self.name}': the copy to host memory did not finish within {timeout}s"
            )
        self.finished = True
        try:
            if self.error is not None:
                raise self.error
            assert self.core is not None
            self.core.synchronize(timeout)
            self.stager.copy_back(self)
        finally:
            self.src = self.host = self.dst = None  # type: ignore[assignment]


class _CudaStager:
    """Side streams, the pinned buffer pool and the thread that feeds the core."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: Dict[int, Any] = {}
        # size class -> buffers not in use, each with the event of its last copy (or None)
        self._free: Dict[int, List[Tuple[torch.Tensor, Any]]] = {}
        self._queue: queue.Queue[Optional[_StagedOp]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fastps-cuda-stager", daemon=True)
        self._thread.start()

    def _stream(self, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = torch.cuda.Stream(device=index)
                self._streams[index] = stream
        return stream

    def _acquire(self, nbytes: int) -> torch.Tensor:
        size = _bucket(nbytes)
        with self._lock:
            free = self._free.get(size)
            entry = free.pop() if free else None
        if entry is None:
            return torch.empty(size, dtype=torch.uint8, pin_memory=True)
        buf, last_copy = entry
        if last_copy is not None:
            last_copy.synchronize()  # the device may still be reading the buffer
        return buf

    def _release(self, buf: torch.Tensor, last_copy: Any) -> None:
        with self._lock:
            self._free.setdefault(buf.numel(), []).append((buf, last_copy))

    def submit(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        dtype: str,
        name: str,
        priority: int,
        scale: float,
        quorum: bool = False,
    ) -> _StagedOp:
        nbytes = src.numel() * src.element_size()
        block = self._acquire(nbytes)
        host = block[:nbytes].view(src.dtype)
        stream = self._stream(src.device)
        producer = torch.cuda.current_stream(src.device)
        ready = torch.cuda.Event()
        with torch.cuda.stream(stream):
            # Everything queued so far on the producing stream (the gradient's kernels)
            # comes before the copy.
            stream.wait_stream(producer)
            host.copy_(src.detach().reshape(-1), non_blocking=True)
            ready.record(stream)
        # The caching allocator must not hand src's memory to others before the copy ran.
        src.record_stream(stream)
        op = _StagedOp(
            self, block, src, dst, host, dtype, name, priority, scale, stream, ready, quorum
        )
        self._queue.put(op)
        return op

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            try:
                op.ready.synchronize()  # releases the GIL while it waits
                buf = raw(op.host, op.dtype)
                op.core = push_pull_raw(
                    buf, buf, op.name, op.priority, op.scale, out=op.host, quorum=op.quorum
                )
            except BaseException as exc:  # noqa: BLE001 - handed to whoever synchronizes
                op.error = exc
            finally:
                op.started.set()

    def copy_back(self, op: _StagedOp) -> None:
        dst = op.dst
        consumer = torch.cuda.current_stream(dst.device)
        done = torch.cuda.Event()
        with torch.cuda.stream(op.stream):
            # Work queued on the consumer stream before this point may still use dst.
            op.stream.wait_stream(consumer)
            dst.detach().view(-1).copy_(op.host, non_blocking=True)
            done.record(op.stream)
        consumer.wait_event(done)
        dst.record_stream(op.stream)
        self._release(op.block, done)


_stager: Optional[_CudaStager] = None
_stager_lock = threading.Lock()


def _cuda_stager() -> _CudaStager:
    global _stager
    with _stager_lock:
        if _stager is None:
            _stager = _CudaStager()
        return _stager
