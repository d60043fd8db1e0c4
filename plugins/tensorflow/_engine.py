"""The bridge between TensorFlow tensors and the fastps core, eagerly and inside graphs.

Nothing here is compiled against TensorFlow. A tensor reaches the core as a numpy array:
``Tensor.numpy()`` when running eagerly, the array ``tf.numpy_function`` hands its Python
function inside a graph (both alias the tensor's memory and hold a reference to its buffer,
so the memory stays valid, and unmodified, while the core reads it). Results come back as
freshly allocated numpy arrays that become tensors.

Every collective is split in two so that communication overlaps with other work:

* **start**: hands the input to the core and returns at once with an integer id that
  names the operation in a process-wide table (:func:`start_numpy`);
* **finish**: waits for that id and returns the result (:func:`finish_numpy`).

Eagerly these are plain calls. In a graph each is a stateful ``tf.numpy_function`` op: the
start op returns the id as an ``int64`` scalar and the finish op consumes it, so the data edge
orders the pair while ops that do not depend on the result run in between. ``tf.function``'s
automatic control dependencies chain stateful ops that touch no resource in the order the
program creates them; callers rely on that chain (see :mod:`fastps.tensorflow._reducer`).
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from fastps import api as _api
from fastps.buffers import SUPPORTED_DTYPES, raw_buffer
from fastps.errors import FastPSError

# TensorFlow dtypes the core can sum, by the core's name for them.
TF_DTYPES: Dict[tf.DType, str] = {
    tf.float32: "float32",
    tf.float64: "float64",
    tf.float16: "float16",
    tf.bfloat16: "bfloat16",
    tf.int32: "int32",
    tf.int64: "int64",
    tf.uint8: "uint8",
    tf.int8: "int8",
    tf.int16: "int16",
    tf.bool: "bool",
}
assert set(TF_DTYPES.values()) <= set(SUPPORTED_DTYPES)


# Keeps AutoGraph from rewriting fastps's Python when a tf.function calls it: the code
# builds ops directly and has no data-dependent Python control flow to convert.
no_autograph = tf.autograph.experimental.do_not_convert


def check_dtype(dtype: tf.DType, what: str) -> None:
    if dtype.base_dtype not in TF_DTYPES:
        names = ", ".join(d.name for d in TF_DTYPES)
        raise FastPSError(f"{what}: dtype {dtype.name} is not supported (supported: {names})")


def executing_eagerly() -> bool:
    return bool(tf.executing_eagerly())


def in_xla_context() -> bool:
    """True while tracing a function that XLA will compile (``jit_compile=True``)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - layout of a future TensorFlow
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def refuse_xla(what: str) -> None:
    if not executing_eagerly() and in_xla_context():
        raise FastPSError(
            f"{what} cannot run inside an XLA-compiled function: fastps talks to its core "
            "through tf.numpy_function, which XLA cannot compile. Use jit_compile=False "
            "(model.compile(..., jit_compile=False) for Keras)."
        )


def to_numpy(value: Any, what: str) -> np.ndarray:
    """A C-contiguous host array with ``value``'s contents (a view where possible)."""
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "numpy"):
        arr = np.asarray(value.numpy())
    else:
        arr = np.asarray(value)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.name not in SUPPORTED_DTYPES:
        raise FastPSError(
            f"{what}: dtype {arr.dtype.name} is not supported (supported: {SUPPORTED_DTYPES})"
        )
    return arr


# ------------------------------------------------------------------ started operations
class _Finished:
    """A started operation that needed no communication (empty tensor, one worker)."""

    def __init__(self, out: np.ndarray) -> None:
        self._out = out

    def poll(self) -> bool:
        return True

    def synchronize(self) -> np.ndarray:
        return self._out


_table: Dict[int, Any] = {}
_table_lock = threading.Lock()
_ids = itertools.count(1)


def _register(handle: Any) -> int:
    hid = next(_ids)
    with _table_lock:
        _table[hid] = handle
    return hid


def _take(hid: int) -> Any:
    with _table_lock:
        handle = _table.pop(hid, None)
    if handle is None:
        raise FastPSError(f"fastps operation {hid} is unknown or was already synchronized")
    return handle


