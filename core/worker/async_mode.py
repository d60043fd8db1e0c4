"""Asynchronous mode on the core's data plane (docs/guide/async.md), for every plugin.

The servers keep each parameter (``csrc/server/param_store.h``). :func:`init_params` sets
their value from rank 0 and gives it to every worker; :func:`update_async` pushes the delta
a worker's local optimizer step made and receives, in the same exchange, the parameters as
they now stand on the servers (every worker's deltas so far); :func:`read_params` fetches
them without changing them (a checkpoint from any worker). With ``FASTPS_STALENESS = s`` the
servers hold a worker's answer while it is more than ``s`` updates ahead of the slowest.

Arrays are host memory (numpy, or anything with the buffer protocol or DLPack); each
parameter is named, and the name must be the same on every worker. With one worker there is
no server: the functions leave the arrays as they are (local training).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
from fastps.worker import api
from fastps.worker.buffers import raw_buffer

__all__ = [
    "MODE_UPDATE",
    "MODE_INIT",
    "MODE_READ",
    "init_params",
    "update_async",
    "read_params",
    "replace_params",
    "async_requested",
    "DeltaExchange",
]

# PushMode in csrc/worker/handle.h.
MODE_UPDATE = 1
MODE_INIT = 2
MODE_READ = 3

_PREFIX = "async."


def _alone() -> bool:
    return api.size() == 1


def _start(arr: Any, out: Any, name: str, mode: int, send: bool, priority: int) -> api.Handle:
    src = raw_buffer(arr, f"async parameter '{name}'")
    dst = raw_buffer(out, f"async parameter '{name}'", writable=True)
    return api.push_pull_raw(
        src, dst, _PREFIX + name, priority=priority, send=send, receive=True, mode=mode
    )


def init_params(named: Sequence[Tuple[str, Any]]) -> None:
    """Every worker's arrays become rank 0's, which the servers keep from now on."""
    if _alone():
        return
    root = api.rank() == 0
    handles: List[api.Handle] = [_start(arr, arr, name, MODE_INIT, root, 0) for name, arr in named]
    for h in handles:
        h.synchronize()


def update_async(named: Sequence[Tuple[str, Any, Any]]) -> List[api.Handle]:
    """Starts one exchange per (name, delta, out): the servers add delta to the parameter,
    and out receives the parameter as it stands then. Wait on the handles returned."""
    if _alone():
        return []
    return [_start(delta, out, name, MODE_UPDATE, True, 0) for name, delta, out in named]


def read_params(named: Sequence[Tuple[str, Any]]) -> None:
    """Overwrites each array with the parameter the servers hold (no update)."""
    if _alone():
        return
    handles = [_start(arr, arr, name, MODE_READ, False, 0) for name, arr in named]
    for h in handles:
        h.synchronize()


def replace_params(named: Sequence[Tuple[str, Any]]) -> None:
    """Rank 0's arrays replace the servers' parameters and every worker's arrays (call it on
    every worker, e.g. after rank 0 loaded a checkpoint). A later init is answered with the
    value the server holds when it arrives, which may be the old one on a rank whose init
    beats rank 0's: so every rank inits, waits at a barrier, then reads."""
    if _alone():
        return
    init_params(named)
    api.barrier()
    read_params(named)


def async_requested(kwargs: Dict[str, Any], mode: str, who: str = "DistributedOptimizer") -> bool:
    """Whether a plugin's wrapper trains asynchronously: ``async=True`` (a keyword in Python:
    pass ``**{"async": True}``) or its alias ``asynchronous=True``, popped from ``kwargs``;
    neither (or None): ``mode``, i.e. FASTPS_MODE / init(mode=...). Any other keyword left
    in ``kwargs`` is refused by name."""
    flags = {k: kwargs.pop(k) for k in ("async", "asynchronous") if k in kwargs}
    flags = {k: v for k, v in flags.items() if v is not None}  # None: not said
    if kwargs:
        raise TypeError(f"{who} got unexpected keyword arguments {sorted(kwargs)}")
    if len(set(map(bool, flags.values()))) > 1:
        raise ValueError(f"{who}: async and asynchronous disagree ({flags})")
    if flags:
        return bool(next(iter(flags.values())))
    return mode == "async"


def session() -> Any:
    """The running core session. An elastic membership change starts a new one with new
    servers, which hold no parameters yet: a wrapper that initialized the servers in an
    earlier session initializes them again (from rank 0's restored parameters)."""
    return api._st()


def current_mode() -> str:
    """FASTPS_MODE / init(mode=...) once fastps is initialized, else "sync"."""
    return api.mode() if api.is_initialized() else "sync"


class DeltaExchange:
    """One async step for a plugin that can show its parameters as host arrays: the
    parameters before the wrapped optimizer's local step, the delta it made, and the
    parameters the servers answer with (written in place into ``after``).

    The first exchange starts the servers from rank 0's parameters *before* its step
    (:func:`init_params`), then adds every worker's first delta: the plugins whose variables
    appear only at the first step (Keras, Gluon's deferred init) need no separate init call.
    So does the first exchange of a new core session (an elastic membership change brings
    new servers, which hold nothing: they start from rank 0's restored parameters).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        # The core session whose servers hold the parameters (None: none yet); a new
        # session (an elastic membership change: new servers) starts them again.
        self.session: Any = None

    def step(
        self,
        names: Sequence[str],
        before: Sequence[np.ndarray],
        after: Sequence[np.ndarray],
    ) -> None:
        """``before[i]``: parameter i before the local step (overwritten); ``after[i]``:
        after it, overwritten with the servers' value. Blocks until every answer is in."""
        if not (len(names) == len(before) == len(after)):
            raise ValueError(
                f"{self.what}: {len(names)} names, {len(before)} parameters before the step, "
                f"{len(after)} after"
            )
        if _alone():
            return  # local training: the local step is the step
        if self.session is not session():
            # after - before is this worker's delta; rank 0's `before` becomes everyone's.
            deltas = [np.subtract(a, b) for a, b in zip(after, before)]
            init_params(list(zip(names, before)))
            self.session = session()
        else:
            deltas = [np.subtract(a, b, out=b) for a, b in zip(after, before)]
        handles = update_async(list(zip(names, deltas, after)))
        for name, h in zip(names, handles):
            try:
                h.synchronize()
            except Exception as exc:
                raise type(exc)(f"{self.what}: parameter '{name}': {exc}") from None

    def pull(self, named: Sequence[Tuple[str, np.ndarray]]) -> None:
        read_params(named)

    def push(self, named: Sequence[Tuple[str, np.ndarray]]) -> None:
        replace_params(named)
        self.session = session()
