"""``fastps.torch.ddp_comm_hook``: DDP's gradient buckets through fastps, with compression.

DDP reduces its gradients bucket by bucket; a communication hook decides how. This hook
averages each bucket on fastps's gradient path (the same as ``DistributedOptimizer``'s:
straight to the core, priorities, quorum rounds when configured), compressed with any fastps
compression::

    model = DDP(model)
    model.register_comm_hook(None, hvd.ddp_comm_hook(compression=hvd.Compression.fp16))
    # Lightning: DDPStrategy(ddp_comm_hook=hvd.ddp_comm_hook(...))

It works whatever backend the process group runs on (gloo included): the buckets travel over
fastps, DDP's other traffic (the initial broadcast, shape checks) over the group. Under
torchrun fastps joins through the same store (``fastps.init()`` is called when needed).

Names and priorities: bucket ``i`` of ``n`` bytes is ``ddp.bucket.<i>.<n>`` (DDP rebuilds its
buckets once, after the first iteration: the new sizes are new names); DDP numbers buckets in
the order backward fills them, so bucket i holds layers the next forward pass needs before
those of bucket i-1, and its priority is i (larger goes first).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional, Tuple

import torch
from torch.futures import Future

__all__ = ["ddp_comm_hook"]

Hook = Callable[[Any, Any], Future]


class _Completer:
    """Fulfils the buckets' futures in submission order on one thread (the buckets of a
    backward pass complete in about that order; the hook never blocks DDP's thread)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Tuple[Any, torch.Tensor, Future]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def put(self, handle: Any, result: torch.Tensor, fut: Future) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="fastps-ddp-hook", daemon=True
                )
                self._thread.start()
        self._queue.put((handle, result, fut))

    def _run(self) -> None:
        while True:
            handle, result, fut = self._queue.get()
            try:
                handle.synchronize()
            except BaseException as exc:  # noqa: BLE001 - DDP raises it from backward
                fut.set_exception(exc)
            else:
                fut.set_result(result)


def ddp_comm_hook(
    compression: Any = None,
    name_prefix: str = "ddp.bucket",
    quorum: bool = True,
) -> Hook:
    """A DDP communication hook (``model.register_comm_hook(None, hook)``) that averages
    each gradient bucket over fastps. ``compression``: any ``fastps.torch.Compression``
    (``fp16``, ``bf16``, the core's ``onebit``/``topk``/... with error feedback; default
    none). ``quorum``: the bucket is a gradient, so its round may close with
    ``FASTPS_ROUND_QUORUM`` pushes (docs/guide/async.md)."""
    from fastps.torch import basics
    from fastps.torch.ops import Average, _allreduce_start

    completer = _Completer()

    def hook(state: Any, bucket: Any) -> Future:
        if not basics.is_initialized():
            basics.init()  # under torchrun: joins through torch's store
        tensor = bucket.buffer()
        index = int(bucket.index())
        name = f"{name_prefix}.{index}.{tensor.numel() * tensor.element_size()}"
        handle = _allreduce_start(tensor, True, name, Average, 1.0, 1.0, compression, index, quorum)
        # A CUDA bucket is copied back on fastps's side stream, which the completer's
        # stream waits for; a future that names the device records that wait, so DDP's
        # stream in turn waits before it reads the bucket.
        fut: Future = Future(devices=[tensor.device]) if tensor.is_cuda else Future()
        completer.put(handle, tensor, fut)
        return fut

    # DDP checks the annotations (as objects, not this module's postponed strings).
    import torch.distributed as dist

    hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    hook.__name__ = "fastps_ddp_comm_hook"
    hook.__qualname__ = "fastps_ddp_comm_hook"
    return hook
