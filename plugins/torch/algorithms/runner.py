"""Drives an :class:`~fastps.torch.algorithms.base.Algorithm` from the
``DistributedOptimizer``'s machinery (optimizer.py): the gradient hooks hand each ready
gradient to :meth:`Runner.start` instead of starting its averaging, ``synchronize()`` calls
:meth:`Runner.after_backward` once it has waited for every exchange, ``step()`` calls
:meth:`Runner.after_step`. The runner is the algorithm's :class:`Context`: what it starts
is tracked on the parameter's entry, so the optimizer's waits (each with the core's op
timeout), error handling and priorities apply to it unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from fastps.elastic import inplace as _inplace
from fastps.errors import FastPSError
from fastps.torch.algorithms.base import Algorithm, Context, Param, check_server_rule
from fastps.torch.algorithms.gradient_averaging import GradientAveraging
from fastps.torch.compression import Compression
from fastps.torch.ops import Average, Sum, _allreduce_op, _allreduce_start, global_process_set
from fastps.worker.algorithm_args import chosen_algorithm

__all__ = ["Runner", "resolve"]


def resolve(
    algorithm: Any, compression: Any, optimizer: torch.optim.Optimizer
) -> Tuple[Any, Optional[Algorithm]]:
    """(compression, algorithm) for the ``DistributedOptimizer``: None for the algorithm
    means the built-in averaging path. ``algorithm=None`` takes the optimizer's own choice
    (an optimizer that needs one, like ``OneBitAdam``, names it with a
    ``fastps_algorithm()`` method), else plain averaging."""
    algorithm = chosen_algorithm(
        algorithm, optimizer, Algorithm, "DistributedOptimizer", "fastps.torch.algorithms.Algorithm"
    )
    if algorithm is None:
        return compression, None
    if type(algorithm) is GradientAveraging:
        mine = algorithm.compression
        if mine is not None and compression not in (None, Compression.none, mine):
            raise ValueError(
                f"DistributedOptimizer: compression={compression!r} and algorithm={algorithm!r} "
                "name two compressors; give it to one of them"
            )
        return (mine if mine is not None else compression), None
    if compression not in (None, Compression.none):
        adopt = getattr(algorithm, "adopt_compression", None)
        if adopt is not None:  # e.g. LocalSGD / DiLoCo: compressed deltas
            adopt(compression)
            check_server_rule(algorithm.server_rule(), algorithm.name)
            return None, algorithm
        raise ValueError(
            f"DistributedOptimizer: compression={compression!r} applies to the built-in "
            f"gradient averaging; algorithm {algorithm.name} decides what it compresses"
        )
    check_server_rule(algorithm.server_rule(), algorithm.name)
    return compression, algorithm


class Runner(Context):
    """The Context of one algorithm in one ``DistributedOptimizer``."""

    def __init__(self, algorithm: Algorithm, sync: Any, optimizer: torch.optim.Optimizer) -> None:
        self.algorithm = algorithm
        # The sync holds the runner: a weak reference back keeps a dropped optimizer
        # collectable even after gc.freeze (heap.py).
        self._sync = weakref.ref(sync)
        self._optimizer = optimizer
        self._params: List[Param] = []
        self.open = False  # before_backward ran for the current round
        self.handed: Set[int] = set()  # entries handed to on_gradient this round
        # Entries averaged through the built-in path this round (average()): the fusion
        # plan's rows (optimizer.py, _GradientSync._plan_fusion).
        self.averaged: Set[int] = set()

    # ------------------------------------------------------------------ Context

    @property
    def params(self) -> Sequence[Param]:
        sync = self._live()
        if len(self._params) != len(sync.entries):  # a param group was added
            groups: Dict[int, int] = {}
            for gi, group in enumerate(self._optimizer.param_groups):
                for p in group["params"]:
                    groups.setdefault(id(p), gi)
            prefix = len("grad.")
            self._params = [
                Param(e.name[prefix:], e.param, e.index, groups.get(id(e.param), 0))
                for e in sync.entries
            ]
        return self._params

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def rank(self) -> int:
        return int((self._live().process_set or global_process_set).rank())

    @property
    def size(self) -> int:
        return int((self._live().process_set or global_process_set).size())

    @property
    def step(self) -> int:
        return int(self._live().rounds)

    def average(self, p: Param) -> None:
        sync = self._live()
        e = self._entry(sync, p)
        type(sync)._start(sync, e)  # the class's, not the runner's
        self.averaged.add(e.index)

    def push_pull(
        self,
        p: Param,
        tensor: torch.Tensor,
        tag: str,
        compression: Any = None,
        average: bool = True,
    ) -> None:
        sync = self._live()
        e = self._entry(sync, p)
        if e.busy:
            raise FastPSError(
                f"algorithm {self.algorithm.name}: parameter '{p.name}' already has an "
                "exchange in flight this round (one per parameter)"
            )
        if not (tensor.is_contiguous() and tensor.device.type == "cpu"):
            raise FastPSError(
                f"algorithm {self.algorithm.name}: push_pull of '{tag}.{p.name}' needs a "
                "contiguous CPU tensor (it is summed in place)"
            )
        if _inplace.keeping():
            _inplace.block(f"algorithm {self.algorithm.name} exchanges its own tensors")
        if sync.agreed is None:
            sync._agree_priorities()
        e.handle = self._start(
            sync, tensor, f"{tag}.{p.name}", compression, average, sync.priority(e)
        )

    def allreduce(
        self, tensor: torch.Tensor, name: str, compression: Any = None, average: bool = True
    ) -> torch.Tensor:
        sync = self._live()
        self._start(sync, tensor, name, compression, average, 0).synchronize()
        return tensor

    # ------------------------------------------------------------------ the optimizer's side

    def start(self, e: Any) -> None:
        """Replaces the sync's ``_start``: a ready gradient (or, from ``step()``, a missing
        one) goes to the algorithm, once per round."""
        if e.index in self.handed:
            return
        self.handed.add(e.index)
        if not self.open:
            self.open = True
            self.algorithm.before_backward()
        p = e.param
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): exchange zeros.
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        self.algorithm.on_gradient(self.params[e.index])

    def after_backward(self) -> None:
        self.open = False
        self.handed.clear()
        self.algorithm.after_backward()

    def after_step(self) -> None:
        self.algorithm.after_step()

    def discard(self) -> None:
        """An elastic reset dropped the round's exchanges."""
        self.open = False
        self.handed.clear()
        self.averaged.clear()

    def take_averaged(self) -> Set[int]:
        """The entries averaged this round, and a fresh set for the next."""
        taken, self.averaged = self.averaged, set()
        return taken

    # ------------------------------------------------------------------ helpers

    def _live(self) -> Any:
        sync = self._sync()
        if sync is None:
            raise FastPSError(f"algorithm {self.algorithm.name}: its optimizer is gone")
        return sync

    @staticmethod
    def _entry(sync: Any, p: Param) -> Any:
        e = sync.entries[p.index]
        if e.param is not p.tensor:
            raise ValueError(f"parameter '{p.name}' is not this optimizer's parameter {p.index}")
        return e

    def _start(
        self,
        sync: Any,
        tensor: torch.Tensor,
        name: str,
        compression: Any,
        average: bool,
        priority: int,
    ) -> Any:
        op = Average if average else Sum
        # Every worker's push counts (quorum=False): the result becomes replicated state
        # (a momentum, parameters) that must be the same on every rank.
        if sync.direct:
            return _allreduce_start(
                tensor, True, name, op, 1.0, 1.0, compression, priority, quorum=False
            )
        return _allreduce_op(
            tensor, True, name, op, 1.0, 1.0, sync.process_set, compression, priority
        )
