"""Local SGD and DiLoCo for Keras optimizers, with the outer optimizer on the summation
servers (docs/guide/local-sgd.md); the torch version is ``fastps.torch.algorithms.LocalSGD``.

Every worker runs the wrapped (inner) optimizer on its own gradients for ``H`` steps with no
communication at all; then it pushes the change of its variables since the last outer step
(its delta) and receives, in the same exchange, the variables after the servers' outer step
(``fastps.worker.outer_mode``, shared by every plugin)::

    opt = hvd.DistributedOptimizer(keras.optimizers.AdamW(1e-3), algorithm=DiLoCo(H=8))
    model.compile(optimizer=opt, loss=...)

``LocalSGD``: the outer step is plain averaging (outer lr 1, no momentum). ``DiLoCo``
(Douillard et al. 2023): SGD with Nesterov momentum on the averaged delta (outer lr 0.7,
momentum 0.9). The inner optimizer's state stays on each worker.

``compression`` (a core compressor: ``fastps.Compression.fp16``, ``.onebit(error_feedback=
True)``, ...; also given as ``DistributedOptimizer(..., compression=c)``) sends the deltas
compressed; the servers decode them before the outer step and answer with the variables,
uncompressed.

The servers are started from rank 0's variables at the optimizer's first ``apply`` (Keras
makes the variables known then). The count of local steps is a variable and the outer step
a ``tf.cond`` around one ``tf.numpy_function``, so a traced step (``model.fit``) takes its
outer steps where they fall.
"""

from __future__ import annotations

import itertools
from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from fastps.errors import FastPSError
from fastps.tensorflow.algorithms.base import Algorithm, Context
from fastps.tensorflow.compression import Compression as _TFCompression
from fastps.worker import algorithm_args as _args
from fastps.worker import api as _api
from fastps.worker import outer_mode as _outer

__all__ = ["LocalSGD", "DiLoCo"]

_HOST_DTYPES = (tf.float32, tf.float64, tf.float16)
_built = itertools.count()  # build order (every rank builds in step), for the names


