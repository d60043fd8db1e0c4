"""The session of ``fastps.torch``: ``init`` / ``shutdown`` and who this worker is (rank,
size, local and cross ranks). Its own module so that the plugin's other modules (elastic
training among them) can ask without importing the package that imports them."""

from __future__ import annotations

from typing import Any, Optional

import fastps
from fastps.collectives import ops as _collectives
from fastps.errors import FastPSError

_active = False  # between init() and shutdown() (the connections outlive a shutdown)


def init(comm: Any = None, process_sets: Any = None, mode: Optional[str] = None) -> None:
    """Joins the job started by ``fastpsrun`` (or runs alone without one).

    ``process_sets``: ProcessSets (or rank lists) to register now, the same on every rank.
    After :func:`shutdown`, ``init`` starts a new session on the same connections.
    ``mode``: "sync" or "async" (docs/guide/async.md), overriding FASTPS_MODE.
    """
    global _active
    if comm is not None:
        raise FastPSError("fastps does not use MPI communicators; launch with fastpsrun")
    fastps.init(mode=mode)
    if process_sets == "dynamic":
        process_sets = None  # every set may be added later anyway
    _collectives.start_session(process_sets)
    _active = True


def shutdown() -> None:
    """Ends this session: waits (bounded) for ops in flight and forgets process sets and
    op names. The job's connections stay until the process exits, so :func:`init` may be
    called again (Horovod's init -> shutdown -> init)."""
    global _active
    _active = False
    _collectives.end_session()


def is_initialized() -> bool:
    return _active and bool(fastps.is_initialized())


def _check_init() -> None:
    if not is_initialized():
        raise ValueError("fastps has not been initialized; use hvd.init()")


def rank() -> int:
    _check_init()
    return int(fastps.rank())


def size() -> int:
    _check_init()
    return int(fastps.size())


def local_rank() -> int:
    return int(fastps.local_rank())


def local_size() -> int:
    return int(fastps.local_size())


def cross_rank() -> int:
    return int(fastps.cross_rank())


def cross_size() -> int:
    return int(fastps.cross_size())


def num_servers() -> int:
    return int(fastps.num_servers())
