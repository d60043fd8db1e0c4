"""The algorithm API: what a data-parallel training algorithm does at each point of a step.

An :class:`Algorithm` decides what travels, when, and what the summation servers do with
it; the ``DistributedOptimizer`` owns the machinery (a gradient hook per parameter, the
agreed priorities, the in-flight exchanges, every wait with its timeout)::

    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), algorithm=MyAlgorithm()
    )

One step (a *round*) of a training loop ``zero_grad(); loss.backward(); opt.step()`` calls
the hooks in this order, on every rank alike:

1. :meth:`Algorithm.setup` — once, when the ``DistributedOptimizer`` is built, with the
   :class:`Context` (the parameters by name, rank, size, the wrapped optimizer). Refuse
   what the algorithm cannot do here (raise ``ValueError``/``FastPSError`` naming the
   parameter).
2. :meth:`Algorithm.before_backward` — once per round, before the round's first gradient
   is handed over (from the first gradient hook, so autograd has started but nothing has
   been communicated; or from ``step()`` when no gradient arrived).
3. :meth:`Algorithm.on_gradient` — per parameter, as soon as autograd has accumulated its
   gradient (after ``backward_passes_per_step`` passes), while backward goes on with the
   layers below. It starts the exchange for that parameter through the context:
   :meth:`Context.average` (the built-in gradient averaging, fast path and compression
   included) or :meth:`Context.push_pull` (any tensor of the parameter, e.g. a momentum,
   summed or averaged in place, optionally compressed by the core), or nothing (the
   parameter stays local this round). Parameters that got no gradient this round are
   handed over from ``step()`` with a zero gradient, so every rank starts the same
   exchanges.
4. :meth:`Algorithm.after_backward` — in ``step()`` (or ``synchronize()``) once every
   exchange started this round has been waited for; the results are in place.
5. the wrapped optimizer's ``step()``.
6. :meth:`Algorithm.after_step` — after the optimizer's step; the place for work done
   every H steps (local SGD: push the change of the parameters, pull the new ones).

:meth:`Algorithm.server_rule` declares what the servers do with what this algorithm pushes
(:class:`ServerRule`); the core has ``"sum"`` (sum, or average on the way back). A rule that
needs more from the servers is registered with :func:`register_server_rule` by the module
that brings it, and the ``DistributedOptimizer`` refuses an algorithm whose rule nobody
registered, naming it.

Hooks run on the training thread (``on_gradient`` inside autograd's hook, under the
optimizer's lock): keep them short and never block in ``on_gradient``. Every rank must
start the same exchanges (names, shapes, compressors) each round, in any order: the
machinery agrees their priorities.

The default algorithm is :class:`~fastps.torch.algorithms.GradientAveraging` (today's
synchronous averaging, on the exact code path it always took). Worked example (a
gradient-averaging variant that skips parameters it is told to keep local) in
docs/guide/algorithms.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import torch
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

# kind -> checker(rule), this plugin's own (what the MXNet plugin registers is not
# accepted here); ServerRule and the checks are the core's (fastps.worker.algorithm_args).
_RULES = ServerRules()


def register_server_rule(kind: str, check: Callable[[ServerRule], None]) -> None:
    """Makes ``kind`` a server rule the ``DistributedOptimizer`` accepts; ``check(rule)``
    raises when a rule of this kind cannot be used (bad options, a core without it)."""
    _RULES.register(kind, check)


def check_server_rule(rule: ServerRule, algorithm: str) -> None:
    """Raises unless ``rule`` is registered and its checker accepts it."""
    _RULES.check(rule, algorithm)


class Param:
    """One parameter the optimizer updates, as an algorithm sees it.

    ``name``: its name in ``named_parameters`` (the same on every rank); ``tensor``: the
    parameter itself (``tensor.grad`` is this rank's gradient in ``on_gradient``, the
    exchanged one after ``after_backward``); ``index``: its position in the optimizer's
    param groups (the same on every rank); ``group``: the index of its param group."""

    __slots__ = ("name", "tensor", "index", "group")

    def __init__(self, name: str, tensor: torch.Tensor, index: int, group: int) -> None:
        self.name = name
        self.tensor = tensor
        self.index = index
        self.group = group

    def __repr__(self) -> str:
        dtype = str(self.tensor.dtype).replace("torch.", "")
        return f"Param({self.name!r}, {dtype}{list(self.tensor.shape)})"


class Context(ABC):
    """What the ``DistributedOptimizer`` gives an algorithm (in :meth:`Algorithm.setup`)."""

    @property
    @abstractmethod
    def params(self) -> Sequence[Param]:
        """Every parameter, in the optimizer's order."""

    @property
    @abstractmethod
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer (its ``param_groups`` and ``state``)."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This worker's rank."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The number of workers that average."""

    @property
    @abstractmethod
    def step(self) -> int:
        """Rounds applied so far (0 in the first round), the same on every rank."""

    @abstractmethod
    def average(self, p: Param) -> None:
        """Starts the built-in averaging of ``p``'s gradient, in place in ``p.tensor.grad``
        (with the optimizer's ``compression``, if any); waited for before
        ``after_backward``."""

    @abstractmethod
    def push_pull(
        self,
        p: Param,
        tensor: torch.Tensor,
        tag: str,
        compression: Any = None,
        average: bool = True,
    ) -> None:
        """Starts summing (``average``: averaging) ``tensor`` over the workers in place,
        under the name ``f"{tag}.{p.name}"`` with ``p``'s priority; ``compression``: one of
        the core's compressors (``fastps.Compression.onebit(error_feedback=True)``, ...) or
        None. A name must keep one compressor for the whole job. Waited for before
        ``after_backward``; ``tensor`` must stay alive and untouched until then. One
        exchange per parameter per round."""

    @abstractmethod
    def allreduce(
        self, tensor: torch.Tensor, name: str, compression: Any = None, average: bool = True
    ) -> torch.Tensor:
        """Sums (``average``: averages) ``tensor`` over the workers in place and returns it
        once done (a blocking call with the core's timeout): for work outside the gradient
        hooks, e.g. in ``after_step``."""


class Algorithm:
    """Base class of the training algorithms; override the hooks that apply.

    The defaults make a synchronous gradient-averaging algorithm, so a subclass states only
    what it does differently. ``self.ctx`` is the :class:`Context` once :meth:`setup` ran.
    """

    ctx: Context

    @property
    def name(self) -> str:
        """Shown in error messages."""
        return type(self).__name__

    def setup(self, ctx: Context) -> None:
        """Called once by the ``DistributedOptimizer``; overriders call ``super().setup``."""
        self.ctx = ctx

    def server_rule(self) -> ServerRule:
        """What the servers do with this algorithm's pushes (see :class:`ServerRule`)."""
        return SUM

    def before_backward(self) -> None:
        """Once per round, before its first gradient is handed to :meth:`on_gradient`."""

    def on_gradient(self, p: Param) -> None:
        """``p``'s gradient is ready: start its exchange (the default: average it)."""
        self.ctx.average(p)

    def after_backward(self) -> None:
        """Every exchange of the round is done; runs before the optimizer's step."""

    def after_step(self) -> None:
        """Runs after the optimizer's step."""
