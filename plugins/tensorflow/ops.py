"""Collectives on TensorFlow tensors: push_pull (allreduce), allgather, broadcast.

Each function works eagerly and inside ``tf.function``. Eagerly it calls the core at once;
in a graph it adds ``tf.numpy_function`` ops (see :mod:`fastps.tensorflow._engine`) that
start the operation when the input is ready and wait for it where the result is used.

Naming: the same ``name`` must denote the same tensor on every worker. Unnamed calls get
``<op>.noname.<n>`` by call order when they run eagerly, and by trace order inside a
``tf.function`` (the name is then fixed into the graph, so every run reuses it).
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, List, Optional, Sequence, Type, Union

import numpy as np
import tensorflow as tf
from fastps import api as _api
from fastps.errors import FastPSError

from . import _engine as E
from .compression import Compression, Compressor

__all__ = [
    "Average",
    "Sum",
    "Adasum",
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
]

# Reduction operations (Horovod's values).
Average = 0
Sum = 1
Adasum = 2

TensorLike = Union[tf.Tensor, tf.Variable, np.ndarray, Any]


def _resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    if op is not None and average is not None:
        raise FastPSError("pass either op= or the older average=, not both")
    if op is None:
        return Average if average is None or average else Sum
    if op == Adasum:
        raise FastPSError("op=Adasum is not supported by fastps; use Average or Sum")
    if op not in (Average, Sum):
        raise FastPSError(f"unknown reduction op {op!r}; use fastps.tensorflow.Average or Sum")
    return int(op)


def _scale(op: int, prescale_factor: float, postscale_factor: float) -> float:
    scale = float(prescale_factor) * float(postscale_factor)
    if op == Average:
        scale /= _api.size()
    return scale


def _name(name: Optional[str], prefix: str) -> str:
    return name if name else _api.auto_name(prefix)


def _as_tensor(value: TensorLike) -> tf.Tensor:
    if isinstance(value, tf.Tensor):
        return value
    inner = getattr(value, "value", None)  # a Keras variable's backing tf.Variable
    if isinstance(inner, tf.Variable):
        return tf.convert_to_tensor(inner)
    return tf.convert_to_tensor(value)


class Handle:
    """A started operation: ``synchronize(handle)`` returns its result.

    Eagerly, ``op_id`` is a Python int; inside a graph it is the int64 output of the start op,
    and synchronize adds the op that waits for it.
    """

    def __init__(
        self,
        op_id: Any,
        dtype: tf.DType,
        shape: tf.TensorShape,
        name: str,
        post: Callable[[tf.Tensor], tf.Tensor],
    ) -> None:
        self.op_id = op_id
        self.dtype = dtype
        self.shape = shape
        self.name = name
        self._post = post
        self._result: Optional[tf.Tensor] = None

    @E.no_autograph
    def synchronize(self) -> tf.Tensor:
        if self._result is None:
            if isinstance(self.op_id, tf.Tensor) and not E.executing_eagerly():
                raw = E.finish_op(self.op_id, self.dtype, self.shape, self.name)
            else:
                raw = tf.convert_to_tensor(E.finish_numpy(int(self.op_id)))
            self._result = self._post(raw)
        return self._result

    @E.no_autograph
    def poll(self) -> Any:
        if self._result is not None:
            return True
        if isinstance(self.op_id, tf.Tensor) and not E.executing_eagerly():
            out = tf.numpy_function(E.poll_numpy, [self.op_id], tf.bool, stateful=True)
            out.set_shape([])
            return out
        return E.poll_numpy(int(self.op_id))


@E.no_autograph
def synchronize(handle: Handle) -> tf.Tensor:
    """Waits for an operation started by an ``*_async`` function and returns its result."""
    return handle.synchronize()


@E.no_autograph
def poll(handle: Handle) -> Any:
    """True once ``handle``'s operation has completed (a bool tensor inside a graph)."""
    return handle.poll()