def start_numpy(
    arr: np.ndarray,
    name: str,
    *,
    priority: int = 0,
    scale: float = 1.0,
    root_rank: Optional[int] = None,
) -> int:
    """Starts a push_pull (``root_rank is None``) or a broadcast of ``arr``; returns its id.

    A push_pull sums ``arr`` over all workers and multiplies the sum by ``scale``.
    """
    st = _api._st()
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if root_rank is not None and not 0 <= root_rank < st.cfg.num_workers:
        raise FastPSError(
            f"broadcast root_rank {root_rank} is not a rank of this job (size {st.cfg.num_workers})"
        )
    if arr.size == 0:
        return _register(_Finished(np.empty(arr.shape, arr.dtype)))
    if root_rank is not None:
        return _register(_api.broadcast_async(arr, root_rank, name=name))
    out = np.empty(arr.shape, dtype=arr.dtype)
    src = raw_buffer(arr, f"tensor '{name}'")
    dst = raw_buffer(out, f"output of tensor '{name}'", writable=True)
    if arr.dtype == np.bool_:
        scale = 1.0  # booleans are combined with logical OR; there is nothing to scale
    return _register(_api.push_pull_raw(src, dst, name, int(priority), float(scale), out=out))


def finish_numpy(hid: int) -> np.ndarray:
    """Waits for operation ``hid`` and returns its result."""
    return _take(int(hid)).synchronize()


def poll_numpy(hid: int) -> bool:
    with _table_lock:
        handle = _table.get(int(hid))
    if handle is None:
        raise FastPSError(f"fastps operation {hid} is unknown or was already synchronized")
    return bool(handle.poll())


def push_pull_numpy(
    arr: np.ndarray, name: str, scale: float = 1.0, priority: int = 0
) -> np.ndarray:
    return finish_numpy(start_numpy(arr, name, priority=priority, scale=scale))


# ------------------------------------------------------------------ graph ops
def start_op(
    tensor: tf.Tensor,
    name: str,
    *,
    priority: int = 0,
    scale: float = 1.0,
    root_rank: Optional[int] = None,
) -> tf.Tensor:
    """Graph op that starts the operation when ``tensor`` is ready; outputs its int64 id."""

    def start(arr: np.ndarray) -> np.ndarray:
        return np.array(
            start_numpy(arr, name, priority=priority, scale=scale, root_rank=root_rank),
            dtype=np.int64,
        )

    hid = tf.numpy_function(
        start, [tensor], tf.int64, stateful=True, name=_op_name("FastPSStart", name)
    )
    hid.set_shape([])
    return hid


def finish_op(hid: tf.Tensor, dtype: tf.DType, shape: tf.TensorShape, name: str) -> tf.Tensor:
    """Graph op that waits for the operation ``hid`` and outputs its result."""
    out = tf.numpy_function(
        finish_numpy, [hid], dtype, stateful=True, name=_op_name("FastPSFinish", name)
    )
    out.set_shape(shape)
    return out


def start_group_op(
    tensors: Sequence[tf.Tensor], names: Sequence[str], priorities: Sequence[int], scale: float
) -> tf.Tensor:
    """One graph op that starts a push_pull per tensor once all are ready; outputs the ids
    (an int64 vector). Fewer Python calls per step than one start op per tensor."""
    names, priorities = list(names), list(priorities)

    def start(*arrs: np.ndarray) -> np.ndarray:
        return np.array(
            [
                start_numpy(a, n, priority=p, scale=scale)
                for a, n, p in zip(arrs, names, priorities)
            ],
            dtype=np.int64,
        )

    ids = tf.numpy_function(
        start, list(tensors), tf.int64, stateful=True, name=_op_name("FastPSStartGroup", names[0])
    )
    ids.set_shape([len(names)])
    return ids


def finish_group_op(
    ids: tf.Tensor, dtypes: Sequence[tf.DType], shapes: Sequence[tf.TensorShape], name: str
) -> List[tf.Tensor]:
    """One graph op that waits for every operation in ``ids``; outputs their results."""

    def finish(hids: np.ndarray) -> List[np.ndarray]:
        return [finish_numpy(int(h)) for h in hids]

    outs = tf.numpy_function(
        finish, [ids], list(dtypes), stateful=True, name=_op_name("FastPSFinishGroup", name)
    )
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)


