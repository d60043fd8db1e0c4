"""Lightning's ``optimizer.step(closure)`` on a fastps ``DistributedOptimizer``.

Lightning's precision plugins call ``optimizer.step(closure=...)``, where the closure runs
the training step, backward and the before-step hooks. A torch optimizer runs the closure
inside ``step()``; fastps's ``DistributedOptimizer.step`` waits for the averaged gradients
*before* it runs the wrapped step (so a closure passed to it would compute gradients after
the wait), and defers updates past the step (cross-barrier) only when no closure is given.
:func:`closure_first` makes ``step(closure)`` run the closure first, then fastps's own
``step()`` without one: gradients travel while backward runs, and the update of each
parameter lands when its sum arrives.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["closure_first", "mark_synchronized"]

_SYNCED = "_fastps_lightning_synchronized"


class _ClosureFirst:
    """Put in front of the DistributedOptimizer's class (see :func:`closure_first`)."""

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.__dict__.pop(_SYNCED, False):
            # the strategy already waited for the sums (someone reads the gradients before
            # the step): step without a second wait
            with self.skip_synchronize():  # type: ignore[attr-defined]
                super().step()  # type: ignore[misc]
        else:
            super().step()  # type: ignore[misc]
        return loss


def closure_first(optimizer: Any) -> Any:
    """Makes the fastps ``DistributedOptimizer`` ``optimizer`` run a closure passed to
    ``step`` before its own step; returns it. (It is fastps's own object: its class is a
    subclass fastps made for it, and only its ``step`` changes.)"""
    cls = type(optimizer)
    if issubclass(cls, _ClosureFirst):
        return optimizer
    optimizer.__class__ = type(cls.__name__, (_ClosureFirst, cls), {})
    return optimizer


def mark_synchronized(optimizer: Any) -> None:
    """The gradients of ``optimizer`` were averaged already (``synchronize()``)."""
    optimizer.__dict__[_SYNCED] = True
