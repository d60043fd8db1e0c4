"""fastps for Keras 3 (TensorFlow backend): ``horovod.tensorflow.keras``'s names.

import fastps.tensorflow.keras as hvd
hvd.init()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size())),
              loss=..., metrics=[...])
model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                           hvd.callbacks.MetricAverageCallback()])
"""

from __future__ import annotations

from fastps.tensorflow import (
    Adasum,
    Average,
    Compression,
    FastPSAbort,
    FastPSError,
    FastPSTimeoutError,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    init,
    is_initialized,
    local_rank,
    local_size,
    push_pull,
    rank,
    shutdown,
    size,
)
from fastps.tensorflow.algorithms import DiLoCo, LocalSGD, OneBitAdam
from fastps.tensorflow.keras import callbacks, elastic
from fastps.tensorflow.optimizer import DistributedOptimizer, PartialDistributedOptimizer

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "barrier",
    "Average",
    "Sum",
    "Adasum",
    "Compression",
    "push_pull",
    "allreduce",
    "allgather",
    "broadcast",
    "broadcast_variables",
    "broadcast_object",
    "allgather_object",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "OneBitAdam",
    "LocalSGD",
    "DiLoCo",
    "callbacks",
    "elastic",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
]
