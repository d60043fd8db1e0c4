"""Local SGD and DiLoCo with the outer optimizer on the summation servers
(docs/guide/local-sgd.md).

Every worker runs the wrapped (inner) optimizer on its own gradients for ``H`` steps with no
communication at all; then it pushes the change of its parameters since the last outer step
(its delta) and receives, in the same exchange, the parameters after the servers' outer
step: the mean of the n deltas, applied by an outer optimizer whose state (the momentum)
the servers keep per parameter part (``csrc/server/outer_optimizer.h``)::

    opt = hvd.DistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        named_parameters=model.named_parameters(),
        algorithm=DiLoCo(H=8),  # or LocalSGD(H=4)
    )

``LocalSGD``: the outer step is plain averaging (outer lr 1, no momentum): after it every
worker holds the mean of the workers' parameters. ``DiLoCo`` (Douillard et al. 2023): SGD
with Nesterov momentum on the averaged delta (outer lr 0.7, momentum 0.9 by default). The
inner optimizer's state (e.g. Adam's moments) stays on each worker, as in DiLoCo.

``compression`` (a core compressor: ``fastps.Compression.fp16``, ``.onebit(error_feedback=
True)``, ...; also given as ``DistributedOptimizer(..., compression=c)``) sends the deltas
compressed; the servers decode them before the outer step and answer with the parameters,
uncompressed. Quorum rounds (FASTPS_ROUND_QUORUM) close an outer round with the first k
deltas (docs/guide/local-sgd.md, "Composition").

``overlap=True`` hides the exchange behind the next ``H`` local steps (overlapped local SGD,
as in CoCoD-SGD, Shen et al. 2019, and Overlap Local-SGD, Wang et al. 2020): a round starts
and training goes on; its answer is applied at the next round, keeping the local progress
made meanwhile (x <- answer + x - x at the round's start). Each worker then holds the
servers' parameters of the previous round plus its own steps since; ``outer_step()`` waits
and syncs every replica to one model (before evaluating or checkpointing).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
from fastps.errors import FastPSError
from fastps.torch.algorithms.base import Algorithm, Context, ServerRule, register_server_rule
from fastps.torch.compression import Compression as _TorchCompression
from fastps.worker import algorithm_args as _args
from fastps.worker import api as _api
from fastps.worker import outer_mode as _outer

__all__ = ["LocalSGD", "DiLoCo"]

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


register_server_rule("outer", _args.check_outer_rule)


class _Slot:
    """One parameter: host memory the exchange reads and writes, and its value at the last
    outer step (the anchor every delta is taken from)."""

    def __init__(self, name: str, param: torch.Tensor) -> None:
        if param.dtype not in _HOST_DTYPES:
            raise FastPSError(
                f"local SGD parameter '{name}': dtype {param.dtype} is not supported "
                "(float32, float64, float16)"
            )
        self.name = name
        self.param = param
        on_host = param.device.type == "cpu" and param.is_contiguous()
        self.host = param.data if on_host else param.detach().to("cpu").contiguous()
        self.staged = not on_host
        self.anchor = self.host.clone()
        self.delta = torch.empty_like(self.host)
        # Overlapped rounds only: where the servers' answer lands while training goes on.
        self.answer: Optional[torch.Tensor] = None

    def answer_buffer(self) -> torch.Tensor:
        if self.answer is None:
            self.answer = torch.empty_like(self.host)
        return self.answer

    def stage(self) -> None:
        if self.staged:
            self.host.copy_(self.param.detach())

    def load(self) -> None:
        if self.staged:
            self.param.data.copy_(self.host)


class LocalSGD(Algorithm):
    """``H`` local steps, then an outer step on the servers: the mean of the workers'
    deltas applied with outer learning rate ``outer_lr`` and (``momentum`` > 0) SGD
    momentum, Nesterov's if ``nesterov``. The defaults (1, 0) are plain model averaging.

    Every rank must take the same number of steps; :meth:`outer_step` syncs at once (e.g.
    before evaluating, when the step count is not a multiple of ``H``). ``compression``: a
    core compressor for the deltas (None: uncompressed). ``overlap``: a round's exchange
    runs during the next ``H`` local steps and its answer is applied one round late
    (module doc); ``synced`` tells whether the replicas hold one model."""

    def __init__(
        self,
        H: int,
        outer_lr: float = 1.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        compression: Any = None,
        overlap: bool = False,
    ) -> None:
        self.config = _args.local_sgd_config(type(self).__name__, H, outer_lr, momentum, nesterov)
        if not isinstance(overlap, bool):
            raise TypeError(
                f"{type(self).__name__}: overlap must be True or False, got {overlap!r}"
            )
        self.H = H
        self.overlap = overlap
        self._rebase = False  # overlap: take the anchor from the parameters at the next round
        self.compression: Any = None
        if compression is not None:
            self.adopt_compression(compression)
        self.local_steps = 0  # optimizer steps since the last outer step
        self.outer_steps = 0
        self._slots: List[_Slot] = []
        self._exchange: Optional[_outer.OuterExchange] = None

    def __repr__(self) -> str:
        text = _args.local_sgd_repr(type(self).__name__, self.H, self.config, self.compression)
        return text[:-1] + ", overlap=True)" if self.overlap else text

    def adopt_compression(self, compression: Any) -> None:
        """Takes ``DistributedOptimizer(..., compression=c)`` for the deltas (before
        setup); refuses a non-core compressor, or a second one naming both."""
        self.compression = _args.delta_compression(
            type(self).__name__,
            compression,
            self.compression,
            chosen=getattr(self, "_exchange", None) is not None,
            fp16=_TorchCompression.fp16,  # Horovod's spelling: the core's fp16
        )

    def server_rule(self) -> ServerRule:
        c = self.config
        return ServerRule("outer", {"lr": c.lr, "momentum": c.momentum, "nesterov": c.nesterov})

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._slots = [_Slot(p.name, p.tensor) for p in ctx.params]
        self._exchange = _outer.OuterExchange(
            f"algorithm {self.name}", self.config, compression=self.compression
        )
        self.reset_parameters()

    def on_gradient(self, p: Any) -> None:
        """Local steps: the gradient stays on this worker."""

    @property
    def synced(self) -> bool:
        """Whether every replica holds the same parameters now: no local step since the
        last outer step and (``overlap``) no round in flight. :meth:`outer_step` makes it so."""
        ex = self._exchange
        return self.local_steps == 0 and not (ex is not None and ex.in_flight)

    def before_backward(self) -> None:
        if self._rebase:
            # After an elastic reset the state sync gave every rank rank 0's committed
            # parameters: the next delta counts from them.
            self._rebase = False
            with torch.no_grad():
                for s in self._slots:
                    s.stage()
                    s.anchor.copy_(s.host)

    def after_step(self) -> None:
        self.local_steps += 1
        if self.local_steps >= self.H:
            if self.overlap:
                self._overlapped_round()
            else:
                self.outer_step()

    def on_reset(self) -> None:
        """An elastic reset callback (``state.register_reset_callbacks([algo.on_reset])``):
        the state rolls back to the last commit, which the loop takes right after an outer
        step (``local_steps == 0``), so the local steps count from zero again. The new
        generation's servers are started at the next outer step (:meth:`outer_step`).
        ``overlap``: the round in flight died with its session; the next delta counts from
        the parameters the state sync restores (rank 0's)."""
        self.local_steps = 0
        if self.overlap:
            if self._exchange is not None:
                self._exchange.abandon()
            self._rebase = True

    def reset_parameters(self) -> None:
        """Rank 0's parameters become every worker's and the servers' (the outer optimizer
        starts afresh: no momentum). Called at setup; call it on every rank after changing
        the parameters outside training (e.g. rank 0 loaded a checkpoint)."""
        ex = self._exchange
        if ex is None:
            raise FastPSError(f"algorithm {self.name}: not set up (build the DistributedOptimizer)")
        if ex.in_flight:
            ex.finish()  # every rank takes part in the round in flight; its answer is void
        self._rebase = False
        with torch.no_grad():
            for s in self._slots:
                s.stage()
            ex.init([(s.name, s.host.numpy()) for s in self._slots])
            for s in self._slots:
                s.load()
                s.anchor.copy_(s.host)
        self.local_steps = 0

    def outer_step(self) -> None:
        """Pushes this worker's delta since the last outer step and loads the parameters
        after the servers' outer step (every rank must call it alike). ``overlap``: first
        waits for the round in flight, then takes a blocking round of the steps since it
        began, so that afterwards every replica holds the same parameters."""
        ex = self._exchange
        if ex is None:
            raise FastPSError(f"algorithm {self.name}: not set up (build the DistributedOptimizer)")
        if self.overlap and ex.in_flight:
            self._land_round(ex)
            if self.local_steps == 0:
                return  # no step since that round began: every replica holds its answer
        with torch.no_grad():
            self._take_deltas(ex)
            ex.step([(s.name, s.delta.numpy(), s.host.numpy()) for s in self._slots])
            for s in self._slots:
                s.load()
                s.anchor.copy_(s.host)
        self.local_steps = 0
        self.outer_steps += 1

    def _take_deltas(self, ex: _outer.OuterExchange) -> None:
        """Each slot's delta: its parameters now minus its anchor (under no_grad)."""
        for s in self._slots:
            s.stage()
            torch.sub(s.host, s.anchor, out=s.delta)
        if ex.session is not None and ex.session is not _api.session():
            # An elastic membership change brought new servers holding nothing: they start
            # from rank 0's anchor (the survivors' common last outer step), then take this
            # round's deltas; the outer momentum restarts from zero.
            ex.init([(s.name, s.anchor.numpy()) for s in self._slots])

    def _land_round(self, ex: _outer.OuterExchange) -> None:
        """Waits for the round in flight and moves this worker onto its result, keeping the
        local progress made since the round began: x <- answer + (x - x at its start).
        Afterwards ``anchor`` is the answer, so the next delta is that local progress."""
        ex.finish()
        with torch.no_grad():
            for s in self._slots:
                assert s.answer is not None
                s.stage()
                s.host.sub_(s.anchor).add_(s.answer)  # anchor: x when the round began
                s.anchor.copy_(s.answer)
                s.load()

    def _overlapped_round(self) -> None:
        """An outer round that does not stop training (``overlap=True``): land the previous
        round (its answer arrived during the last H local steps), then start this one with
        the delta since that round's answer and go on training from the current parameters;
        its answer is applied at the next round. Every worker trains on the mean of the
        workers' progress up to the previous round plus its own progress since then."""
        ex = self._exchange
        assert ex is not None
        if ex.in_flight:
            self._land_round(ex)
        with torch.no_grad():
            self._take_deltas(ex)
            ex.start([(s.name, s.delta.numpy(), s.answer_buffer().numpy()) for s in self._slots])
            for s in self._slots:
                s.anchor.copy_(s.host)  # x at this round's start, for _land_round
        self.local_steps = 0
        self.outer_steps += 1


class DiLoCo(LocalSGD):
    """DiLoCo: ``H`` inner steps (typically AdamW), then SGD with Nesterov momentum on the
    averaged delta, run by the servers (outer lr 0.7, momentum 0.9 as in the paper)."""

    def __init__(
        self,
        H: int,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        compression: Any = None,
        overlap: bool = False,
    ) -> None:
        super().__init__(
            H,
            outer_lr=outer_lr,
            momentum=momentum,
            nesterov=nesterov,
            compression=compression,
            overlap=overlap,
        )
