"""A fastps-backed MXNet KVStore: ``mx.kv.create('fastps')``.

It behaves like MXNet's ``dist_sync`` store, with the summation done by fastps servers:

* ``init(key, value)`` stores rank 0's value on every worker;
* ``push(key, value)`` sums ``value`` over the devices of this worker and over all workers;
  without an optimizer the store then holds that sum, with one (``set_optimizer``) the sum
  is the gradient applied to the stored weight;
* ``pull(key, out)`` copies the stored value into ``out``;
* ``pushpull(key, value, out)`` is push then pull in one step;
* ``broadcast(key, value, out)`` is init then pull.

fastps servers only sum (BytePS §5), so ``set_optimizer`` keeps the optimizer on every
worker: all workers apply the same update to the same summed gradient and stay identical,
which is what ``dist_sync`` computes on its servers.

Because ``'dist'`` and ``'_sync'`` appear in :attr:`FastPS.type`, MXNet treats the store as
distributed: ``Module`` divides gradients by the global batch size, and Gluon's ``Trainer``
refuses to reset it. With Gluon, pass the global batch size to ``trainer.step`` (the
gradients are summed over workers, as with ``dist_sync``).

Gluon's ``Trainer(..., kvstore='fastps')`` with one device per worker ignores any store
whose name lacks ``'dist'`` (MXNet's rule), so pass ``kvstore=mx.kv.create('fastps')`` or
the string ``'dist_sync_fastps'``, which names the same store.
"""

from __future__ import annotations

import itertools
import pickle
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx
from fastps.collectives import ops as _collectives
from fastps.errors import FastPSError
from fastps.mxnet.compression import Compression, Compressor
from fastps.mxnet.ops import _CoreHandle, _start, broadcast_async_
from fastps.worker import api as _api

__all__ = ["FastPS", "dist_sync_fastps"]

if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray
KVStoreBase: TypeAlias = mx.kvstore.KVStoreBase
Key = Union[int, str]

# Stores are numbered in creation order (the same on every worker), so two stores that use
# the same keys (two Trainers, say) are different tensors for the core.
_instances = itertools.count()


