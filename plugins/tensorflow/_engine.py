"""The glue between TensorFlow tensors and fastps's collective layer, eagerly and in graphs.

Nothing here is compiled against TensorFlow and nothing here is a collective algorithm:
those live in ``fastps.collectives`` and work on host arrays. This module only

* turns a tensor into a numpy array over its host memory (``Tensor.numpy()``; bfloat16
  travels as its uint16 bits, unsigned dtypes without arithmetic as their signed carrier)
  and an array back into a tensor;
* splits a collective into **start** (hand the arrays to the layer, return at once) and
  **finish** (wait, return the output arrays) as a :class:`Work`, so that communication
  overlaps other work. Eagerly these are plain calls; inside a graph they are ops
  (:mod:`fastps.tensorflow._graph`);
* turns the layer's errors into TensorFlow's error types, as Horovod raises them: ranks that
  disagree (shape, dtype, op) -> ``tf.errors.FailedPreconditionError``, a call made wrongly
  (a name already in flight, bad splits) -> ``tf.errors.InvalidArgumentError`` (both also
  keep their fastps/Python types: ``CollectiveError``; ``ValueError`` and ``FastPSError``).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from fastps.collectives import ops as C
from fastps.errors import FastPSError
from fastps.worker.waitable import Waitable

# TensorFlow dtypes the layer handles, by the layer's name for them.
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
assert set(TF_DTYPES.values()) <= set(C.DTYPES)


# Keeps AutoGraph from rewriting fastps's Python when a tf.function calls it: the code
# builds ops directly and has no data-dependent Python control flow to convert.
no_autograph = tf.autograph.experimental.do_not_convert


# ------------------------------------------------------------------ errors
class MismatchError(tf.errors.FailedPreconditionError, C.CollectiveError):
    """Ranks disagree about an op (shape, dtype, reduce op, root...): raised on every rank,
    naming both values; the job goes on. Horovod raises FailedPreconditionError here."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class UsageError(tf.errors.InvalidArgumentError, ValueError, FastPSError):
    """A call this rank made wrongly (duplicate name in flight, bad splits, a rank outside
    the process set): raised at once on the caller. A FastPSError too, like every error
    fastps raises."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class Unsupported(FastPSError, NotImplementedError):
    """Something Horovod also refuses (sparse Min/Max/Adasum, scaled sparse): Horovod's
    tests expect NotImplementedError for these."""


def translated(exc: BaseException) -> BaseException:
    """The TensorFlow-typed form of a layer error (other errors unchanged)."""
    if isinstance(exc, (MismatchError, UsageError)):
        return exc
    if isinstance(exc, C.UsageError):
        return UsageError(str(exc))
    if isinstance(exc, C.CollectiveError):
        return MismatchError(str(exc))
    return exc


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(...)`` with layer errors raised as TensorFlow errors."""
    try:
        return fn(*args, **kwargs)
    except (C.UsageError, C.CollectiveError) as exc:
        raise translated(exc) from None


# ------------------------------------------------------------------ tensors <-> arrays
# Unsigned dtypes the layer has no arithmetic for: collectives that only move data
# (allgather, broadcast, alltoall) carry them bit for bit as the signed type of their width.
MOVED_DTYPES: Dict[tf.DType, str] = {tf.uint16: "int16", tf.uint32: "int32", tf.uint64: "int64"}
_MOVED_NUMPY = {
    tf.as_dtype(d).name: (np.dtype(w), d.as_numpy_dtype) for d, w in MOVED_DTYPES.items()
}


def check_dtype(dtype: tf.DType, what: str, moved: bool = False) -> str:
    """The plugin's name for ``dtype`` (the layer's, or one of :data:`MOVED_DTYPES` when
    the op only moves data: ``moved``), or a FastPSError naming ``what``."""
    base = tf.as_dtype(dtype).base_dtype
    name = TF_DTYPES.get(base)
    if name is None and moved and base in MOVED_DTYPES:
        name = base.name
    if name is None:
        known = list(TF_DTYPES) + (list(MOVED_DTYPES) if moved else [])
        names = ", ".join(d.name for d in known)
        raise FastPSError(f"{what}: dtype {base.name} is not supported (supported: {names})")
    return name


def wire(dtype: str) -> str:
    """The layer's dtype for the plugin's ``dtype`` name (a moved dtype's carrier)."""
    moved = _MOVED_NUMPY.get(dtype)
    return dtype if moved is None else moved[0].name


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
            "through tf.py_function, which XLA cannot compile. Use jit_compile=False "
            "(model.compile(..., jit_compile=False) for Keras)."
        )


