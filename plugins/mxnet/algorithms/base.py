"""The algorithm API of the MXNet plugin: what a data-parallel training algorithm does at
each point of a ``DistributedTrainer`` step (the torch plugin's interface,
``fastps.torch.algorithms.base``, with MXNet's arrays)::

    trainer = hvd.DistributedTrainer(params, "adam", {...}, algorithm=MyAlgorithm())

One step (``autograd.backward(); trainer.step(batch_size)``, a *round*) calls the hooks in
this order, on every rank alike:

1. :meth:`Algorithm.setup` — once, with the :class:`Context`: when the
   ``DistributedTrainer`` is built if every parameter has its data by then, else at the
   first ``step()`` (Gluon defers the data of parameters whose shape it infers at the first
   forward pass). Refuse what the algorithm cannot do here, naming the parameter.
2. :meth:`Algorithm.before_backward` — once per round, when ``step()`` starts reducing
   (MXNet's backward has been issued; nothing has been communicated).
3. :meth:`Algorithm.on_gradient` — per parameter, in backward order (last layer first),
   as soon as the engine has written its gradient. It starts the parameter's exchange:
   :meth:`Context.average` (the trainer's gradient averaging),
   :meth:`Context.push_pull` (any host NDArray, summed or averaged in place, optionally
   compressed by the core), or nothing (the parameter stays local this round).
4. :meth:`Algorithm.after_backward` — once every exchange of the round has been waited for.
5. the optimizer's update (``gluon.Trainer._update``: the updater, one call per parameter).
6. :meth:`Algorithm.after_step` — after the update; the place for work done every H steps.

:meth:`Algorithm.server_rule` declares what the servers do with the pushes
(:class:`ServerRule`); the trainer refuses an algorithm whose rule nobody registered with
:func:`register_server_rule`. With one worker (nothing to exchange) only ``setup`` runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import numpy as np
from fastps.worker.algorithm_args import SUM, ServerRule, ServerRules

__all__ = [
    "Algorithm",
    "Context",
    "Param",
    "ServerRule",
    "SUM",
    "register_server_rule",
    "check_server_rule",
]


# kind -> checker(rule), this plugin's own (what the torch plugin registers is not
# accepted here); ServerRule and the checks are the core's (fastps.worker.algorithm_args).
_RULES = ServerRules()


def register_server_rule(kind: str, check: Callable[[ServerRule], None]) -> None:
    """Makes ``kind`` a server rule the ``DistributedTrainer`` accepts; ``check(rule)``
    raises when a rule of this kind cannot be used."""
    _RULES.register(kind, check)


def check_server_rule(rule: ServerRule, algorithm: str) -> None:
    """Raises unless ``rule`` is registered and its checker accepts it."""
    _RULES.check(rule, algorithm)


class Param:
    """One parameter the trainer updates, as an algorithm sees it.

    ``name``: the Gluon parameter's name (the same on every rank); ``index``: its index in
    the trainer (the optimizer's index of it, the same on every rank); ``parameter``: the
    ``gluon.Parameter``. ``data`` / ``grad``: its NDArrays on its (first) device; ``grad``
    is this rank's gradient in ``on_gradient``, the exchanged one after ``after_backward``."""

    __slots__ = ("name", "index", "parameter")

    def __init__(self, name: str, index: int, parameter: Any) -> None:
        self.name = name
        self.index = index
        self.parameter = parameter

    @property
    def data(self) -> Any:
        return self.parameter.list_data()[0]

    @property
    def grad(self) -> Any:
        return self.parameter.list_grad()[0]

    def __repr__(self) -> str:
        shape = list(self.parameter.shape or ())
        return f"Param({self.name!r}, {np.dtype(self.parameter.dtype).name}{shape})"


class Context(ABC):
    """What the ``DistributedTrainer`` gives an algorithm (in :meth:`Algorithm.setup`)."""

    @property
    @abstractmethod
    def params(self) -> Sequence[Param]:
        """Every parameter with a gradient, in the trainer's order."""

    @property
    @abstractmethod
    def optimizer(self) -> Any:
        """The trainer's ``mx.optimizer.Optimizer`` (read it anew: ``load_states`` replaces
        it)."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This worker's rank."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The number of workers."""

    @property
    @abstractmethod
    def step(self) -> int:
        """Rounds applied so far (0 in the first round), the same on every rank."""

    @property
    @abstractmethod
    def prefix(self) -> str:
        """The trainer's tensor-name prefix (the same on every rank; unique per trainer)."""

    @abstractmethod
    def optimizer_state(self, p: Param) -> Any:
        """The optimizer's state of ``p`` as the updater keeps it (created now, as the
        updater would, if the parameter has had no update yet)."""

    @abstractmethod
    def average(self, p: Param) -> None:
        """Starts the trainer's averaging of ``p``'s gradient, in place; waited for before
        ``after_backward``."""

    @abstractmethod
    def push_pull(
        self, p: Param, array: Any, tag: str, compression: Any = None, average: bool = True
    ) -> None:
        """Starts summing (``average``: averaging) the host NDArray ``array`` over the
        workers in place, under the name ``f"{prefix}{tag}.{p.name}"`` with ``p``'s
        priority; ``compression``: one of the core's compressors or None (a name keeps
        one compressor for the whole job). Waited for before ``after_backward``; leave
        ``array`` untouched until then. One exchange per parameter per round."""

    @abstractmethod
    def allreduce(
        self, array: Any, name: str, compression: Any = None, average: bool = True
    ) -> Any:
        """Sums (``average``: averages) the host NDArray ``array`` over the workers in
        place and returns it once done (blocking, with the core's timeout)."""


class Algorithm:
    """Base class of the training algorithms; override the hooks that apply. The defaults
    make synchronous gradient averaging. ``self.ctx`` is the :class:`Context` once
    :meth:`setup` ran."""

    ctx: Context

    @property
    def name(self) -> str:
        """Shown in error messages."""
        return type(self).__name__

    def setup(self, ctx: Context) -> None:
        """Called once by the ``DistributedTrainer``; overriders call ``super().setup``."""
        self.ctx = ctx

    def server_rule(self) -> ServerRule:
        """What the servers do with this algorithm's pushes."""
        return SUM

    def before_backward(self) -> None:
        """Once per round, before its first gradient is handed to :meth:`on_gradient`."""

    def on_gradient(self, p: Param) -> None:
        """``p``'s gradient is ready: start its exchange (the default: average it)."""
        self.ctx.average(p)

    def after_backward(self) -> None:
        """Every exchange of the round is done; runs before the optimizer's update."""

    def after_step(self) -> None:
        """Runs after the optimizer's update."""