@E.no_autograph
def start(
    tensor: tf.Tensor,
    name: str,
    *,
    priority: int = 0,
    scale: float = 1.0,
    root_rank: Optional[int] = None,
    post: Callable[[tf.Tensor], tf.Tensor] = lambda t: t,
) -> Handle:
    """Starts a push_pull or broadcast of an already compressed tensor (internal)."""
    E.check_dtype(tensor.dtype, f"tensor '{name}'")
    if E.executing_eagerly():
        arr = E.to_numpy(tensor, f"tensor '{name}'")
        hid: Any = E.start_numpy(arr, name, priority=priority, scale=scale, root_rank=root_rank)
    else:
        E.refuse_xla(f"fastps operation on tensor '{name}'")
        hid = E.start_op(tensor, name, priority=priority, scale=scale, root_rank=root_rank)
    return Handle(hid, tensor.dtype, tensor.shape, name, post)


@E.no_autograph
def push_pull_async(
    tensor: TensorLike,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    compression: Type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    priority: int = 0,
) -> Handle:
    """Starts summing or averaging ``tensor`` over all workers; see :func:`push_pull`."""
    op = _resolve_op(op, average)
    name = _name(name, "push_pull")
    value = _as_tensor(tensor)
    E.check_dtype(value.dtype, f"tensor '{name}'")
    compressed, ctx = compression.compress(value)
    return start(
        compressed,
        name,
        priority=priority,
        scale=_scale(op, prescale_factor, postscale_factor),
        post=lambda t: compression.decompress(t, ctx),
    )


allreduce_async = push_pull_async


@E.no_autograph
def push_pull(
    tensor: TensorLike,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    compression: Type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    priority: int = 0,
) -> Any:
    """Sums (``op=Sum``) or averages (``op=Average``, the default) ``tensor`` over all workers.

    The result is ``postscale * reduce(prescale * tensor)``; integer averages are truncated
    toward zero and booleans are combined with logical OR. ``tf.IndexedSlices`` (sparse
    gradients) are gathered rather than summed: the result holds every worker's slices
    (values divided by the number of workers for Average). Differentiable: the gradient of
    a push_pull is the same push_pull of the incoming gradient.
    """
    op = _resolve_op(op, average)
    name = _name(name, "push_pull")
    if isinstance(tensor, tf.IndexedSlices):
        return _push_pull_sparse(tensor, op, name, prescale_factor * postscale_factor)
    value = _as_tensor(tensor)
    E.check_dtype(value.dtype, f"tensor '{name}'")
    scale = _scale(op, prescale_factor, postscale_factor)

    def run(x: tf.Tensor, tag: str) -> tf.Tensor:
        compressed, ctx = compression.compress(x)
        return start(
            compressed,
            tag,
            priority=priority,
            scale=scale,
            post=lambda t: compression.decompress(t, ctx),
        ).synchronize()

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            return run(tf.convert_to_tensor(dy), f"{name}.grad")

        return run(x, name), grad

    return differentiable(value)


allreduce = push_pull


