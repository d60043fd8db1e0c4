"""fastps for PyTorch, with Horovod's API: ``import fastps.torch as hvd``.

::

    import fastps.torch as hvd
    hvd.init()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for data, target in loader:  # this rank's shard
        optimizer.zero_grad()
        loss_fn(model(data), target).backward()  # gradients travel while backward runs
        optimizer.step()                          # waits for the averaged gradients

Launch with ``fastpsrun -np N python train.py``. Nothing here is compiled against torch:
tensors reach the C++ core as raw host addresses (CPU tensors without a copy; CUDA tensors
through pinned buffers on a side stream), so any torch version >= 2.1 works.
"""

from __future__ import annotations

from fastps.collectives.capabilities import (
    ccl_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from fastps.errors import (
    FastPSAbort,
    FastPSError,
    FastPSTimeoutError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
)
from fastps.timeline.session import start_timeline, stop_timeline
from fastps.torch import elastic
from fastps.torch.basics import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    num_servers,
    rank,
    shutdown,
    size,
)
from fastps.torch.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from fastps.torch.ddp_comm_hook import ddp_comm_hook
from fastps.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from fastps.torch.ops import (
    SUPPORTED_DTYPES,
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    ProcessSet,
    Product,
    ReduceOp,
    Sum,
    add_process_set,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    global_process_set,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    push_pull,
    push_pull_,
    push_pull_async,
    push_pull_async_,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    sparse_allreduce_async,
    synchronize,
)
from fastps.torch.optimizer import DistributedOptimizer
from fastps.torch.sync_batch_norm import SyncBatchNorm


def _register_backend() -> None:
    """init_process_group("fastps") works after `import fastps.torch` even where torch's
    entry-point autoload is off (TORCH_DEVICE_BACKEND_AUTOLOAD=0); torch builds without
    torch.distributed keep Horovod's API."""
    import torch.distributed as dist

    if dist.is_available():
        from fastps.torch.process_group import register

        register()


_register_backend()


def _register_lightning() -> None:
    """Trainer(strategy="fastps") resolves when lightning was imported before fastps.torch
    (importing it here would cost seconds); otherwise `import fastps.torch.lightning` does
    it. Never breaks `import fastps.torch`."""
    import sys

    if "lightning.pytorch" not in sys.modules:
        return
    try:
        import fastps.torch.lightning  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken lightning must not break fastps
        import warnings

        warnings.warn(f"fastps: the Lightning strategy was not registered: {exc}", stacklevel=2)


_register_lightning()

__all__ = [
    "ddp_comm_hook",
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "is_homogeneous",
    "num_servers",
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
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "ProcessSet",
    "add_process_set",
    "remove_process_set",
    "SyncBatchNorm",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "elastic",
    "start_timeline",
    "stop_timeline",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "poll",
    "synchronize",
    "join",
    "barrier",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "DistributedOptimizer",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "ReduceOp",
    "global_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Handle",
    "SUPPORTED_DTYPES",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
]


# Horovod's build/feature queries: fastps.capabilities, except cuda_built (per framework).
def cuda_built() -> bool:
    """True: CUDA tensors are supported (staged through host memory) wherever torch has
    CUDA; nothing in fastps is compiled against CUDA."""
    return True
