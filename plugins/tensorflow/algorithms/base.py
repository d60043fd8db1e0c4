"""The algorithm API for Keras optimizers: what a data-parallel training algorithm does at
each point of ``optimizer.apply`` (docs/guide/algorithms.md, "TensorFlow and Keras").

``hvd.DistributedOptimizer(opt, algorithm=...)`` runs an :class:`Algorithm` instead of plain
gradient averaging. Keras hands the optimizer every gradient at once (``apply``, which
``apply_gradients`` and ``model.fit`` call), after backpropagation, so the hooks are per
step rather than per gradient (the torch API's ``on_gradient`` has no Keras counterpart):

1. :meth:`Algorithm.setup` — once, when the ``DistributedOptimizer`` is built, with the
   :class:`Context` (the wrapped optimizer, rank, size). Refuse what the algorithm cannot
   do here (another optimizer, bad settings), naming the culprit.
2. :meth:`Algorithm.build` — once, at the optimizer's first ``apply``, when the variables
   are known (Keras creates the optimizer's own variables then too). Eagerly, even when
   the first ``apply`` is being traced into a ``tf.function``: the place to check dtypes
   and to exchange initial values.
3. :meth:`Algorithm.exchange` — every step, before the wrapped optimizer's update: returns
   the tensors the update is given in place of the gradients (the default: the gradients
   averaged over the workers, :meth:`Context.average`).
4. the wrapped optimizer's update (Keras's ``apply``).
5. :meth:`Algorithm.after_step` — after the update; the place for work done every H steps.

Steps 3 to 5 run eagerly or are traced into a graph (``model.fit`` compiles its train
step): they build TensorFlow ops, and whatever depends on the step count must be decided
by ops (``tf.cond`` on ``ctx.iterations``), not by Python, which runs once at tracing.
Every rank must make the same exchanges each step. With one worker (nothing to average) no
hook runs, as in torch: the wrapped optimizer steps on the local gradients.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, List, Sequence

__all__ = ["Algorithm", "Context"]


class Context(ABC):
    """What the ``DistributedOptimizer`` gives an algorithm (in :meth:`Algorithm.setup`)."""

    @property
    @abstractmethod
    def optimizer(self) -> Any:
        """The wrapped Keras optimizer (the ``DistributedOptimizer`` itself)."""

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
    def iterations(self) -> Any:
        """The optimizer's step counter (a variable: steps applied so far, the same on
        every rank; read it in ops, not in Python, inside a traced step)."""

    @property
    @abstractmethod
    def variables(self) -> List[Any]:
        """The variables the optimizer updates, in its order (empty before
        :meth:`Algorithm.build`)."""

    @property
    @abstractmethod
    def names(self) -> List[str]:
        """A name per variable, the same on every rank: its position and rank 0's Keras
        path (Keras numbers layers per process, so the paths alone may differ)."""

    @abstractmethod
    def average(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """The built-in averaging of ``grads`` (the optimizer's own reduction, with its
        ``compression``): eagerly the averages, in a graph the ops that compute them."""


class Algorithm:
    """Base class of the TensorFlow algorithms; override the hooks that apply.

    The defaults make synchronous gradient averaging, so a subclass states only what it
    does differently. ``self.ctx`` is the :class:`Context` once :meth:`setup` ran."""

    ctx: Context

    @property
    def name(self) -> str:
        """Shown in error messages."""
        return type(self).__name__

    def setup(self, ctx: Context) -> None:
        """Called once by the ``DistributedOptimizer``; overriders call ``super().setup``."""
        self.ctx = ctx

    def build(self, variables: Sequence[Any]) -> None:
        """Called once, eagerly, at the optimizer's first ``apply``."""

    def exchange(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """The tensors the optimizer's update gets in place of ``grads`` (no None among
        them: a variable without a gradient gets zeros, on every rank alike)."""
        return self.ctx.average(grads, variables)

    def after_step(self) -> None:
        """Runs after the optimizer's update (eagerly, or as ops of the traced step)."""
