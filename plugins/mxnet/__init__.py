"""fastps for MXNet, with the names of ``horovod.mxnet``.

    import fastps.mxnet as hvd

    hvd.init()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)

or, for scripts written for MXNet's parameter server, ``mx.kv.create('fastps')`` in place
of ``mx.kv.create('dist_sync')`` (importing this package registers the store).

Launch with ``fastpsrun -np N python train.py``. Nothing here is compiled against MXNet:
arrays reach the C++ core by address, so any MXNet 1.x with the ctypes API works.
"""

from __future__ import annotations

try:
    import mxnet as _mx  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"fastps.mxnet needs MXNet (pip install 'mxnet>=1.6' 'numpy<1.24'): {_exc}"
    ) from _exc

import pickle
from typing import Any, Optional

import numpy as np
from fastps import FastPSAbort, FastPSError, FastPSTimeoutError
from fastps import api as _api
from fastps.api import (
    barrier,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    num_servers,
    rank,
    shutdown,
    size,
)

from .compression import Compression
from .kvstore import FastPS as KVStore
from .ops import (
    MXHandle,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    poll,
    push_pull,
    push_pull_,
    push_pull_async,
    push_pull_async_,
    synchronize,
)
from .training import DistributedOptimizer, DistributedTrainer, broadcast_parameters

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "num_servers",
    "barrier",
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
    "allgather",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_parameters",
    "synchronize",
    "poll",
    "MXHandle",
    "DistributedOptimizer",
    "DistributedTrainer",
    "Compression",
    "KVStore",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
]


def allgather(
    tensor: _mx.nd.NDArray, name: Optional[str] = None, priority: int = 0
) -> _mx.nd.NDArray:
    """Concatenates every worker's ``tensor`` along the first axis, in rank order.

    First dimensions may differ between workers; the others must match. Built on the
    summing core: each worker places its rows in a zero buffer of the full size.
    """
    if len(tensor.shape) == 0:
        raise FastPSError("allgather needs a tensor with at least one dimension")
    name = name or _api.auto_name("allgather")
    rows = np.zeros(_api.size(), dtype=np.int64)
    rows[_api.rank()] = tensor.shape[0]
    rows = _api.push_pull(rows, average=False, name=f"{name}.rows", priority=priority)
    start = int(rows[: _api.rank()].sum())
    total = int(rows.sum())
    # Assembled in numpy: MXNet's slice assignment does not take every dtype (bool).
    mine = tensor.asnumpy()
    gathered = np.zeros((total, *mine.shape[1:]), dtype=mine.dtype)
    gathered[start : start + mine.shape[0]] = mine
    _api.push_pull(gathered, average=False, name=name, priority=priority, out=gathered)
    return _mx.nd.array(gathered, ctx=tensor.context, dtype=gathered.dtype)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """``root_rank``'s ``obj`` on every worker (any picklable Python object)."""
    name = name or _api.auto_name("broadcast_object")
    if _api.rank() == root_rank:
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload = None
        length = np.zeros(1, dtype=np.int64)
    length = _api.broadcast(length, root_rank, name=f"{name}.length")
    if payload is None:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = _api.broadcast(payload, root_rank, name=f"{name}.data")
    return pickle.loads(data.tobytes())