def call_op(
    fn: Callable[..., np.ndarray],
    inputs: Sequence[tf.Tensor],
    dtype: tf.DType,
    shape: Any,
    name: str,
) -> tf.Tensor:
    """Graph op that runs a blocking numpy-level collective ``fn(*inputs)``."""
    out = tf.numpy_function(fn, list(inputs), dtype, stateful=True, name=_op_name("FastPS", name))
    out.set_shape(shape)
    return out


def _op_name(prefix: str, name: str) -> str:
    clean = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return f"{prefix}_{clean}"[:120]


# ------------------------------------------------------------------ gathering
def allgather_numpy(arr: np.ndarray, name: str) -> np.ndarray:
    """Concatenates every worker's ``arr`` along the first dimension, in rank order.

    Only the first dimension may differ between workers. Two push_pulls: the shapes
    (each worker fills its row of a zero matrix), then the data (each worker fills its
    slice of a zero buffer; every other worker adds zeros, which is exact).
    """
    st = _api._st()
    n, me = st.cfg.num_workers, st.cfg.rank
    arr = np.asarray(arr)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if n == 1:
        return arr.copy()
    shapes = np.zeros((n, arr.ndim), dtype=np.int64)
    shapes[me] = arr.shape
    shapes = push_pull_numpy(shapes, f"{name}.shapes.{arr.ndim}d")
    rest = shapes[:, 1:]
    bad = [r for r in range(n) if not np.array_equal(rest[r], rest[me])]
    if bad:
        desc = ", ".join(f"rank {r}: {list(shapes[r])}" for r in range(n))
        raise FastPSError(f"allgather '{name}': tensors differ beyond the first dimension ({desc})")
    counts = shapes[:, 0]
    total = int(counts.sum())
    start = int(counts[:me].sum())
    buf = np.zeros((total, *arr.shape[1:]), dtype=arr.dtype)
    buf[start : start + arr.shape[0]] = arr
    return push_pull_numpy(buf, f"{name}.data.{total}")


def allgather_bytes(data: bytes, name: str) -> List[bytes]:
    """Every worker's ``data``, in rank order."""
    st = _api._st()
    n = st.cfg.num_workers
    if n == 1:
        return [bytes(data)]
    lengths = np.zeros(n, dtype=np.int64)
    lengths[st.cfg.rank] = len(data)
    lengths = push_pull_numpy(lengths, f"{name}.lengths")
    joined = allgather_numpy(np.frombuffer(data, dtype=np.uint8).copy(), name)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [joined[bounds[r] : bounds[r + 1]].tobytes() for r in range(n)]


def broadcast_bytes(data: Optional[bytes], root_rank: int, name: str) -> bytes:
    """root_rank's ``data`` on every worker (other workers may pass None)."""
    st = _api._st()
    if st.cfg.num_workers == 1:
        return bytes(data or b"")
    mine = st.cfg.rank == root_rank
    length = np.array([len(data) if mine and data is not None else 0], dtype=np.int64)
    length = finish_numpy(start_numpy(length, f"{name}.length", root_rank=root_rank))
    payload = np.zeros(int(length[0]), dtype=np.uint8)
    if mine and data is not None:
        payload[:] = np.frombuffer(data, dtype=np.uint8)
    out = finish_numpy(start_numpy(payload, f"{name}.data.{int(length[0])}", root_rank=root_rank))
    return out.tobytes()


# ------------------------------------------------------------------ consistency checks
def digest(items: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(items).encode()).hexdigest()[:12]


@dataclass
class Group:
    """Tensors every worker must pass alike, e.g. one gradient per trainable variable.

    ``keys`` (position, dtype, shape) are what workers must agree on. Names are not
    compared: Keras numbers layers (and optimizer slots) per process, so the same model can
    be "dense_3/kernel" on one worker and "dense/kernel" on another. ``labels`` add the
    names, for error messages only.
    """

    keys: List[str]
    labels: List[str]

    @property
    def digest(self) -> str:
        return digest(self.keys)


