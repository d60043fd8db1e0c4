"""Collectives on TensorFlow tensors with Horovod's names and semantics.

This module is an adapter: the algorithms, checks, names and process sets live in
``fastps.collectives`` (framework-neutral, on host arrays). Here a tensor becomes a host
array and back (:mod:`fastps.tensorflow._engine`), each op gets its gradient
(``tf.custom_gradient``, with Horovod's gradient definitions), and :class:`Handle` wraps
started work. Every function works eagerly and inside graphs: there it adds a start op
that starts the collective when the inputs are ready and a finish op where the result is
used (:mod:`fastps.tensorflow._graph`).

Names: a ``name`` must denote the same op on every rank; unnamed ops are numbered by the
layer per process set in the order they *run* (inside a graph: each time the graph runs).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, Union

import numpy as np
import tensorflow as tf
from fastps.collectives import ops as C
from fastps.collectives.ops import ProcessSet, ReduceOp, global_process_set
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.tensorflow import _graph as G
from fastps.tensorflow.compression import Compression, Compressor
from fastps.worker.waitable import Waitable

__all__ = [
    "ReduceOp",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Handle",
    "push_pull",
    "push_pull_async",
    "allreduce",
    "allreduce_async",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "broadcast",
    "broadcast_async",
    "broadcast_",
    "broadcast_variables",
    "broadcast_global_variables",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "synchronize",
    "poll",
    "join",
    "barrier",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
]

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

TensorLike = Union[tf.Tensor, tf.Variable, np.ndarray, Any]


def add_process_set(ranks: Any) -> ProcessSet:
    """Registers a process set (collective: every rank adds the same sets in order)."""
    return E.call(C.add_process_set, ranks)


def remove_process_set(process_set: ProcessSet) -> bool:
    return bool(E.call(C.remove_process_set, process_set))


def _ps(process_set: Any) -> ProcessSet:
    return global_process_set if process_set is None else process_set


def _resolve_op(op: Optional[int], average: Optional[bool]) -> ReduceOp:
    return E.call(C.resolve_op, op, average)


def _as_tensor(value: TensorLike) -> tf.Tensor:
    if isinstance(value, tf.Tensor):
        return value
    inner = getattr(value, "value", None)  # a Keras variable's backing tf.Variable
    if isinstance(inner, tf.Variable):
        return tf.convert_to_tensor(inner)
    return tf.convert_to_tensor(value)


def _label(name: Optional[str], prefix: str) -> str:
    return name or prefix


def _graph_name(name: Optional[str], prefix: str, tensor: tf.Tensor) -> Optional[str]:
    """Horovod's naming of an unnamed op inside a graph: after its input tensor's graph
    name, the same on every rank. (A TF1 graph runs independent ops in any order, so the
    layer's numbering by run order could differ between ranks.) Eagerly: ``name``."""
    if name is not None or E.executing_eagerly():
        return name
    return f"{prefix}.{tensor.name}"


# --------------------------------------------------------------------------- handles


class Handle(Waitable):
    """Started work: ``synchronize(handle)`` returns its result.

    Eagerly ``work`` is the started :class:`_engine.Work`; inside a graph ``started``
    holds the start op's id tensor and synchronize adds the op that waits for it.
    """

    def __init__(
        self,
        work: Optional[E.Work],
        started: Optional[G.GraphStart],
        dtypes: Sequence[tf.DType],
        shapes: Sequence[Any],
        label: str,
        post: Callable[[List[tf.Tensor]], Any],
    ) -> None:
        self._work = work
        self._started = started
        self._dtypes = list(dtypes)
        self._shapes = list(shapes)
        self.name = label
        self._post = post
        self._done = False
        self._result: Any = None

    @E.no_autograph
    def synchronize(self, timeout: Optional[float] = None) -> Any:
        """The result; eagerly each op waits at most ``timeout`` (None: the op timeout),
        inside a graph the wait op uses the op timeout."""
        if not self._done:
            if self._work is not None:
                arrays = self._work.synchronize(timeout)
                outs = [tf.convert_to_tensor(a) for a in arrays]
                self._work = None
            else:
                assert self._started is not None
                outs = G.finish_op(self._started, self._dtypes, self._shapes, self.name)
            self._result = self._post(outs)
            self._done = True
        return self._result

    wait = synchronize

    @E.no_autograph
    def poll(self) -> Any:
        if self._done:
            return True
        if self._work is not None:
            return self._work.poll()
        assert self._started is not None
        out = tf.numpy_function(
            lambda h: np.array(G.poll(int(h))), [self._started.hid], tf.bool, stateful=True
        )
        out.set_shape([])
        return out


@E.no_autograph
def synchronize(handle: Handle) -> Any:
    """Waits for an operation started by an ``*_async`` function and returns its result."""
    return handle.synchronize()


@E.no_autograph
def poll(handle: Handle) -> Any:
    """True once ``handle``'s operation has completed (a bool tensor inside a graph)."""
    return handle.poll()


def _launch(
    starter: Callable[..., E.Work],
    inputs: Sequence[tf.Tensor],
    dtypes: Sequence[tf.DType],
    shapes: Sequence[Any],
    label: str,
    post: Callable[[List[tf.Tensor]], Any] = lambda outs: outs,
) -> Handle:
    """Starts ``starter(*arrays)`` on the inputs' host arrays: now when eager, when the
    inputs are ready inside a graph."""
    if E.executing_eagerly():
        work = E.call(starter, *[x.numpy() for x in inputs])
        return Handle(work, None, dtypes, shapes, label, post)
    E.refuse_xla(f"fastps collective '{label}'")
    started = G.start_op(starter, inputs, label)
    return Handle(None, started, dtypes, shapes, label, post)


# --------------------------------------------------------------------------- allreduce


def _allreduce_starter(
    dtype: str,
    name: Optional[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    priority: int = 0,
) -> Callable[..., E.Work]:
    def start(arr: np.ndarray) -> E.Work:
        host = E.to_numpy(arr, dtype)
        cop = C.allreduce_async(host, dtype, name, op, prescale, postscale, process_set, priority)
        return E.Work([cop], lambda res: [E.from_numpy(res[0], dtype).reshape(host.shape)])

    return start


def _allreduce_dense_async(
    value: tf.Tensor,
    name: Optional[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
    compression: Type[Compressor],
    priority: int = 0,
) -> Handle:
    compressed, ctx = compression.compress(value)
    name = _graph_name(name, "allreduce", compressed)
    dtype = E.check_dtype(compressed.dtype, f"tensor '{_label(name, 'allreduce')}'")
    return _launch(
        _allreduce_starter(dtype, name, op, prescale, postscale, process_set, priority),
        [compressed],
        [compressed.dtype],
        [compressed.shape],
        _label(name, "allreduce"),
        lambda outs: compression.decompress(outs[0], ctx),
    )


@E.no_autograph
def allreduce_async(
    tensor: TensorLike,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    compression: Type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    priority: int = 0,
    process_set: Any = None,
) -> Handle:
    """Starts reducing ``tensor`` over the process set; see :func:`allreduce`. Never waits
    for other ranks."""
    rop = _resolve_op(op, average)
    return _allreduce_dense_async(
        _as_tensor(tensor),
        name,
        rop,
        prescale_factor,
        postscale_factor,
        _ps(process_set),
        compression,
        priority,
    )


push_pull_async = allreduce_async


def _sparse_allreduce(
    slices: tf.IndexedSlices,
    name: Optional[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> tf.IndexedSlices:
    """Horovod's IndexedSlices path: the values and indices are allgathered (the result
    represents the sum), and divided by the set size for Average."""
    if op not in (Sum, Average):
        raise E.Unsupported("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise E.Unsupported("Pre/postscale_factor are not supported with tf.IndexedSlices")
    values = allgather(slices.values, None if name is None else f"{name}.values", process_set)
    indices = allgather(slices.indices, None if name is None else f"{name}.indices", process_set)
    if op == Average:
        # The size when the op runs (a graph may outlive its world in an elastic job).
        n = _eager_or_op(lambda: np.int32(process_set.size()), tf.int32, "size")
        values = values / tf.cast(n, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@E.no_autograph
def allreduce(
    tensor: TensorLike,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
    priority: int = 0,
) -> Any:
    """Reduces ``tensor`` over the process set: ``op`` Average (default), Sum, Min, Max or
    Product of ``prescale * tensor``, times ``postscale``. Integer averages round toward
    zero; booleans combine with logical OR (Sum). A ``tf.IndexedSlices`` is allgathered
    (values and indices), as Horovod does. Differentiable: the gradient is the same
    reduction of the incoming gradient."""
    del device_dense, device_sparse, ignore_name_scope  # CPU collectives, layer names
    if isinstance(op, str) or isinstance(average, str):
        raise FastPSError("allreduce: pass op=/name= as keywords (got a string positionally)")
    ps = _ps(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise E.Unsupported(
                "The Adasum reduction does not support sparse tensors; pass sparse_as_dense=True"
            )
        rop = E.call(C.resolve_op, op, average)
        return _sparse_allreduce(tensor, name, rop, prescale_factor, postscale_factor, ps)
    rop = _resolve_op(op, average)
    value = _as_tensor(tensor)

    def run(x: tf.Tensor, tag: Optional[str]) -> tf.Tensor:
        return _allreduce_dense_async(
            x, tag, rop, prescale_factor, postscale_factor, ps, compression, priority
        ).synchronize()

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            return run(tf.convert_to_tensor(dy), None if name is None else f"{name}.grad")

        return run(x, name), grad

    return differentiable(value)


push_pull = allreduce


@E.no_autograph
def grouped_allreduce_async(
    tensors: Sequence[TensorLike],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    compression: Type[Compressor] = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> Handle:
    """Starts one allreduce per tensor, announced together; the result is a list."""
    rop = _resolve_op(op, average)
    ps = _ps(process_set)
    values = [_as_tensor(t) for t in tensors]
    packed = [compression.compress(v) for v in values]
    sent = [c for c, _ in packed]
    if sent:
        name = _graph_name(name, "grouped_allreduce", sent[0])
    dtypes = [
        E.check_dtype(c.dtype, f"tensor #{i} of grouped_allreduce") for i, c in enumerate(sent)
    ]

    def start(*arrs: np.ndarray) -> E.Work:
        cops = C.grouped_allreduce_async(
            [E.to_numpy(a, dt) for a, dt in zip(arrs, dtypes)],
            dtypes,
            name,
            rop,
            prescale_factor,
            postscale_factor,
            ps,
        )
        return E.Work(
            cops,
            lambda res: [
                E.from_numpy(r, dt).reshape(np.shape(a)) for r, dt, a in zip(res, dtypes, arrs)
            ],
        )

    return _launch(
        start,
        sent,
        [c.dtype for c in sent],
        [c.shape for c in sent],
        _label(name, "grouped_allreduce"),
        lambda outs: [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)],
    )


@E.no_autograph
def grouped_allreduce(
    tensors: Sequence[TensorLike],
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
) -> List[Any]:
    """:func:`allreduce` of every tensor, started together. IndexedSlices are allgathered;
    dense tensors are differentiable (the gradients are reduced the same way)."""
    del device_dense, device_sparse, ignore_name_scope
    tensors = list(tensors)
    if not tensors:
        return []
    ps = _ps(process_set)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        if op == Adasum:
            raise E.Unsupported(
                "The Adasum reduction does not support sparse tensors; pass sparse_as_dense=True"
            )
        rop = E.call(C.resolve_op, op, average)
        if op is not None and rop not in (Sum, Average):
            raise E.Unsupported("Only Sum and Average ops are supported with tf.IndexedSlices")
    rop = _resolve_op(op, average)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: List[Any] = list(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            tag = None if name is None else f"{name}.{i}"
            out[i] = _sparse_allreduce(t, tag, rop, prescale_factor, postscale_factor, ps)
    if not dense:
        return out
    values = [_as_tensor(tensors[i]) for i in dense]

    def run(xs: Sequence[tf.Tensor], tag: Optional[str]) -> List[tf.Tensor]:
        return grouped_allreduce_async(
            xs, None, tag, rop, compression, prescale_factor, postscale_factor, ps
        ).synchronize()

    if all(v.dtype.is_floating for v in values):

        @tf.custom_gradient
        def differentiable(*xs: tf.Tensor) -> Any:
            def grad(*dys: tf.Tensor) -> Any:
                return run(
                    [tf.convert_to_tensor(d) for d in dys],
                    None if name is None else f"{name}.grad",
                )

            return run(xs, name), grad

        reduced = differentiable(*values)
    else:
        reduced = run(values, name)
    for i, r in zip(dense, reduced):
        out[i] = r
    return out


# --------------------------------------------------------------------------- allgather


def _allgather_starter(dtype: str, name: Optional[str], ps: ProcessSet) -> Callable[..., E.Work]:
    def start(arr: np.ndarray) -> E.Work:
        cop = C.allgather_async(E.to_numpy(arr, dtype), E.wire(dtype), name, ps)
        return E.Work([cop], lambda res: [E.from_numpy(res[0][0], dtype)])

    return start


def _gathered_shape(x: tf.Tensor) -> Any:
    return tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else [None]


@E.no_autograph
def allgather_async(
    tensor: TensorLike, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    value = _as_tensor(tensor)
    name = _graph_name(name, "allgather", value)
    dtype = E.check_dtype(value.dtype, f"tensor '{_label(name, 'allgather')}'", moved=True)
    return _launch(
        _allgather_starter(dtype, name, _ps(process_set)),
        [value],
        [value.dtype],
        [_gathered_shape(value)],
        _label(name, "allgather"),
        lambda outs: outs[0],
    )


def _allgather_grad(x: tf.Tensor, dy: tf.Tensor, name: Optional[str], ps: ProcessSet) -> tf.Tensor:
    """Horovod's allgather gradient: the averaged gradient, this rank's rows of it."""
    total = allreduce(dy, op=Average, name=None if name is None else f"{name}.grad", process_set=ps)
    rows = tf.reshape(tf.shape(x)[0], [1]) if x.shape.rank else tf.constant([1])
    counts = allgather(rows, None if name is None else f"{name}.grad.rows", ps)
    me = ps.rank()
    offset = tf.reduce_sum(counts[:me])
    mine = total[offset : offset + counts[me]]
    return tf.reshape(mine, tf.shape(x))


@E.no_autograph
def allgather(
    tensor: TensorLike,
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order (the
    first dimension may differ, the others must match; a scalar gathers as one row).
    Differentiable: each rank gets its rows of the averaged gradient."""
    if isinstance(process_set, bool):  # Horovod's positional order: name, ignore_name_scope
        process_set, ignore_name_scope = None, process_set
    del ignore_name_scope
    ps = _ps(process_set)
    value = _as_tensor(tensor)

    def run(x: tf.Tensor, tag: Optional[str]) -> tf.Tensor:
        return allgather_async(x, tag, ps).synchronize()

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        return run(x, name), lambda dy: _allgather_grad(x, tf.convert_to_tensor(dy), name, ps)

    return differentiable(value)


@E.no_autograph
def grouped_allgather(
    tensors: Sequence[TensorLike],
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
) -> List[tf.Tensor]:
    """:func:`allgather` of every tensor, started together."""
    del ignore_name_scope
    ps = _ps(process_set)
    values = [_as_tensor(t) for t in tensors]
    if not values:
        return []
    name = _graph_name(name, "grouped_allgather", values[0])
    dtypes = [
        E.check_dtype(v.dtype, f"tensor #{i} of grouped_allgather", moved=True)
        for i, v in enumerate(values)
    ]

    def start(*arrs: np.ndarray) -> E.Work:
        cops = C.grouped_allgather_async(
            [E.to_numpy(a, dt) for a, dt in zip(arrs, dtypes)],
            [E.wire(dt) for dt in dtypes],
            name,
            ps,
        )
        return E.Work(cops, lambda res: [E.from_numpy(r[0], dt) for r, dt in zip(res, dtypes)])

    def run(xs: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return _launch(
            start,
            list(xs),
            [x.dtype for x in xs],
            [_gathered_shape(x) for x in xs],
            _label(name, "grouped_allgather"),
        ).synchronize()

    if not all(v.dtype.is_floating for v in values):
        return run(values)

    @tf.custom_gradient
    def differentiable(*xs: tf.Tensor) -> Any:
        def grad(*dys: tf.Tensor) -> Any:
            return [_allgather_grad(x, tf.convert_to_tensor(d), None, ps) for x, d in zip(xs, dys)]

        return run(xs), grad

    return differentiable(*values)


# --------------------------------------------------------------------------- broadcast


def _broadcast_starter(
    dtype: str, root_rank: int, name: Optional[str], ps: ProcessSet
) -> Callable[..., E.Work]:
    def start(arr: np.ndarray) -> E.Work:
        host = E.to_numpy(arr, dtype)
        cop = C.broadcast_async(host, E.wire(dtype), root_rank, name, ps)
        return E.Work([cop], lambda res: [E.from_numpy(res[0], dtype).reshape(host.shape)])

    return start


@E.no_autograph
def broadcast_async(
    tensor: TensorLike, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> Handle:
    value = _as_tensor(tensor)
    name = _graph_name(name, "broadcast", value)
    dtype = E.check_dtype(value.dtype, f"tensor '{_label(name, 'broadcast')}'", moved=True)
    return _launch(
        _broadcast_starter(dtype, root_rank, name, _ps(process_set)),
        [value],
        [value.dtype],
        [value.shape],
        _label(name, "broadcast"),
        lambda outs: outs[0],
    )


@E.no_autograph
def broadcast(
    tensor: TensorLike,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
) -> tf.Tensor:
    """``root_rank``'s ``tensor`` on every rank of the set. Differentiable: the root gets
    the averaged gradient, the others zero (Horovod's definition)."""
    if isinstance(process_set, bool):
        process_set, ignore_name_scope = None, process_set
    del ignore_name_scope
    ps = _ps(process_set)
    value = _as_tensor(tensor)

    def run(x: tf.Tensor, tag: Optional[str]) -> tf.Tensor:
        return broadcast_async(x, root_rank, tag, ps).synchronize()

    if not value.dtype.is_floating:
        return run(value, name)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            tag = None if name is None else f"{name}.grad"
            total = allreduce(tf.convert_to_tensor(dy), op=Average, name=tag, process_set=ps)
            return total if C.api.rank() == root_rank else total * 0

        return run(x, name), grad

    return differentiable(value)


def _variable_of(v: Any) -> Any:
    """The tf.Variable behind a Keras variable (or ``v`` itself)."""
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _broadcast_into(
    variables: Sequence[Any], root_rank: int, name: Optional[str], ps: ProcessSet
) -> Tuple[List[Any], List[tf.Tensor]]:
    """Broadcasts the variables' values (started together) and assigns the results;
    returns (assign ops, broadcast values)."""
    values = [_as_tensor(v) for v in variables]
    name = _graph_name(name, "broadcast_", values[0])
    dtypes = [
        E.check_dtype(v.dtype, f"variable #{i} '{E.label_of(var)}'", moved=True)
        for i, (v, var) in enumerate(zip(values, variables))
    ]

    def start(*arrs: np.ndarray) -> E.Work:
        names: List[Optional[str]] = (
            [None] * len(arrs) if name is None else list(C.group_names(ps, name, len(arrs)))
        )
        host = [E.to_numpy(a, dt) for a, dt in zip(arrs, dtypes)]
        cops = [
            C.broadcast_async(h, E.wire(dt), root_rank, n, ps)
            for h, dt, n in zip(host, dtypes, names)
        ]
        return E.Work(
            cops,
            lambda res: [
                E.from_numpy(r, dt).reshape(h.shape) for r, dt, h in zip(res, dtypes, host)
            ],
        )

    outs = _launch(
        start,
        values,
        [v.dtype for v in values],
        [v.shape for v in values],
        _label(name, "broadcast_"),
    ).synchronize()
    return [_variable_of(v).assign(o) for v, o in zip(variables, outs)], outs


@E.no_autograph
def broadcast_(
    variables: Sequence[Any], root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """In-place broadcast: every variable takes its value on ``root_rank``; returns the
    new values."""
    variables = list(variables)
    if not variables:
        return []
    assigns, outs = _broadcast_into(variables, root_rank, name, _ps(process_set))
    if E.executing_eagerly():
        return [_variable_of(v).read_value() for v in variables]
    with tf.control_dependencies(assigns):
        return [tf.identity(o) for o in outs]


@E.no_autograph
def broadcast_variables(
    variables: Sequence[Any],
    root_rank: int,
    process_set: Any = None,
    inplace: bool = False,
    name: Optional[str] = None,
) -> Optional[tf.Operation]:
    """Sets every variable to its value on ``root_rank`` (tf.Variable or Keras variables).

    All ranks must pass the same list (same order, shapes and dtypes); if they do not,
    every rank raises an error naming the first difference instead of waiting. Returns
    None eagerly and the grouped assign op inside a graph.
    """
    del inplace  # every broadcast here writes through assign
    if isinstance(process_set, str):  # fastps's older signature: (variables, root, name)
        process_set, name = None, process_set
    variables = list(variables)
    ps = _ps(process_set)
    prefix = name or "broadcast_variables"
    group = E.group_of(variables)
    what = f"the variables passed to broadcast_variables('{prefix}')"
    for i, v in enumerate(variables):
        E.check_dtype(tf.as_dtype(v.dtype), f"variable #{i} '{E.label_of(v)}'", moved=True)
    if not variables:
        return None if E.executing_eagerly() else tf.no_op()
    tag = f"{prefix}.{group.digest}"
    if E.executing_eagerly():
        E.check_same_everywhere(f"bcast.{prefix}", group, what, cache=False, process_set=ps)
        _broadcast_into(variables, root_rank, tag, ps)
        return None
    E.refuse_xla("broadcast_variables")
    check = G.check_op(f"bcast.{prefix}", group, what)
    with tf.control_dependencies([check] if check is not None else []):
        assigns, _ = _broadcast_into(variables, root_rank, tag, ps)
    return tf.group(*assigns)


def broadcast_global_variables(root_rank: int) -> Any:
    """TensorFlow 1's global variables from ``root_rank`` (graph mode only, as Horovod)."""
    if E.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# --------------------------------------------------------------------------- alltoall


def _splits_list(splits: Any) -> Optional[List[int]]:
    if splits is None:
        return None
    arr = np.asarray(splits.numpy() if hasattr(splits, "numpy") else splits)
    if arr.dtype.kind not in "iu":
        raise E.UsageError(f"alltoall splits must be integers, got {arr.dtype}")
    return [int(s) for s in arr.reshape(-1)]


@E.no_autograph
def alltoall(
    tensor: TensorLike,
    splits: Any = None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: Any = None,
) -> Any:
    """Sends ``splits[j]`` rows (the first dimension split evenly without ``splits``) to
    the j-th rank of the set; returns the rows received, concatenated in rank order, and,
    when ``splits`` is given, the number of rows received from each rank (Horovod's two
    forms). Differentiable: gradients travel back along the received splits."""
    del ignore_name_scope
    ps = _ps(process_set)
    value = _as_tensor(tensor)
    dtype = E.check_dtype(value.dtype, f"tensor '{_label(name, 'alltoall')}'", moved=True)
    name = _graph_name(name, "alltoall", value)
    split_tensor = None if splits is None else tf.cast(tf.convert_to_tensor(splits), tf.int64)

    def run(x: tf.Tensor, sp: Optional[tf.Tensor], tag: Optional[str]) -> Tuple[Any, Any]:
        def start(arr: np.ndarray, *split_arr: np.ndarray) -> E.Work:
            chosen = _splits_list(split_arr[0]) if split_arr else None
            cop = C.alltoall_async(E.to_numpy(arr, dtype), E.wire(dtype), chosen, tag, ps)
            return E.Work(
                [cop],
                lambda res: [
                    E.from_numpy(res[0][0], dtype),
                    np.asarray(res[0][1], dtype=np.int32),
                ],
            )

        inputs = [x] if sp is None else [x, sp]
        return tuple(
            _launch(
                start,
                inputs,
                [x.dtype, tf.int32],
                [_gathered_shape(x), [ps.size()]],
                _label(tag, "alltoall"),
            ).synchronize()
        )

    if value.dtype.is_floating:

        @tf.custom_gradient
        def differentiable(x: tf.Tensor) -> Any:
            out, received = run(x, split_tensor, name)

            def grad(dy: tf.Tensor, *_: Any) -> tf.Tensor:
                tag = None if name is None else f"{name}.grad"
                # An output gradient of another float type (Horovod's tests pass float32
                # ones for float64 outputs) travels as the forward dtype.
                dy = tf.cast(tf.convert_to_tensor(dy), x.dtype)
                back, _ = run(dy, tf.cast(received, tf.int64), tag)
                return tf.reshape(back, tf.shape(x))

            return (out, received), grad

        out, received = differentiable(value)
    else:
        out, received = run(value, split_tensor, name)
    return out if splits is None else (out, received)


# --------------------------------------------------------------------------- reducescatter


def _reducescatter_shape(x: tf.Tensor) -> Any:
    return tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None


@E.no_autograph
def grouped_reducescatter(
    tensors: Sequence[TensorLike],
    device_dense: str = "",
    compression: Type[Compressor] = Compression.none,
    op: Optional[int] = Average,
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[tf.Tensor]:
    """Reduces every tensor over the set (Sum or Average); each rank keeps its share of the
    first dimension (the first ``rows % size`` ranks one row more). Differentiable: the
    gradient is the allgathered gradient, scaled as the forward op scaled."""
    del device_dense, ignore_name_scope
    rop = _resolve_op(op, None)
    ps = _ps(process_set)
    values = [_as_tensor(t) for t in tensors]
    if not values:
        return []
    for i, v in enumerate(values):
        if v.shape.rank == 0:  # known while tracing too: refuse at the call, like Horovod
            raise E.UsageError(f"reducescatter: tensor #{i} is a scalar, which cannot be scattered")
    packed = [compression.compress(v) for v in values]
    sent = [c for c, _ in packed]
    name = _graph_name(name, "reducescatter", sent[0])
    dtypes = [E.check_dtype(c.dtype, f"tensor #{i} of reducescatter") for i, c in enumerate(sent)]

    def start(*arrs: np.ndarray) -> E.Work:
        host = [E.to_numpy(a, dt) for a, dt in zip(arrs, dtypes)]
        if len(host) == 1:
            cops = [
                C.reducescatter_async(
                    host[0], dtypes[0], name, rop, prescale_factor, postscale_factor, ps
                )
            ]
        else:
            cops = C.grouped_reducescatter_async(
                host, dtypes, name, rop, prescale_factor, postscale_factor, ps
            )
        return E.Work(cops, lambda res: [E.from_numpy(r, dt) for r, dt in zip(res, dtypes)])

    def run(xs: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        outs = _launch(
            start,
            list(xs),
            [x.dtype for x in xs],
            [_reducescatter_shape(x) for x in xs],
            _label(name, "reducescatter"),
        ).synchronize()
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, packed)]

    if not all(c.dtype.is_floating for c in sent):
        return run(sent)

    factor = float(prescale_factor) * float(postscale_factor) * (ps.size() if rop == Sum else 1)

    @tf.custom_gradient
    def differentiable(*xs: tf.Tensor) -> Any:
        def grad(*dys: tf.Tensor) -> Any:
            gathered = grouped_allgather([tf.convert_to_tensor(d) for d in dys], process_set=ps)
            return [g * tf.cast(factor, g.dtype) for g in gathered]

        return run(xs), grad

    return list(differentiable(*sent))


@E.no_autograph
def reducescatter(
    tensor: TensorLike,
    device_dense: str = "",
    compression: Type[Compressor] = Compression.none,
    op: Optional[int] = Average,
    name: Optional[str] = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """:func:`grouped_reducescatter` of one tensor."""
    return grouped_reducescatter(
        [tensor],
        device_dense,
        compression,
        op,
        name,
        process_set,
        ignore_name_scope,
        prescale_factor,
        postscale_factor,
    )[0]


# --------------------------------------------------------------------------- join, barrier


def _eager_or_op(fn: Callable[[], Any], dtype: tf.DType, label: str) -> Any:
    """``fn()`` as a tensor now when eager, as an op that calls it inside a graph."""
    if E.executing_eagerly():
        return tf.convert_to_tensor(np.asarray(E.call(fn)), dtype=dtype)
    out = tf.numpy_function(
        lambda: np.asarray(fn(), dtype=dtype.as_numpy_dtype),
        [],
        dtype,
        stateful=True,
        name=E.op_name("FastPS", label),
    )
    out.set_shape([])
    return out


@E.no_autograph
def join(process_set: Any = None) -> Any:
    """Waits until every rank joined; meanwhile this rank stands in with zeros for the
    others' allreduces. Returns the rank that joined last (an int32 scalar tensor)."""
    ps = _ps(process_set)
    if E.executing_eagerly():
        return tf.convert_to_tensor(np.int32(E.call(C.join, ps)))
    # Inside a graph the wait runs on a thread of its own (see _graph): a join can wait
    # for other ranks' collectives, which must not be starved of executor threads.
    return G.call_op(lambda: [np.asarray(C.join(ps), dtype=np.int32)], [tf.int32], [[]], "join")[0]


def barrier(process_set: Any = None) -> None:
    """Returns once every rank of the set has called ``barrier``."""
    E.call(C.barrier, _ps(process_set))


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> Any:
    """The set's size, determined when the op runs."""
    return _eager_or_op(lambda: np.int32(_set_by_id(process_set_id).size()), tf.int32, "size")


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> Any:
    """1 if this rank belongs to the set, else 0 (when the op runs)."""
    return _eager_or_op(
        lambda: np.int32(_set_by_id(process_set_id).included()), tf.int32, "included"
    )


def local_size_op(name: Optional[str] = None) -> Any:
    return _eager_or_op(lambda: np.int32(C.api.local_size()), tf.int32, "local_size")


def rank_op(name: Optional[str] = None) -> Any:
    return _eager_or_op(lambda: np.int32(C.api.rank()), tf.int32, "rank")


def local_rank_op(name: Optional[str] = None) -> Any:
    return _eager_or_op(lambda: np.int32(C.api.local_rank()), tf.int32, "local_rank")


def _set_by_id(process_set_id: int) -> ProcessSet:
    ps = C.process_set_by_id(process_set_id)
    if ps is None:
        raise E.UsageError(f"no process set with id {process_set_id} is registered")
    return ps


# --------------------------------------------------------------------------- objects


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: Any = None,
) -> Any:
    """``root_rank``'s picklable object on every rank of the set (eager)."""
    del session
    return E.call(C.broadcast_object, obj, root_rank, name, _ps(process_set))


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: Optional[str] = None, process_set: Any = None
) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from ``root_rank`` (Horovod's form)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(
    obj: Any, session: Any = None, name: Optional[str] = None, process_set: Any = None
) -> List[Any]:
    """Every rank's picklable object, in rank order (eager)."""
    del session
    return list(E.call(C.allgather_object, obj, name, _ps(process_set)))
