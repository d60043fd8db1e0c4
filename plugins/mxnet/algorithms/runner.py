"""Drives an :class:`~fastps.mxnet.algorithms.base.Algorithm` from a ``DistributedTrainer``
(training.py): ``_allreduce_grads`` hands each gradient, in backward order, to
:meth:`Runner.round`'s ``on_gradient`` calls instead of starting its averaging, waits for
what the algorithm started (each wait with the core's op timeout), then calls
``after_backward``; ``_update`` calls :meth:`Runner.after_step` after the optimizer's update.
The runner is the algorithm's :class:`Context`.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.mxnet.algorithms.base import Algorithm, Context, Param, check_server_rule
from fastps.mxnet.compression import Compression, is_core
from fastps.mxnet.ops import _HOST_DEVICES, _start
from fastps.worker import api as _api
from fastps.worker.algorithm_args import chosen_algorithm

__all__ = ["Runner", "resolve"]

_DeferredInit: Any = None


def _deferred_init_error() -> Any:
    global _DeferredInit
    if _DeferredInit is None:
        import mxnet as mx

        _DeferredInit = mx.gluon.parameter.DeferredInitializationError
    return _DeferredInit


def resolve(algorithm: Any, compression: Any, optimizer: Any) -> Optional[Algorithm]:
    """The algorithm a ``DistributedTrainer`` runs, or None for its own averaging path.
    ``algorithm=None`` takes the optimizer's choice (``OneBitAdam`` names its algorithm
    with a ``fastps_algorithm()`` method)."""
    algorithm = chosen_algorithm(
        algorithm, optimizer, Algorithm, "DistributedTrainer", "fastps.mxnet.algorithms.Algorithm"
    )
    if algorithm is None:
        return None
    if compression not in (None, Compression.none):
        raise ValueError(
            f"DistributedTrainer: compression={compression!r} applies to the built-in "
            f"gradient averaging; algorithm {algorithm.name} decides what it compresses"
        )
    check_server_rule(algorithm.server_rule(), algorithm.name)
    return algorithm


class Runner(Context):
    """The Context of one algorithm in one ``DistributedTrainer``."""

    def __init__(self, algorithm: Algorithm, trainer: Any) -> None:
        self.algorithm = algorithm
        # The trainer holds the runner: a weak reference back keeps it collectable.
        self._trainer = weakref.ref(trainer)
        self._params = [
            Param(p.name, i, p) for i, p in enumerate(trainer._params) if p.grad_req != "null"
        ]
        self._by_index = {p.index: p for p in self._params}
        self.ready = False  # setup ran
        # index -> (tensor name, handle, whether the gradient itself was exchanged)
        self._pending: Dict[int, Tuple[str, Any, bool]] = {}

    # ------------------------------------------------------------------ Context

    @property
    def params(self) -> Sequence[Param]:
        return self._params

    @property
    def optimizer(self) -> Any:
        return self._live()._optimizer

    @property
    def rank(self) -> int:
        return int(_api.rank())

    @property
    def size(self) -> int:
        return int(_api.size())

    @property
    def step(self) -> int:
        return int(self._live()._fastps_rounds)

    @property
    def prefix(self) -> str:
        return str(self._live()._fastps_prefix)

    def optimizer_state(self, p: Param) -> Any:
        updater = self._live()._updaters[0]
        weight = p.data
        idx = p.index
        if idx not in updater.states:
            updater.states[idx] = updater.optimizer.create_state_multi_precision(idx, weight)
            updater.states_synced[idx] = True
        elif not updater.states_synced[idx]:
            updater.states[idx] = updater.sync_state_context(updater.states[idx], weight.context)
            updater.states_synced[idx] = True
        return updater.states[idx]

    def average(self, p: Param) -> None:
        t = self._live()
        self._claim(p)
        grad = p.grad
        f = t._fastps_predivide
        if f != 1.0:
            grad *= 1.0 / f
        name = f"{t._fastps_prefix}grad.{p.index}"
        # A gradient backward wrote this step has no reader left from the last one.
        fresh = bool(p.data._fresh_grad)
        try:
            handle = _start(
                grad,
                grad,
                name,
                t._fastps_priority[p.index],
                f / self.size,
                out_wait="read" if fresh else "write",
                quorum=False,
            )
        except FastPSError as exc:
            raise FastPSError(f"parameter '{p.name}': {exc}") from None
        self._pending[p.index] = (name, handle, True)

    def push_pull(
        self, p: Param, array: Any, tag: str, compression: Any = None, average: bool = True
    ) -> None:
        t = self._live()
        name = f"{t._fastps_prefix}{tag}.{p.name}"
        if compression is not None and not is_core(compression):
            raise FastPSError(
                f"algorithm {self.algorithm.name}: push_pull of '{name}' takes one of the "
                f"core's compressors (fastps.Compression...) or None, got {compression!r}"
            )
        if array.context.device_type not in _HOST_DEVICES:
            raise FastPSError(
                f"algorithm {self.algorithm.name}: push_pull of '{name}' needs a host (cpu) "
                f"NDArray (it is summed in place), got one on {array.context}"
            )
        self._claim(p)
        scale = 1.0 / self.size if average else 1.0
        # Every worker's push counts (quorum=False): the result becomes replicated state.
        try:
            handle = _start(
                array,
                array,
                name,
                t._fastps_priority[p.index],
                scale,
                out_wait="write",
                compression=compression,
                quorum=False,
            )
        except FastPSError as exc:
            raise FastPSError(f"parameter '{p.name}': {exc}") from None
        self._pending[p.index] = (name, handle, False)

    def allreduce(
        self, array: Any, name: str, compression: Any = None, average: bool = True
    ) -> Any:
        if compression is not None and not is_core(compression):
            raise FastPSError(
                f"algorithm {self.algorithm.name}: allreduce of '{name}' takes one of the "
                f"core's compressors (fastps.Compression...) or None, got {compression!r}"
            )
        scale = 1.0 / self.size if average else 1.0
        _start(array, array, name, 0, scale, compression=compression).synchronize()
        return array

    # ------------------------------------------------------------------ the trainer's side

    def data_ready(self) -> bool:
        """Whether every parameter has its data (Gluon may defer it to the first forward)."""
        try:
            for p in self._params:
                p.parameter.list_data()
        except _deferred_init_error():
            return False
        return True

    def ensure_setup(self) -> None:
        if not self.ready:
            self.algorithm.setup(self)
            self.ready = True

    def round(self) -> None:
        """One round's exchanges (from the trainer's ``_allreduce_grads``)."""
        t = self._live()
        self.ensure_setup()
        self._pending.clear()
        self.algorithm.before_backward()
        handed: List[Tuple[Param, Any]] = []
        for i, param, _grad in t._local_grads():  # sums a worker's devices into the first
            p = self._by_index[i]
            handed.append((p, param))
            self.algorithm.on_gradient(p)
        # Results arrive in priority order, so waiting in that order wastes nothing.
        order = sorted(self._pending, key=lambda i: -t._fastps_priority[i])
        pending, self._pending = self._pending, {}
        for i in order:
            name, handle, _ = pending[i]
            try:
                handle.synchronize()
            except FastPSError as exc:
                raise type(exc)(f"parameter '{self._by_index[i].name}': {exc}") from None
        for _p, param in handed:  # every device updates with the same gradient
            grads = param.list_grad()
            for other in grads[1:]:
                grads[0].copyto(other)
        self.algorithm.after_backward()

    def after_step(self) -> None:
        self.algorithm.after_step()

    # ------------------------------------------------------------------ helpers

    def _claim(self, p: Param) -> None:
        if self._by_index.get(p.index) is not p:
            raise ValueError(f"{p!r} is not this trainer's parameter {p.index}")
        if p.index in self._pending:
            raise FastPSError(
                f"algorithm {self.algorithm.name}: parameter '{p.name}' already has an "
                "exchange in flight this round (one per parameter)"
            )

    def _live(self) -> Any:
        trainer = self._trainer()
        if trainer is None:
            raise FastPSError(f"algorithm {self.algorithm.name}: its trainer is gone")
        return trainer
