"""What every framework plugin shares about its session: Horovod's ``basics``.

Its job is to give ``fastps.torch``, ``fastps.tensorflow`` and ``fastps.mxnet`` one
implementation of the calls that are the same in every framework, where each plugin had its
own copy: a :class:`Basics` per plugin holds the plugin's session (``init`` with process
sets and the training mode, ``shutdown``, ``is_initialized``) and answers who this worker
is (rank, size, local and cross rank and size, ``is_homogeneous``, ``num_servers``); the
plugin publishes its bound methods under Horovod's names. It also decides two things each
plugin asks when it wraps an optimizer:

* :meth:`Basics.cross_barrier`: whether updates run cross-barrier, from the ``cross_barrier``
  argument, else ``FASTPS_CROSS_BARRIER`` (``fastps.config``), else the plugin's default;
* :func:`sfb_choice`: whether sufficient-factor broadcasting (``FASTPS_SFB``,
  ``fastps.collectives.sfb``) applies, and if every layer must use the servers after all,
  why.

What differs between frameworks is an argument of :class:`Basics`, not a copy: the error
``rank()`` and ``size()`` raise outside a session (torch: Horovod's ValueError) and the
cross-barrier default.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional, Type

from fastps import config
from fastps.collectives import ops as _ops
from fastps.collectives import sfb as _sfb
from fastps.errors import FastPSError
from fastps.worker import api as _api

__all__ = ["Basics", "SfbChoice", "sfb_choice"]

NOT_INITIALIZED = "fastps has not been initialized; use hvd.init()"


class Basics:
    """One plugin's session and Horovod's who-am-I calls.

    ``plugin``: the plugin's name in messages (``"torch"``). ``uninitialized``: the error
    type ``rank()`` and ``size()`` raise outside a session of this plugin (Horovod's torch:
    ValueError); None: they ask the core, which raises FastPSError before ``fastps.init()``
    and answers after this plugin's ``shutdown()`` while the connections last.
    ``cross_barrier_default``: whether updates run cross-barrier when neither the argument
    nor ``FASTPS_CROSS_BARRIER`` says.
    """

    def __init__(
        self,
        plugin: str,
        uninitialized: Optional[Type[Exception]] = None,
        cross_barrier_default: bool = False,
    ) -> None:
        self.plugin = plugin
        self.uninitialized = uninitialized
        self.cross_barrier_default = cross_barrier_default
        self.active = False  # between init() and shutdown() (the connections outlive a shutdown)

    # ------------------------------------------------------------------ the session

    def init(self, comm: Any = None, process_sets: Any = None, mode: Optional[str] = None) -> None:
        """Joins the job started by ``fastpsrun`` (or runs alone without one).

        ``comm`` is accepted for Horovod compatibility and must be None. ``process_sets``:
        ProcessSets (or rank lists) to register now, the same on every rank (``"dynamic"``:
        none now, any later). ``mode``: "sync" or "async" (docs/guide/async.md), overriding
        FASTPS_MODE. After :meth:`shutdown`, ``init`` starts a new session on the same
        connections.
        """
        if comm is not None:
            raise FastPSError(
                f"fastps.{self.plugin}.init(comm=...): fastps does not use MPI "
                "communicators; launch with fastpsrun"
            )
        _api.init(mode=mode)
        if process_sets == "dynamic":
            process_sets = None  # every set may be added later anyway
        _ops.start_session(process_sets)
        self.active = True

    def shutdown(self) -> None:
        """Ends this session: waits (bounded) for ops in flight and forgets process sets and
        op names. The job's connections stay until the process exits, so :meth:`init` may be
        called again (Horovod's init -> shutdown -> init)."""
        self.active = False
        _ops.end_session()

    def is_initialized(self) -> bool:
        return self.active and _api.is_initialized()

    def _check(self) -> None:
        if self.uninitialized is not None and not self.is_initialized():
            raise self.uninitialized(NOT_INITIALIZED)

    # ------------------------------------------------------------------ who this worker is

    def rank(self) -> int:
        self._check()
        return int(_api.rank())

    def size(self) -> int:
        self._check()
        return int(_api.size())

    def local_rank(self) -> int:
        return int(_api.local_rank())

    def local_size(self) -> int:
        return int(_api.local_size())

    def cross_rank(self) -> int:
        return int(_api.cross_rank())

    def cross_size(self) -> int:
        return int(_api.cross_size())

    def is_homogeneous(self) -> bool:
        """True if every host runs the same number of workers."""
        return self.size() == self.local_size() * self.cross_size()

    def num_servers(self) -> int:
        """The job's summation servers (0 when running alone)."""
        return int(_api.num_servers())

    # ------------------------------------------------------------------ policies

    def cross_barrier(self, option: Optional[bool]) -> bool:
        """Whether an optimizer's updates run cross-barrier: the ``cross_barrier``
        argument, else ``FASTPS_CROSS_BARRIER``, else this plugin's default. Whether the
        optimizer can (its update's coupling, the op, ...) is the plugin's to check."""
        if option is not None:
            if not isinstance(option, bool):
                raise TypeError(f"cross_barrier must be True, False or None, got {option!r}")
            return option
        stated = config.cross_barrier()
        return self.cross_barrier_default if stated is None else stated

    @staticmethod
    def cross_barrier_explicit(option: Optional[bool]) -> bool:
        """Whether the user asked for cross-barrier updates (the argument or the variable)
        rather than getting them by default: only then does falling back warn."""
        return option is True or (option is None and config.cross_barrier() is not None)


@dataclass(frozen=True)
class SfbChoice:
    """SFB applies: ``how`` ("auto" or "on"); ``why_not``: why every layer uses the servers
    after all (the report says it), or None."""

    how: str
    why_not: Optional[str]


def sfb_choice(
    who: str,
    model: Any,
    layers: str,
    *,
    active: bool = True,
    compressed: bool = False,
    op: Optional[str] = None,
    asynchronous: bool = False,
    elastic: bool = False,
    stacklevel: int = 2,
) -> Optional[SfbChoice]:
    """The entry of every plugin's SFB decision, made when its optimizer (trainer, tape)
    is built.

    None when ``FASTPS_SFB`` is off, when this rank reduces nothing (``active`` False) or
    when ``model`` is None (then a warning says ``who(model=...)`` is needed to find the
    ``layers``: every gradient uses the servers). Otherwise the mode, and the first reason
    that rules factors out for every layer: gradient compression (``compressed``), a
    reduction ``op`` (its name) that is not a sum of the gradients, ``asynchronous``
    training, an ``elastic`` job.
    ``stacklevel``: as the caller would give ``warnings.warn``.
    """
    how = _sfb.mode()
    if how == "off" or not active:
        return None
    if model is None:
        warnings.warn(
            f"fastps: FASTPS_SFB={how} needs {who}(model=...) to find the {layers}; every "
            "gradient uses the servers",
            stacklevel=stacklevel + 1,
        )
        return None
    reasons = (
        "gradient compression is on" if compressed else None,
        f"the reduction op ({op}) is not a sum of the gradients" if op else None,
        "async mode exchanges parameters, not gradients" if asynchronous else None,
        "elastic jobs change the worker count the choice was made for" if elastic else None,
    )
    return SfbChoice(how, next((r for r in reasons if r), None))