def _pairs(key: Any, value: Any, what: str) -> List[Tuple[Key, List[NDArray]]]:
    """Normalizes MXNet's key/value forms to ``[(key, [arrays of that key])]``."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise FastPSError(f"kvstore.{what}: {len(key)} keys need as many values")
        out: List[Tuple[Key, List[NDArray]]] = []
        for k, v in zip(key, value):
            out.extend(_pairs(k, v, what))
        return out
    if isinstance(key, bytes):
        key = key.decode()
    if not isinstance(key, (int, str)):
        raise FastPSError(f"kvstore.{what}: keys are int or str, got {type(key).__name__}")
    arrays = list(value) if isinstance(value, (list, tuple)) else [value]
    if not arrays:
        raise FastPSError(f"kvstore.{what}: key {key!r} has no value")
    for a in arrays:
        if not isinstance(a, mx.nd.NDArray):
            raise FastPSError(
                f"kvstore.{what}: key {key!r}: expected NDArrays, got {type(a).__name__}"
            )
        if a.stype != "default":
            raise FastPSError(
                f"kvstore.{what}: key {key!r}: {a.stype} arrays are not supported by the "
                "fastps KVStore; use dense arrays"
            )
    return [(key, arrays)]


def _local_sum(arrays: Sequence[NDArray], into: NDArray) -> None:
    """``into`` = the sum of ``arrays`` (one per device of this worker); engine-async."""
    arrays[0].copyto(into)
    for a in arrays[1:]:
        into += a.as_in_context(into.context)


@KVStoreBase.register
class FastPS(KVStoreBase):
    """MXNet KVStore over fastps. Create with ``mx.kv.create('fastps')``; starts fastps."""

    def __init__(self) -> None:
        if not _api.is_initialized():
            _api.init()
        _collectives.start_session()  # init's broadcast is a collective of the layer
        n = next(_instances)
        self._prefix = "kvstore." if n == 0 else f"kvstore{n}."
        self._store: Dict[Key, NDArray] = {}  # the value pull returns (weights or sums)
        self._send: Dict[Key, NDArray] = {}  # what push sends (local sum, maybe compressed)
        self._recv: Dict[Key, NDArray] = {}  # the summed gradient, when an updater applies it
        self._pending: Dict[Key, Tuple[_CoreHandle, Callable[[], None]]] = {}
        self._updater_fn: Optional[Callable[..., None]] = None
        self._compression: type[Compressor] = Compression.none

    # ------------------------------------------------------------------ identity
    @property
    def type(self) -> str:
        return "dist_sync_fastps"

    @property
    def rank(self) -> int:
        return _api.rank()

    @property
    def num_workers(self) -> int:
        return _api.size()

    @staticmethod
    def is_capable(capability: str) -> bool:
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"Unknown capability: {capability}")

    # --------------------------------------------------------------- internals
    def _name(self, key: Key) -> str:
        return f"{self._prefix}{key}"

    def _finish(self, key: Key) -> None:
        item = self._pending.pop(key, None)
        if item is not None:
            handle, then = item
            handle.synchronize()
            then()

    def _finish_all(self) -> None:
        for key in list(self._pending):
            self._finish(key)

    def _like(
        self, table: Dict[Key, NDArray], key: Key, ref: NDArray, dtype: Any = None
    ) -> NDArray:
        """A host buffer for ``key`` shaped like ``ref`` (created once, then reused)."""
        dtype = ref.dtype if dtype is None else dtype
        buf = table.get(key)
        if buf is None or buf.shape != ref.shape or buf.dtype != dtype:
            buf = mx.nd.zeros(ref.shape, ctx=mx.cpu(), dtype=dtype)
            table[key] = buf
        return buf

    def _stored(self, key: Key, what: str) -> NDArray:
        if key not in self._store:
            raise FastPSError(f"kvstore.{what}: key {key!r} was not initialized (call init first)")
        return self._store[key]

    def _start_push(
        self, key: Key, arrays: List[NDArray], priority: int, snapshot: bool = True
    ) -> None:
        """Starts summing ``arrays`` over devices and workers; finished by ``_finish(key)``.

        ``snapshot=False`` lets the core read a lone host array in place (the caller
        finishes the key before returning, so nobody can change it meanwhile); otherwise
        the values are first summed/copied into a buffer of the store.
        """
        self._finish(key)
        if self._updater_fn is not None:
            self._stored(key, "push")
        direct = (
            not snapshot
            and len(arrays) == 1
            and arrays[0].context.device_type in ("cpu", "cpu_pinned", "cpu_shared")
        )
        if direct:
            send = arrays[0]
        else:
            send = self._like(self._send, key, arrays[0])
            _local_sum(arrays, send)
        sent, ctx = self._compression.compress(send)
        stored = self._store.get(key)
        if self._updater_fn is None and ctx is None:
            # No optimizer: the sum itself is what the store keeps.
            target = (
                self._like(self._store, key, sent)
                if stored is None or stored.shape != sent.shape or stored.dtype != sent.dtype
                else stored
            )
        else:
            target = self._like(self._recv, key, sent)
        handle = _start(sent, target, self._name(key), priority, 1.0)
        updater = self._updater_fn

        def then() -> None:
            grad = target if ctx is None else self._compression.decompress(target, ctx)
            if updater is not None:
                updater(key, grad, self._store[key])
            elif target is not self._store.get(key):
                self._like(self._store, key, grad)[:] = grad

        self._pending[key] = (handle, then)

    # ------------------------------------------------------------------ the API
    def init(self, key: Any, value: Any) -> None:
        """Stores rank 0's ``value`` under ``key`` on every worker."""
        pairs = _pairs(key, value, "init")
        handles = []
        for k, arrays in pairs:
            self._finish(k)
            stored = mx.nd.zeros(arrays[0].shape, ctx=mx.cpu(), dtype=arrays[0].dtype)
            arrays[0].copyto(stored)
            self._store[k] = stored
            handles.append(broadcast_async_(stored, 0, f"{self._name(k)}.init"))
        for h in handles:
            h.synchronize()

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Sums ``value`` over devices and workers into the store (or applies it as a
        gradient when an optimizer is set). Returns at once; the next operation on the key
        waits for it."""
        for k, arrays in _pairs(key, value, "push"):
            self._start_push(k, arrays, priority)

    def pull(
        self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True
    ) -> None:
        """Copies the stored value of ``key`` into ``out`` (an NDArray or a list)."""
        if out is None:
            raise FastPSError("kvstore.pull: out is required")
        for k, arrays in _pairs(key, out, "pull"):
            self._finish(k)
            stored = self._stored(k, "pull")
            for a in arrays:
                stored.copyto(a)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """push then pull; ``out=None`` writes the result into ``value``. Several keys are
        all in flight together."""
        ins = _pairs(key, value, "pushpull")
        outs = ins if out is None else _pairs(key, out, "pushpull")
        if len(outs) != len(ins):
            raise FastPSError("kvstore.pushpull: value and out hold different numbers of keys")
        for k, arrays in ins:
            self._start_push(k, arrays, priority, snapshot=False)
        for (k, _), (_, targets) in zip(ins, outs):
            self._finish(k)
            stored = self._store[k]
            for a in targets:
                stored.copyto(a)

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        """Stores rank 0's ``value`` under ``key`` and copies it into ``out``."""
        self.init(key, value)
        self.pull(key, out, priority)

    def row_sparse_pull(
        self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None
    ) -> None:
        raise FastPSError("the fastps KVStore does not support row_sparse arrays")

    # ----------------------------------------------------- optimizer on the store
    def set_optimizer(self, optimizer: mx.optimizer.Optimizer) -> None:
        """Applies ``optimizer`` to every pushed (summed) gradient, on every worker."""
        self._finish_all()
        self._updater_fn = mx.optimizer.get_updater(optimizer)

    def _set_updater(self, updater: Callable[..., None]) -> None:
        self._finish_all()
        self._updater_fn = updater

    @property
    def _updater(self) -> Any:
        return self._updater_fn

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        if self._updater_fn is None:
            raise FastPSError("kvstore.save_optimizer_states: no optimizer was set")
        self._finish_all()
        with open(fname, "wb") as f:
            f.write(self._updater_fn.get_states(dump_optimizer))  # type: ignore[attr-defined]

    def load_optimizer_states(self, fname: str) -> None:
        if self._updater_fn is None:
            raise FastPSError("kvstore.load_optimizer_states: no optimizer was set")
        self._finish_all()
        with open(fname, "rb") as f:
            self._updater_fn.set_states(f.read())  # type: ignore[attr-defined]

    def set_gradient_compression(self, compression_params: Dict[str, Any]) -> None:
        """``{'type': 'fp16'}`` sends float gradients as float16; ``{'type': 'none'}`` not."""
        kind = str(compression_params.get("type", "none")).lower()
        if kind == "fp16":
            self._compression = Compression.fp16
        elif kind == "none":
            self._compression = Compression.none
        else:
            raise FastPSError(
                f"the fastps KVStore supports gradient compression 'fp16' and 'none', not {kind!r}"
            )

    # --------------------------------------------------------------- misc
    def barrier(self) -> None:
        """Waits for this worker's pushes, then for every worker."""
        self._finish_all()
        _api.barrier()

    _barrier = barrier

    def __getstate__(self) -> Any:
        raise pickle.PicklingError("a fastps KVStore cannot be pickled")


@KVStoreBase.register
class dist_sync_fastps(FastPS):  # noqa: N801 - MXNet registers stores by class name
    """The same store under a name containing 'dist', which Gluon's Trainer accepts as a
    string even with one device per worker."""
