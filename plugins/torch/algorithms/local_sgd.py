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
from fastps.worker import outer_mode as _outer

__all__ = ["LocalSGD", "DiLoCo"]

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


register_server_rule("outer", _args.check_outer_rule)


class _Slot:
    """One parameter: host memory the exchange reads and writes (the parameter's own for a
    contiguous CPU tensor, else a staged copy)."""

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

    def stage(self) -> None:
        if self.staged:
            self.host.copy_(self.param.detach())

    def load(self) -> None:
        if self.staged:
            self.param.data.copy_(self.host)


class LocalSGD(_outer.LocalSGDRounds, Algorithm):
    """``H`` local steps, then an outer step on the servers: the mean of the workers'
    deltas applied with outer learning rate ``outer_lr`` and (``momentum`` > 0) SGD
    momentum, Nesterov's if ``nesterov``. The defaults (1, 0) are plain model averaging.

    Every rank must take the same number of steps; :meth:`outer_step` syncs at once (e.g.
    before evaluating, when the step count is not a multiple of ``H``). ``compression``: a
    core compressor for the deltas (None: uncompressed). ``overlap``: a round's exchange
    runs during the next ``H`` local steps and its answer is applied one round late
    (module doc); ``synced`` tells whether the replicas hold one model. The rounds, the
    counters and the forwarding hooks are the core's (``outer_mode.OuterRounds``,
    ``outer_mode.LocalSGDRounds``)."""

    _not_set_up = "build the DistributedOptimizer"

    def __init__(
        self,
        H: int,
        outer_lr: float = 1.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        compression: Any = None,
        overlap: bool = False,
        overlap_warmup: int = 0,
    ) -> None:
        self.config = _args.local_sgd_config(type(self).__name__, H, outer_lr, momentum, nesterov)
        self.H = H
        self.overlap = _args.overlap_flag(type(self).__name__, overlap)
        self.overlap_warmup = _args.overlap_warmup(type(self).__name__, overlap_warmup)
        self.compression: Any = None
        if compression is not None:
            self.adopt_compression(compression)
        self._slots: List[_Slot] = []
        self._rounds: Optional[_outer.OuterRounds] = None

    def adopt_compression(self, compression: Any) -> None:
        """Takes ``DistributedOptimizer(..., compression=c)`` for the deltas (before
        setup); refuses a non-core compressor, or a second one naming both."""
        self.compression = _args.delta_compression(
            type(self).__name__,
            compression,
            self.compression,
            chosen=getattr(self, "_rounds", None) is not None,
            fp16=_TorchCompression.fp16,  # Horovod's spelling: the core's fp16
        )

    def server_rule(self) -> ServerRule:
        c = self.config
        return ServerRule("outer", {"lr": c.lr, "momentum": c.momentum, "nesterov": c.nesterov})

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._slots = [_Slot(p.name, p.tensor) for p in ctx.params]
        self._rounds = _outer.OuterRounds(
            f"algorithm {self.name}",
            self.config,
            self.compression,
            self.overlap,
            self.overlap_warmup,
        )
        # numpy views of the host tensors: the rounds write the parameters' own memory.
        self._rounds.bind([(s.name, s.host.numpy()) for s in self._slots])
        self.reset_parameters()

    def on_gradient(self, p: Any) -> None:
        """Local steps: the gradient stays on this worker."""


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
        overlap_warmup: int = 0,
    ) -> None:
        super().__init__(
            H,
            outer_lr=outer_lr,
            momentum=momentum,
            nesterov=nesterov,
            compression=compression,
            overlap=overlap,
            overlap_warmup=overlap_warmup,
        )