def _push_pull_sparse(slices: tf.IndexedSlices, op: int, name: str, factor: float) -> Any:
    values = allgather(slices.values, name=f"{name}.values")
    indices = allgather(slices.indices, name=f"{name}.indices")
    if op == Average:
        factor = factor / _api.size()
    if factor != 1.0:
        values = values * tf.cast(factor, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@E.no_autograph
def allgather(tensor: TensorLike, name: Optional[str] = None) -> tf.Tensor:
    """Concatenates every worker's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between workers, the others must match. A scalar is
    gathered as a vector of one element per worker. Differentiable for floating tensors:
    each worker gets the sum of the gradients for its own slice.
    """
    name = _name(name, "allgather")
    value = _as_tensor(tensor)
    E.check_dtype(value.dtype, f"tensor '{name}'")

    def run(x: tf.Tensor, tag: str) -> tf.Tensor:
        if E.executing_eagerly():
            return tf.convert_to_tensor(E.allgather_numpy(E.to_numpy(x, tag), tag))
        E.refuse_xla(f"allgather of tensor '{tag}'")
        shape = tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else [None]
        return E.call_op(lambda a: E.allgather_numpy(a, tag), [x], x.dtype, shape, tag)

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            total = push_pull(dy, op=Sum, name=f"{name}.grad")
            rows = tf.shape(x)[:1] if x.shape.rank else tf.constant([1])
            counts = run(tf.cast(rows, tf.int64), f"{name}.grad.rows")
            offset = tf.reduce_sum(counts[: _api.rank()])
            mine = total[offset : offset + tf.cast(rows[0], tf.int64)]
            return tf.reshape(mine, tf.shape(x))

        return run(x, name), grad

    return differentiable(value)


@E.no_autograph
def broadcast(tensor: TensorLike, root_rank: int, name: Optional[str] = None) -> tf.Tensor:
    """``root_rank``'s ``tensor`` on every worker (same shape and dtype everywhere).

    Differentiable for floating tensors: the root gets the sum of all workers' gradients,
    the others zero.
    """
    name = _name(name, "broadcast")
    value = _as_tensor(tensor)
    E.check_dtype(value.dtype, f"tensor '{name}'")

    def run(x: tf.Tensor, tag: str) -> tf.Tensor:
        return start(x, tag, root_rank=root_rank).synchronize()

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            total = push_pull(dy, op=Sum, name=f"{name}.grad")
            return total if _api.rank() == root_rank else tf.zeros_like(total)

        return run(x, name), grad

    return differentiable(value)


def _variable_of(v: Any) -> Any:
    """The tf.Variable behind a Keras variable (or ``v`` itself)."""
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


@E.no_autograph
def broadcast_variables(
    variables: Sequence[Any], root_rank: int, name: Optional[str] = None
) -> Optional[tf.Operation]:
    """Sets every variable to its value on ``root_rank`` (tf.Variable or Keras variables).

    All workers must pass the same list (same order, shapes and dtypes); if they do not,
    every worker raises an error naming the first difference instead of waiting. Returns
    None eagerly and the grouped assign op inside a graph.
    """
    variables = list(variables)
    prefix = name or "broadcast_variables"
    group = E.group_of(variables)
    what = f"the variables passed to broadcast_variables('{prefix}')"
    names = [f"{prefix}.{group.digest}.{i}" for i in range(len(variables))]
    for v, n in zip(variables, names):
        E.check_dtype(tf.as_dtype(v.dtype), f"variable '{n}'")
    if E.executing_eagerly():
        E.check_same_everywhere(f"bcast.{prefix}", group, what, cache=False)
        handles = [start(_as_tensor(v), n, root_rank=root_rank) for v, n in zip(variables, names)]
        for v, h in zip(variables, handles):
            _variable_of(v).assign(h.synchronize())
        return None
    E.refuse_xla("broadcast_variables")
    check = E.check_op(f"bcast.{prefix}", group, what)
    deps = [check] if check is not None else []
    with tf.control_dependencies(deps):
        handles = [
            start(tf.identity(_as_tensor(v)), n, root_rank=root_rank)
            for v, n in zip(variables, names)
        ]
    assigns = [_variable_of(v).assign(h.synchronize()) for v, h in zip(variables, handles)]
    return tf.group(*assigns)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """``root_rank``'s Python object (pickled) on every worker. Eager only."""
    name = name or "broadcast_object"
    mine = _api.rank() == root_rank
    data = pickle.dumps(obj) if mine else None
    payload = E.broadcast_bytes(data, root_rank, name)
    return obj if mine else pickle.loads(payload)


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Every worker's Python object (pickled), in rank order. Eager only."""
    name = name or "allgather_object"
    return [pickle.loads(b) for b in E.allgather_bytes(pickle.dumps(obj), name)]
