"""fastps for TensorFlow 2 (and Keras 3): Horovod's ``horovod.tensorflow`` names over fastps.

    import fastps.tensorflow as hvd
    hvd.init()
    ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

Everything works eagerly and inside ``tf.function`` (graph mode). TensorFlow is not linked
into fastps: tensors reach the core as numpy arrays, through ``tf.numpy_function`` inside
graphs, so any TensorFlow 2 release that has it works. See docs/tensorflow.md.
"""

from __future__ import annotations

from typing import Optional

import fastps as _fastps
from fastps import api as _api
from fastps.errors import FastPSAbort, FastPSError, FastPSTimeoutError

from .compression import Compression
from .gradient_tape import DistributedGradientTape
from .ops import (
    Adasum,
    Average,
    Handle,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    allreduce_async,
    broadcast,
    broadcast_object,
    broadcast_variables,
    poll,
    push_pull,
    push_pull_async,
    synchronize,
)
from .optimizer import DistributedOptimizer

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
    "barrier",
    "Average",
    "Sum",
    "Adasum",
    "Compression",
    "Handle",
    "push_pull",
    "push_pull_async",
    "allreduce",
    "allreduce_async",
    "synchronize",
    "poll",
    "allgather",
    "broadcast",
    "broadcast_variables",
    "broadcast_object",
    "allgather_object",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "FastPSError",
    "FastPSAbort",
    "FastPSTimeoutError",
]


def init(comm: Optional[object] = None) -> None:
    """Joins the job started by ``fastpsrun`` (or runs alone without it).

    ``comm`` is accepted for Horovod compatibility and must be None.
    """
    if comm is not None:
        raise FastPSError(
            "fastps.tensorflow.init() takes no communicator; fastpsrun sets up the job"
        )
    _fastps.init()


def shutdown() -> None:
    _fastps.shutdown()


def is_initialized() -> bool:
    return bool(_fastps.is_initialized())


def rank() -> int:
    return int(_fastps.rank())


def size() -> int:
    return int(_fastps.size())


def local_rank() -> int:
    return int(_fastps.local_rank())


def local_size() -> int:
    return int(_fastps.local_size())


def cross_rank() -> int:
    return int(_api.cross_rank())


def cross_size() -> int:
    return int(_api.cross_size())


def barrier() -> None:
    """Returns once every worker has called barrier()."""
    _fastps.barrier()
