"""Local SGD and DiLoCo for MXNet, with the outer optimizer on the summation servers
(docs/guide/local-sgd.md; the torch plugin's ``fastps.torch.algorithms.LocalSGD``).

Every worker runs the trainer's (inner) optimizer on its own gradients for ``H`` steps with
no communication; then it pushes the change of its parameters since the last outer step
and receives, in the same exchange, the parameters after the servers' outer step
(``core/worker/outer_mode.py``, ``csrc/server/outer_optimizer.h``)::

    trainer = hvd.DistributedTrainer(
        net.collect_params(), "adam", {"learning_rate": 1e-3}, algorithm=DiLoCo(H=8)
    )

``LocalSGD``: plain model averaging (outer lr 1, no momentum). ``DiLoCo`` (Douillard et al.
2023): SGD with Nesterov momentum on the averaged delta (outer lr 0.7, momentum 0.9). The
inner optimizer's state stays on each worker.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
from fastps.errors import FastPSError
from fastps.mxnet.algorithms.base import Algorithm, Context, ServerRule, register_server_rule
from fastps.worker import algorithm_args as _args
from fastps.worker import outer_mode as _outer

__all__ = ["LocalSGD", "DiLoCo"]

_HOST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))


register_server_rule("outer", _args.check_outer_rule)


class _Slot:
    """One parameter: a host copy the exchange reads and writes. ``name``: the tensor's name
    on the servers (the trainer's prefix and the parameter's name)."""

    def __init__(self, name: str, parameter: Any) -> None:
        dtype = np.dtype(parameter.dtype)
        if dtype not in _HOST_DTYPES:
            raise FastPSError(
                f"local SGD parameter '{parameter.name}': dtype {dtype.name} is not supported "
                "(float32, float64, float16)"
            )
        self.name = name
        self.parameter = parameter
        self.host = parameter.list_data()[0].asnumpy()  # a copy, in host memory

    def stage(self) -> None:
        self.host[...] = self.parameter.list_data()[0].asnumpy()

    def load(self) -> None:
        for data in self.parameter.list_data():  # every device of this worker
            data[:] = self.host


class LocalSGD(_outer.LocalSGDRounds, Algorithm):
    """``H`` local steps, then an outer step on the servers: the mean of the workers'
    deltas applied with outer learning rate ``outer_lr`` and (``momentum`` > 0) SGD
    momentum, Nesterov's if ``nesterov``. The defaults (1, 0) are plain model averaging.

    Every rank must take the same number of steps; :meth:`outer_step` syncs at once (e.g.
    before evaluating, when the step count is not a multiple of ``H``). ``overlap``: a
    round's exchange runs during the next ``H`` local steps and its answer is applied one
    round late (docs/guide/local-sgd.md, "Overlapped rounds"); ``synced`` tells whether the
    replicas hold one model. The rounds, the counters and the forwarding hooks are the
    core's (``outer_mode.OuterRounds``, ``outer_mode.LocalSGDRounds``)."""

    _not_set_up = (
        "build the DistributedTrainer; with parameters Gluon initializes at the first "
        "forward pass, take one step"
    )

    def __init__(
        self,
        H: int,
        outer_lr: float = 1.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        overlap: bool = False,
        overlap_warmup: int = 0,
    ) -> None:
        self.config = _args.local_sgd_config(type(self).__name__, H, outer_lr, momentum, nesterov)
        self.H = H
        self.overlap = _args.overlap_flag(type(self).__name__, overlap)
        self.overlap_warmup = _args.overlap_warmup(type(self).__name__, overlap_warmup)
        self._slots: List[_Slot] = []
        self._rounds: Optional[_outer.OuterRounds] = None

    def server_rule(self) -> ServerRule:
        c = self.config
        return ServerRule("outer", {"lr": c.lr, "momentum": c.momentum, "nesterov": c.nesterov})

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._slots = [_Slot(f"{ctx.prefix}{p.name}", p.parameter) for p in ctx.params]
        self._rounds = _outer.OuterRounds(
            f"algorithm {self.name}",
            self.config,
            overlap=self.overlap,
            warmup=self.overlap_warmup,
        )
        self._rounds.bind([(s.name, s.host) for s in self._slots])
        self.reset_parameters()

    def on_gradient(self, p: Any) -> None:
        """Local steps: the gradient stays on this worker."""


class DiLoCo(LocalSGD):
    """DiLoCo: ``H`` inner steps (typically Adam), then SGD with Nesterov momentum on the
    averaged delta, run by the servers (outer lr 0.7, momentum 0.9 as in the paper)."""

    def __init__(
        self,
        H: int,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        overlap: bool = False,
        overlap_warmup: int = 0,
    ) -> None:
        super().__init__(
            H,
            outer_lr=outer_lr,
            momentum=momentum,
            nesterov=nesterov,
            overlap=overlap,
            overlap_warmup=overlap_warmup,
        )
