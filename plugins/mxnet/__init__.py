"""fastps for MXNet, with the API of ``horovod.mxnet``: ``import fastps.mxnet as hvd``.

    import fastps.mxnet as hvd

    hvd.init()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)

or, for scripts written for MXNet's parameter server, ``mx.kv.create('fastps')`` in place
of ``mx.kv.create('dist_sync')`` (importing this package registers the store).

Training algorithms (``fastps.mxnet.algorithms``: 1-bit Adam, local SGD, DiLoCo) run in
the trainer: ``hvd.DistributedTrainer(params, "onebitadam", {...})`` or
``hvd.DistributedTrainer(params, "adam", {...}, algorithm=hvd.DiLoCo(H=8))``.

Every collective is the framework-neutral one of ``fastps.collectives``; this package only
adapts NDArrays (``ops.py``). Launch with ``fastpsrun -np N python train.py``. Nothing here
is compiled against MXNet: arrays reach the core by address, so any MXNet 1.x with the
ctypes API works.
"""

from __future__ import annotations

try:
    import mxnet as _mx  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"fastps.mxnet needs MXNet (pip install 'mxnet>=1.6' 'numpy<1.24'): {_exc}"
    ) from _exc

from typing import Any, List, Optional

from fastps import FastPSAbort, FastPSError, FastPSTimeoutError
from fastps.collectives import ops as _collectives
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
from fastps.errors import HorovodInternalError, HostsUpdatedInterrupt
from fastps.mxnet import algorithms, elastic
from fastps.mxnet.algorithms import DiLoCo, LocalSGD, OneBitAdam
from fastps.mxnet.basics import (
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
from fastps.mxnet.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from fastps.mxnet.kvstore import FastPS as KVStore
from fastps.mxnet.ops import (
    Adasum,
    Average,
    Max,
    Min,
    MXHandle,
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
    synchronize,
)
from fastps.mxnet.training import DistributedOptimizer, DistributedTrainer, broadcast_parameters
from fastps.timeline.session import start_timeline, stop_timeline

__all__ = [
    "algorithms",
    "OneBitAdam",
    "LocalSGD",
    "DiLoCo",
    "elastic",
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
    "broadcast_object",
    "allgather_object",
    "broadcast_parameters",
    "synchronize",
    "poll",
    "MXHandle",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "ReduceOp",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "DistributedOptimizer",
    "DistributedTrainer",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "KVStore",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
    "start_timeline",
    "stop_timeline",
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


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """``root_rank``'s ``obj`` on every member (any picklable Python object)."""
    return _collectives.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Every member's ``obj``, in rank order."""
    return _collectives.allgather_object(obj, name, process_set)


# Horovod's build/feature queries: fastps.capabilities, except cuda_built (per framework).
def cuda_built() -> bool:
    """False: nothing in fastps is compiled against CUDA. (GPU NDArrays still work: they
    are staged through host memory.)"""
    return False