def group_of(values: Sequence[Any], indices: Optional[Sequence[int]] = None) -> Group:
    indices = list(range(len(values))) if indices is None else list(indices)
    keys, labels = [], []
    for i, v in zip(indices, values):
        shape = tuple(getattr(v, "shape", ()) or ())
        dims = [None if d is None else int(d) for d in shape]
        dtype = getattr(v, "dtype", None)
        dtype_name = getattr(dtype, "name", None) or str(dtype)
        keys.append(f"#{i} {dtype_name}{dims}")
        labels.append(f"#{i} '{label_of(v)}' {dtype_name}{dims}")
    return Group(keys, labels)


def label_of(value: Any) -> str:
    """A readable name for a variable or tensor (its path for Keras variables)."""
    for attr in ("path", "name"):
        try:
            label = getattr(value, attr, None)
        except (AttributeError, ValueError):  # eager tensors have no name
            label = None
        if isinstance(label, str) and label:
            return label[:-2] if label.endswith(":0") else label
    return "?"


_checked: Dict[Tuple[str, str], None] = {}
_checked_lock = threading.Lock()


def already_checked(kind: str, group: Group) -> bool:
    with _checked_lock:
        return (kind, group.digest) in _checked


def check_same_everywhere(kind: str, group: Group, what: str, cache: bool = True) -> None:
    """Raises FastPSError on every worker unless all workers passed alike groups.

    One small push_pull, under a name that depends only on ``kind``, carries each worker's
    digest of its group; only when they differ are the groups themselves gathered, to name
    the first difference. This turns a model that differs between workers (which would make
    the workers push different tensors and wait for each other until the operation timeout)
    into an immediate error on all of them.
    """
    st = _api._st()
    n, me = st.cfg.num_workers, st.cfg.rank
    if n == 1:
        return
    key = (kind, group.digest)
    with _checked_lock:
        if cache and key in _checked:
            return
    code = int(key[1][:15], 16)  # 60 bits: fits an int64
    table = np.zeros((n, 2), dtype=np.int64)
    table[me] = (code, len(group.keys))
    table = push_pull_numpy(table, f"fastps.check.{kind}")
    if all(table[r, 0] == table[0, 0] and table[r, 1] == table[0, 1] for r in range(n)):
        if cache:
            with _checked_lock:
                _checked[key] = None
        return
    texts = allgather_bytes(pickle.dumps((group.keys, group.labels)), f"fastps.check.{kind}.items")
    raise FastPSError(describe_difference(what, [Group(*pickle.loads(t)) for t in texts]))


def describe_difference(what: str, groups: List[Group]) -> str:
    """E.g. "... differ between workers: rank 0 has 4 and rank 1 has 6; the first difference
    is rank 0 #2 'dense_1/kernel' float32[16, 3] vs rank 1 #2 'dense_1/kernel' float32[16, 16]".
    """
    parts = []
    base = groups[0]
    for r, other in enumerate(groups[1:], start=1):
        if other.keys == base.keys:
            continue
        line = f"rank 0 has {len(base.keys)} and rank {r} has {len(other.keys)}"
        for i in range(max(len(base.keys), len(other.keys))):
            a = base.keys[i] if i < len(base.keys) else None
            b = other.keys[i] if i < len(other.keys) else None
            if a != b:
                shown_a = base.labels[i] if a is not None else "nothing"
                shown_b = other.labels[i] if b is not None else "nothing"
                line += f"; the first difference is rank 0 {shown_a} vs rank {r} {shown_b}"
                break
        parts.append(line)
    return f"{what} differ between workers: " + "; ".join(parts)


def check_op(kind: str, group: Group, what: str) -> Optional[tf.Tensor]:
    """The graph form of :func:`check_same_everywhere`: an op that checks on its first run
    (later runs return at once). None when this process already checked this group."""
    if already_checked(kind, group) or _api._st().cfg.num_workers == 1:
        return None

    def check() -> np.ndarray:
        check_same_everywhere(kind, group, what)
        return np.array(True)

    return tf.numpy_function(check, [], tf.bool, stateful=True, name=_op_name("FastPSCheck", kind))