def to_numpy(value: Any, dtype: str) -> np.ndarray:
    """A C-contiguous host array of ``value`` in the layer's representation of ``dtype``
    (bfloat16 as uint16 bits); a view of the tensor's memory where possible."""
    if not isinstance(value, (np.ndarray, np.generic)):
        value = value.numpy()
    arr = np.asarray(value)  # a scalar tensor's numpy() is a numpy scalar
    if dtype == "bfloat16":
        arr = arr.view(np.uint16)
    elif dtype in _MOVED_NUMPY:
        arr = arr.view(_MOVED_NUMPY[dtype][0])
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def from_numpy(arr: np.ndarray, dtype: str) -> np.ndarray:
    """The layer's array as the array TensorFlow expects for ``dtype`` (bfloat16 bits
    reinterpreted)."""
    arr = np.asarray(arr, order="C")  # np.ascontiguousarray would make a scalar 1-D
    if dtype == "bfloat16":
        return arr.view(tf.bfloat16.as_numpy_dtype)
    if dtype in _MOVED_NUMPY:
        return arr.view(_MOVED_NUMPY[dtype][1])
    return arr


# ------------------------------------------------------------------ started work
class Work(Waitable):
    """Started collectives (layer ops) and how to turn their results into output arrays."""

    def __init__(self, ops: Sequence[Any], finish: Callable[[List[Any]], List[np.ndarray]]):
        self._ops = list(ops)
        self._finish = finish

    def poll(self) -> bool:
        return all(op.poll() for op in self._ops)

    def synchronize(self, timeout: Optional[float] = None) -> List[np.ndarray]:
        """The output arrays; each op waits at most ``timeout`` (default: the op timeout).
        If one fails (or a signal interrupts the wait), the others are given up."""

        def wait_all() -> List[np.ndarray]:
            try:
                results = [op.synchronize(timeout) for op in self._ops]
            except BaseException:
                C.give_up(self._ops)
                raise
            return self._finish(results)

        return call(wait_all)

    wait = synchronize


def op_name(prefix: str, name: str) -> str:
    clean = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return f"{prefix}_{clean}"[:120]


def world_may_change() -> bool:
    """True in an elastic worker: a graph traced in one generation may run in the next,
    with another world (its size, its newcomers), so a graph must not bake in what the
    world was when it was traced (its size, the checks already passed)."""
    from fastps.control import elastic_wire as wire

    return wire.enabled()


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


# Checks passed in the core session ``_checked_in`` (a new session -- an elastic job's
# next generation, whose newcomers have checked nothing -- checks again on every rank).
_checked: Dict[Any, None] = {}
_checked_in: Any = None
_checked_lock = threading.Lock()


def _checks_of_this_session() -> Dict[Any, None]:
    """The cache of checks passed in the current core session (caller holds the lock)."""
    global _checked_in
    from fastps.worker import api

    session = api.session_or_none()
    if session is not _checked_in:
        _checked.clear()
        _checked_in = session
    return _checked


def already_checked(kind: str, group: Group, process_set: Any = None) -> bool:
    """Whether ``check_same_everywhere`` passed for this group in this core session."""
    ps = C.global_process_set if process_set is None else process_set
    with _checked_lock:
        return (kind, group.digest, ps.process_set_id) in _checks_of_this_session()


def check_same_everywhere(
    kind: str, group: Group, what: str, cache: bool = True, process_set: Any = None
) -> None:
    """Raises MismatchError on every worker unless all workers passed alike groups.

    Every worker's group is gathered once (``fastps.collectives.allgather_object``) under
    a name that depends only on ``kind``; the message names the first difference. This
    turns a model that differs between workers (which would make them push different
    tensors and wait for each other until the op timeout) into an immediate error.
    """
    ps = C.global_process_set if process_set is None else process_set
    key = (kind, group.digest, ps.process_set_id)
    with _checked_lock:
        if cache and key in _checks_of_this_session():
            return
        if ps.size() == 1:  # alone: nothing to compare (a session's world never changes)
            if cache:
                _checks_of_this_session()[key] = None
            return
    groups = call(C.allgather_object, (group.keys, group.labels), f"fastps.check.{kind}", ps)
    groups = [Group(list(k), list(lab)) for k, lab in groups]
    if any(g.keys != groups[0].keys for g in groups):
        raise MismatchError(describe_difference(what, groups))
    if cache:
        with _checked_lock:
            _checks_of_this_session()[key] = None


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