class LocalSGD(Algorithm):
    """``H`` local steps, then an outer step on the servers: the mean of the workers'
    deltas applied with outer learning rate ``outer_lr`` and (``momentum`` > 0) SGD
    momentum, Nesterov's if ``nesterov``. The defaults (1, 0) are plain model averaging.

    Every rank must take the same number of steps; :meth:`outer_step` syncs at once (e.g.
    before evaluating, when the step count is not a multiple of ``H``). ``compression``: a
    core compressor for the deltas (None: uncompressed)."""

    def __init__(
        self,
        H: int,
        outer_lr: float = 1.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        compression: Any = None,
    ) -> None:
        self.config = _args.local_sgd_config(type(self).__name__, H, outer_lr, momentum, nesterov)
        self.H = H
        self._exchange: Optional[_outer.OuterExchange] = None
        self.compression: Any = None
        if compression is not None:
            self.adopt_compression(compression)
        self._outer_steps = 0
        self._local: Optional[tf.Variable] = None  # optimizer steps since the last outer step
        self._variables: List[Any] = []
        self._names: List[str] = []
        self._anchors: List[np.ndarray] = []  # the variables at the last outer step

    def __repr__(self) -> str:
        return _args.local_sgd_repr(type(self).__name__, self.H, self.config, self.compression)

    def adopt_compression(self, compression: Any) -> None:
        """Takes ``DistributedOptimizer(..., compression=c)`` for the deltas (before
        setup); refuses a non-core compressor, or a second one naming both."""
        self.compression = _args.delta_compression(
            type(self).__name__,
            compression,
            self.compression,
            chosen=self._exchange is not None,
            fp16=_TFCompression.fp16,  # Horovod's spelling: the core's fp16
        )

    @property
    def local_steps(self) -> int:
        """Optimizer steps since the last outer step."""
        return 0 if self._local is None else int(self._local.numpy())

    @property
    def outer_steps(self) -> int:
        """Outer steps taken."""
        return self._outer_steps

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._exchange = _outer.OuterExchange(
            f"algorithm {self.name}", self.config, compression=self.compression
        )

    def build(self, variables: Sequence[Any]) -> None:
        for name, v in zip(self.ctx.names, variables):
            dtype = tf.as_dtype(v.dtype)
            if dtype not in _HOST_DTYPES:
                raise FastPSError(
                    f"local SGD parameter '{name}': dtype {dtype.name} is not supported "
                    "(float32, float64, float16)"
                )
        self._variables = list(variables)
        n = next(_built)
        prefix = "keras." if n == 0 else f"keras{n}."
        self._names = [prefix + name for name in self.ctx.names]
        self._local = tf.Variable(0, dtype=tf.int64, trainable=False, name="fastps_local_steps")
        self.reset_parameters()

    def exchange(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """Local steps: the gradients stay on this worker."""
        return list(grads)

    def after_step(self) -> None:
        local = self._ready()
        local.assign_add(1)
        if tf.executing_eagerly():
            if int(local.numpy()) >= self.H:
                self.outer_step()
            return
        tf.cond(local.read_value() >= self.H, self._outer_ops, lambda: tf.constant(False))

    def on_reset(self) -> None:
        """An elastic reset callback (``state.register_reset_callbacks([algo.on_reset])``):
        the state rolls back to the last commit, which the loop takes right after an outer
        step (``local_steps == 0``), so the local steps count from zero again. The new
        generation's servers are started at the next outer step (:meth:`outer_step`)."""
        if self._local is not None:
            self._local.assign(0)

    def reset_parameters(self) -> None:
        """Rank 0's variables become every worker's and the servers' (the outer optimizer
        starts afresh: no momentum). Called at the optimizer's first step; call it eagerly
        on every rank after changing the variables outside training (e.g. rank 0 loaded a
        checkpoint)."""
        ex = self._exchange
        local = self._ready()
        assert ex is not None
        arrays = [np.array(v.numpy(), copy=True) for v in self._variables]
        ex.init(list(zip(self._names, arrays)))
        for v, a in zip(self._variables, arrays):
            v.assign(a)
        self._anchors = [a.copy() for a in arrays]
        local.assign(0)

    def outer_step(self) -> None:
        """Pushes this worker's delta since the last outer step and loads the variables
        after the servers' outer step, eagerly (every rank must call it alike)."""
        local = self._ready()
        fresh = self._outer_arrays(*[v.numpy() for v in self._variables])
        for v, a in zip(self._variables, fresh):
            v.assign(a)
        local.assign(0)

    # ------------------------------------------------------------------ helpers

    def _ready(self) -> tf.Variable:
        if self._local is None or self._exchange is None:
            raise FastPSError(
                f"algorithm {self.name}: not set up (the DistributedOptimizer sets it up at "
                "its first step)"
            )
        return self._local

    def _outer_ops(self) -> tf.Tensor:
        """The outer step as ops: one numpy_function, then the variables take its answer."""
        local = self._ready()
        fresh = tf.numpy_function(
            self._outer_arrays,
            [tf.convert_to_tensor(v) for v in self._variables],
            [tf.as_dtype(v.dtype) for v in self._variables],
            stateful=True,
            name="fastps_outer_step",
        )
        if not isinstance(fresh, (list, tuple)):  # one output comes back bare
            fresh = [fresh]
        for v, value in zip(self._variables, fresh):
            v.assign(tf.reshape(value, tf.shape(v)))
        local.assign(0)
        return tf.constant(True)

    def _outer_arrays(self, *values: np.ndarray) -> List[np.ndarray]:
        """One outer round on host arrays: the variables after it."""
        ex = self._exchange
        assert ex is not None
        # Own, writable copies: TensorFlow may hand out read-only views of its tensors.
        hosts = [np.array(a, copy=True) for a in values]
        deltas = [h - a for h, a in zip(hosts, self._anchors)]
        if ex.session is not None and ex.session is not _api.session():
            # An elastic membership change brought new servers holding nothing: they
            # start from rank 0's anchor (the survivors' common last outer step), then
            # take this round's deltas; the outer momentum restarts from zero.
            ex.init([(n, a.copy()) for n, a in zip(self._names, self._anchors)])
        ex.step(list(zip(self._names, deltas, hosts)))
        for anchor, host in zip(self._anchors, hosts):
            anchor[...] = host
        self._outer_steps += 1
        return hosts


class DiLoCo(LocalSGD):
    """DiLoCo: ``H`` inner steps (typically AdamW), then SGD with Nesterov momentum on the
    averaged delta, run by the servers (outer lr 0.7, momentum 0.9 as in the paper)."""

    def __init__(
        self,
        H: int,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        compression: Any = None,
    ) -> None:
        super().__init__(
            H, outer_lr=outer_lr, momentum=momentum, nesterov=nesterov, compression=compression
        )
