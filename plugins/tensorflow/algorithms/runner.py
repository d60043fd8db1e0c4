"""Drives an :class:`~fastps.tensorflow.algorithms.base.Algorithm` from the Keras
``DistributedOptimizer`` (optimizer.py): its ``apply`` hands the step to :meth:`Runner.apply`
instead of reducing the gradients itself. The runner is the algorithm's :class:`Context`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf
from fastps.collectives import ops as C
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.tensorflow.algorithms.base import Algorithm, Context
from fastps.tensorflow.algorithms.gradient_averaging import GradientAveraging
from fastps.tensorflow.compression import Compression
from fastps.worker.algorithm_args import chosen_algorithm

__all__ = ["Runner", "resolve"]


def resolve(algorithm: Any, compression: Any, optimizer: Any) -> Tuple[Any, Optional[Algorithm]]:
    """(compression, algorithm) for the ``DistributedOptimizer``: None for the algorithm
    means the built-in averaging path. ``algorithm=None`` takes the optimizer's own choice
    (an optimizer that needs one, like ``OneBitAdam``, names it with a
    ``fastps_algorithm()`` method), else plain averaging."""
    algorithm = chosen_algorithm(
        algorithm,
        optimizer,
        Algorithm,
        "DistributedOptimizer",
        "fastps.tensorflow.algorithms.Algorithm",
    )
    if algorithm is None:
        return compression, None
    unset = (None, Compression.none)
    if type(algorithm) is GradientAveraging:
        mine = algorithm.compression
        if mine is not None and compression not in unset and compression is not mine:
            raise ValueError(
                f"DistributedOptimizer: compression={compression!r} and algorithm={algorithm!r} "
                "name two compressors; give it to one of them"
            )
        return (mine if mine is not None else compression), None
    if compression not in unset:
        adopt = getattr(algorithm, "adopt_compression", None)
        if adopt is not None:  # e.g. LocalSGD / DiLoCo: compressed deltas
            adopt(compression)
            return Compression.none, algorithm
        raise ValueError(
            f"DistributedOptimizer: compression={compression!r} applies to the built-in "
            f"gradient averaging; algorithm {algorithm.name} decides what it compresses"
        )
    return Compression.none, algorithm


class Runner(Context):
    """The Context of one algorithm in one Keras ``DistributedOptimizer``.

    ``sync`` is the optimizer's ``OptimizerGradients`` (its built-in reduction)."""

    def __init__(self, algorithm: Algorithm, optimizer: Any, sync: Any) -> None:
        self.algorithm = algorithm
        # The optimizer holds the runner: a weak reference back keeps it collectable.
        self._optimizer = weakref.ref(optimizer)
        self._sync = sync
        self._variables: Optional[List[Any]] = None
        self._names: List[str] = []

    # ------------------------------------------------------------------ Context

    @property
    def optimizer(self) -> Any:
        opt = self._optimizer()
        if opt is None:
            raise FastPSError(f"algorithm {self.algorithm.name}: its optimizer is gone")
        return opt

    @property
    def rank(self) -> int:
        return int(C.global_process_set.rank())

    @property
    def size(self) -> int:
        return int(C.global_process_set.size())

    @property
    def iterations(self) -> Any:
        return self.optimizer.iterations

    @property
    def variables(self) -> List[Any]:
        return list(self._variables or [])

    @property
    def names(self) -> List[str]:
        return list(self._names)

    def average(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        return list(self._sync.reduce(list(grads), list(variables)))

    # ------------------------------------------------------------------ the optimizer's side

    def alone(self) -> bool:
        """Nothing to exchange: one worker in a world that cannot grow."""
        return C.global_process_set.size() == 1 and not E.world_may_change()

    def apply(
        self, update: Callable[[List[Any]], Any], grads: Sequence[Any], variables: Sequence[Any]
    ) -> Any:
        """One step: the algorithm's exchange, ``update`` (the wrapped optimizer's apply)
        on its result, then the algorithm's ``after_step``."""
        algo = self.algorithm
        opt = self.optimizer
        variables = list(variables)
        if self._variables is None:
            if not opt.built:
                opt.build(variables)  # the optimizer's own variables, before they are read
            with tf.init_scope():  # eagerly, even while the step is being traced
                self._build(variables)
        elif [id(v) for v in variables] != [id(v) for v in self._variables]:
            raise FastPSError(
                f"algorithm {algo.name}: this step updates other variables than the first "
                f"one did ({len(variables)} instead of {len(self._variables)}); an algorithm "
                "keeps the set of variables it was built with"
            )
        if self.alone():
            return update(list(grads))
        E.refuse_xla(f"algorithm {algo.name}")
        if self._sync._local_ids():
            raise FastPSError(
                f"algorithm {algo.name} exchanges every variable; local variables "
                "(register_local_var, PartialDistributedOptimizer) need plain averaging"
            )
        dense = [
            tf.zeros_like(tf.convert_to_tensor(v)) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)
        ]
        exchanged = algo.exchange(dense, variables)
        # The update is given the exchanged tensors (OneBitAdam reads this while it is traced).
        object.__setattr__(opt, "_fastps_exchanged", True)
        try:
            result = update(list(exchanged))
        finally:
            object.__setattr__(opt, "_fastps_exchanged", False)
        algo.after_step()
        return result

    def _build(self, variables: List[Any]) -> None:
        algo = self.algorithm
        group = E.group_of(variables)
        paths = [E.label_of(v) for v in variables]
        if self.size > 1:
            # Every worker's variables (dtype, shape), once: a model that differs fails at
            # once on every rank, naming the first difference. Keras numbers layers per
            # process, so rank 0's paths name the variables.
            gathered = E.call(
                C.allgather_object,
                (group.keys, group.labels, paths),
                f"fastps.algorithm.{algo.name}.variables",
            )
            groups = [E.Group(list(k), list(lab)) for k, lab, _p in gathered]
            if any(g.keys != groups[0].keys for g in groups):
                raise E.MismatchError(
                    E.describe_difference(f"the variables of algorithm {algo.name}", groups)
                )
            paths = list(gathered[0][2])
        self._names = [f"{i}.{path}" for i, path in enumerate(paths)]
        self._variables = variables
        algo.build(variables)
