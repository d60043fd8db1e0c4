"""Waiting for a core push_pull inside MXNet's dependency engine instead of in Python.

MXNet runs every NDArray operation on its engine, ordered by the arrays each operation reads
and writes. :func:`push_wait` pushes one more operation, declared as the *writer* of the
arrays the core sums into, whose body waits for the core's handle. Every operation pushed
afterwards that reads those arrays (the optimizer's update of that parameter, a gradient
norm, ``asnumpy()``) runs after the sum is in, and only after it: the update of the first
layer does not wait for the last layer's sum, and the next forward pass, whose operations
read the updated weights, waits for exactly the updates it reads. Python does not block.

The operation is pushed through MXNet's C API (``MXEnginePushSyncND``, MXNet >= 1.5) with
the ``kCPUPrioritized`` property: it runs on the engine's CPU priority threads
(``MXNET_CPU_PRIORITY_NTHREADS``, default 4), so a wait blocks one of those, never the
worker threads that compute the forward pass. The waits are pushed with the gradients'
priorities (first layer first), the order in which the sums arrive.

An error while waiting (a timeout, a dead peer) cannot fail an engine operation from
Python: it is kept and raised by :func:`raise_pending_error` — at the next ``step()`` or
``wait_for_updates()`` of the trainer.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import mxnet as mx
from fastps.errors import FastPSError

__all__ = ["available", "push_wait", "raise_pending_error"]

_K_CPU_PRIORITIZED = 3  # mxnet::FnProperty::kCPUPrioritized (include/mxnet/engine.h)
_K_CPU = 1  # mxnet::Context::kCPU


class _Context(ctypes.Structure):
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


_SYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)

_lock = threading.Lock()
_ids = itertools.count(1)
_bodies: Dict[int, Callable[[], None]] = {}
_errors: List[BaseException] = []
_cpu = _Context(_K_CPU, 0)
_prop = ctypes.c_int(_K_CPU_PRIORITIZED)


def _run(_rctx: Any, param: Any) -> None:
    """The engine operation's body (on an engine thread, holding the GIL while in Python)."""
    key = int(param or 0)
    with _lock:
        body = _bodies.get(key)
    if body is None:
        return
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - must not unwind into the engine
        with _lock:
            _errors.append(exc)
    finally:
        with _lock:
            _bodies.pop(key, None)


_run_c = _SYNC_FUNC(_run)  # kept alive for the process: the engine calls it


def available() -> bool:
    """Whether this MXNet has ``MXEnginePushSyncND``."""
    return hasattr(mx.base._LIB, "MXEnginePushSyncND")


def push_wait(wait: Callable[[], None], written: Sequence[Any], priority: int, name: str) -> None:
    """Pushes an engine operation that calls ``wait()`` and writes the NDArrays
    ``written`` (CPU arrays): whatever reads them afterwards runs after ``wait`` returned."""
    for arr in written:
        if arr.context.device_type != "cpu":
            raise FastPSError(f"'{name}': engine waits are for CPU arrays, got {arr.context}")
    key = next(_ids)
    with _lock:
        _bodies[key] = wait
    handles = (ctypes.c_void_p * len(written))(*[a.handle.value for a in written])
    rc = mx.base._LIB.MXEnginePushSyncND(
        _run_c,
        ctypes.c_void_p(key),
        None,
        ctypes.byref(_cpu),
        None,
        0,
        handles,
        len(written),
        ctypes.byref(_prop),
        int(priority),
        name.encode(),
    )
    if rc != 0:
        with _lock:
            _bodies.pop(key, None)
        why = mx.base.py_str(mx.base._LIB.MXGetLastError())
        raise FastPSError(f"'{name}': MXEnginePushSyncND failed: {why}")


def raise_pending_error(what: str) -> None:
    """Raises (once) the first error an engine wait met since the last call."""
    with _lock:
        if not _errors:
            return
        first = _errors[0]
        _errors.clear()
    raise FastPSError(f"{what}: a gradient's sum failed while the engine waited for it: {first}")


def pending() -> int:
    """Engine waits pushed and not finished (for tests)."""
    with _lock:
        return len(_bodies)


def drain(timeout: Optional[float] = None) -> None:
    """Waits for every engine operation (``mx.nd.waitall``), then raises a wait's error."""
    del timeout  # the waits themselves time out (the op timeout)
    mx.nd.waitall()
    raise_pending_error("engine wait")
