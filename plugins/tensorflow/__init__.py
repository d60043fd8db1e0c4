"""fastps for TensorFlow 2 (and Keras 3): Horovod's ``horovod.tensorflow`` names over fastps.

    import fastps.tensorflow as hvd
    hvd.init()
    ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

Everything works eagerly, inside ``tf.function`` and in TensorFlow 1 graphs
(``tf.compat.v1.Session``). TensorFlow is not linked into fastps: tensors reach the core as
numpy arrays, through ``tf.py_function`` inside graphs, so any TensorFlow 2 release that
has it works. See docs/guide/tensorflow.md.
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
from fastps.tensorflow import algorithms, elastic  # elastic: Horovod's hvd.elastic
from fastps.tensorflow._engine import MismatchError, UsageError
from fastps.tensorflow.algorithms import DiLoCo, LocalSGD, OneBitAdam
from fastps.tensorflow.basics import (
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
from fastps.tensorflow.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from fastps.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from fastps.tensorflow.ops import (
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
    allgather_object,
    allreduce,
    allreduce_async,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    global_process_set,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    poll,
    process_set_included_op,
    push_pull,
    push_pull_async,
    rank_op,
    reducescatter,
    remove_process_set,
    size_op,
    synchronize,
)
from fastps.tensorflow.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from fastps.tensorflow.sync_batch_norm import SyncBatchNormalization
from fastps.timeline.session import start_timeline, stop_timeline

__all__ = [
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
    "barrier",
    "join",
    "ReduceOp",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Compression",
    "Compressor",
    "NoneCompressor",
    "FP16Compressor",
    "Handle",
    "push_pull",
    "push_pull_async",
    "allreduce",
    "allreduce_async",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "synchronize",
    "poll",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "broadcast",
    "broadcast_async",
    "broadcast_",
    "broadcast_variables",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "SyncBatchNormalization",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "algorithms",
    "OneBitAdam",
    "LocalSGD",
    "DiLoCo",
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
    "start_timeline",
    "stop_timeline",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
    "MismatchError",
    "UsageError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]


# Horovod's build/feature queries: fastps.capabilities, except cuda_built (per framework).
def cuda_built() -> bool:
    """False: the TensorFlow plugin moves host memory only."""
    return False
