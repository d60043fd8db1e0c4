"""1-bit Adam (Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang and He, "1-bit Adam:
Communication Efficient Large-Scale Training with Adam's Convergence Speed", ICML 2021).

Compressing Adam's *gradients* with error feedback does not train (docs/guide/compression.md):
Adam divides each coordinate by √v, which is not linear in the gradient, so the error that
feedback carries to the next round is rescaled by a different √v and never cancels. After a
warm-up Adam's variance v changes slowly, so 1-bit Adam freezes it; the update is then
linear in the momentum m, and m is what travels, compressed with error feedback:

- warm-up (the first ``freeze_step`` steps): plain Adam on gradients averaged exactly (this
  optimizer's step equals ``torch.optim.Adam``'s, bias corrections included);
- compression stage: each worker updates its momentum with its own gradient,
  m ← β₁·m + (1−β₁)·(g + λ·x); the momenta are averaged through the core's onebit codec
  with error feedback on the workers and the servers (sign × mean |·| per part: 1 bit a
  value), which gives every worker the same m; the step is
  x ← x − lr/(1−β₁ᵗ) · m / D with D = √(v_T / (1−β₂ᵀ)) + ε, v_T the variance at the end of
  the warm-up (T = ``freeze_step``).

What travels is m / D (``precondition=True``, the default), not m as in the paper: D is
frozen and the same on every worker, so the average of m / D is the average of m divided by
D (the algorithm is unchanged without compression and error feedback stays exact), but
onebit's one scale per part then fits the coordinates, whose m / D are all of Adam's step
size, instead of m, whose coordinates differ by orders of magnitude: coordinates with a
tiny frozen variance (pixels that are almost always 0) received ±mean |m| / ε, and on the
digits example plain 1-bit Adam turned the weights to NaN within 7 steps of the warm-up's
end. (DeepSpeed asks users for a mask of the coordinates whose momentum is exactly 0; that
does not cover small ones.) ``precondition=False`` sends m, as the paper does.

Usage, as DeepSpeed's ``OneBitAdam`` optimizer with Horovod's wrapper::

    opt = OneBitAdam(model.parameters(), lr=1e-3, freeze_step=200)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

``DistributedOptimizer`` takes the algorithm this optimizer names
(:class:`OneBitAdamAlgorithm`); without it (one process) the optimizer computes the
momentum locally and trains as 1-bit Adam without communication.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Set, Tuple

import torch
from fastps.errors import FastPSError
from fastps.torch.algorithms.base import Algorithm, Param
from fastps.worker.algorithm_args import onebit_adam_args

__all__ = ["OneBitAdam", "OneBitAdamAlgorithm", "SUPPORTED_DTYPES"]

# Adam's state in half precision loses the variance's small values; the codec sums in
# float32 on the servers either way.
SUPPORTED_DTYPES = (torch.float32, torch.float64)

MOMENTUM_TAG = "onebit_adam.momentum"


class OneBitAdam(torch.optim.Optimizer):
    """Adam whose momentum travels at 1 bit per value after ``freeze_step`` warm-up steps.

    ``lr``, ``betas``, ``eps``, ``weight_decay`` (L2, added to the gradient): as
    ``torch.optim.Adam``. ``freeze_step`` (≥ 1): warm-up steps of exact Adam before the
    variance is frozen; the paper and DeepSpeed use 15–25% of the run's steps.
    ``compression``: how the momentum travels (default
    ``fastps.Compression.onebit(error_feedback=True)``; any core compressor with error
    feedback works). ``precondition``: send m / D instead of m (module docstring)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        freeze_step: int = 100,
        compression: Any = None,
        precondition: bool = True,
    ) -> None:
        args = onebit_adam_args(
            [("lr", lr, ">= 0"), ("eps", eps, "> 0"), ("weight_decay", weight_decay, ">= 0")],
            betas,
            freeze_step,
            compression,
        )
        lr, eps, weight_decay = args.rates
        defaults = dict(lr=lr, betas=args.betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.dtype not in SUPPORTED_DTYPES:
                    raise FastPSError(
                        f"OneBitAdam: parameter {pi} of param group {gi} "
                        f"({str(p.dtype).replace('torch.', '')}{list(p.shape)}) has dtype "
                        f"{p.dtype}; supported: float32, float64"
                    )
        self.freeze_step = args.freeze_step
        self.compression = args.compression
        self.precondition = bool(precondition)
        # Parameters whose momentum the algorithm has exchanged this round (by id):
        # their step uses the averaged momentum as it is.
        self._exchanged: Set[int] = set()

    def fastps_algorithm(self) -> Algorithm:
        """The algorithm ``DistributedOptimizer`` runs for this optimizer."""
        return OneBitAdamAlgorithm()

    def _state(self, p: torch.Tensor) -> Dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _group_of(self, p: torch.Tensor) -> Dict[str, Any]:
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise ValueError("OneBitAdam: not one of this optimizer's parameters")

    def compressing(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s next step is past the warm-up (its momentum travels compressed)."""
        state = self.state[p]
        return bool(state) and int(state["step"]) >= self.freeze_step

    def local_momentum_(
        self, p: torch.Tensor, group: Optional[Dict[str, Any]] = None
    ) -> torch.Tensor:
        """m ← β₁·m + (1−β₁)·(g + λ·x) with this worker's gradient, in place; returns m."""
        if p.grad is None:
            raise ValueError("OneBitAdam: the parameter has no gradient")
        group = group or self._group_of(p)
        grad = p.grad
        if group["weight_decay"] != 0:
            grad = grad.add(p.detach(), alpha=group["weight_decay"])
        exp_avg = self._state(p)["exp_avg"]
        exp_avg.lerp_(grad, 1 - group["betas"][0])
        return exp_avg

    def _denominator(self, p: torch.Tensor, group: Dict[str, Any]) -> torch.Tensor:
        """D = √(v_T / (1−β₂ᵀ)) + ε, computed once the warm-up is over (v no longer moves)."""
        state = self.state[p]
        denom = state.get("denom")
        if denom is None:
            correction2 = 1 - group["betas"][1] ** self.freeze_step
            denom = (state["exp_avg_sq"].sqrt() / math.sqrt(correction2)).add_(group["eps"])
            state["denom"] = denom
        return denom

    def exchange_buffer_(self, p: torch.Tensor, group: Dict[str, Any]) -> torch.Tensor:
        """Past the warm-up: updates ``p``'s momentum with this worker's gradient and returns
        the tensor whose average the step needs (m / D, or m without ``precondition``);
        the algorithm averages it in place before ``step()``."""
        m = self.local_momentum_(p, group)
        self._exchanged.add(id(p))
        if not self.precondition:
            return m
        state = self.state[p]
        buf = state.get("exchange")
        if buf is None:
            buf = state["exchange"] = torch.empty_like(m, memory_format=torch.contiguous_format)
        return torch.div(m, self._denominator(p, group), out=buf)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # a copy, then cleared in place: DistributedOptimizer's wrapper shares this set
        exchanged = set(self._exchanged)
        self._exchanged.clear()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise FastPSError("OneBitAdam does not support sparse gradients")
                state = self._state(p)
                past_warmup = int(state["step"]) >= self.freeze_step
                state["step"] += 1
                t = int(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                step_size = group["lr"] / (1 - beta1**t)
                if past_warmup:
                    denom = self._denominator(p, group)
                    if id(p) in exchanged and self.precondition:
                        u = state["exchange"]  # the average of m / D
                        exp_avg.copy_(u).mul_(denom)
                        p.add_(u, alpha=-step_size)
                        continue
                    if id(p) not in exchanged:
                        self.local_momentum_(p, group)
                    p.addcdiv_(exp_avg, denom, value=-step_size)
                    continue
                grad = p.grad
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-step_size)
        return loss


class OneBitAdamAlgorithm(Algorithm):
    """The communication of :class:`OneBitAdam`: averaged gradients during the warm-up,
    then each parameter's momentum, compressed with error feedback, as soon as its gradient
    is ready (the exchange overlaps the rest of backward)."""

    opt: OneBitAdam

    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        opt = ctx.optimizer
        if not isinstance(opt, OneBitAdam):
            raise TypeError(
                f"OneBitAdamAlgorithm needs a fastps.torch.algorithms.OneBitAdam optimizer, "
                f"got {type(opt).__name__}"
            )
        for p in ctx.params:
            if p.tensor.dtype not in SUPPORTED_DTYPES:
                raise FastPSError(
                    f"OneBitAdam: parameter '{p.name}' has dtype {p.tensor.dtype}; supported: "
                    "float32, float64"
                )
            if p.tensor.device.type != "cpu":
                # the momentum is summed in place in host memory
                raise FastPSError(
                    f"OneBitAdam: parameter '{p.name}' is on {p.tensor.device}; only CPU "
                    "parameters are supported"
                )
        self.opt = opt

    def on_gradient(self, p: Param) -> None:
        opt = self.opt
        if not opt.compressing(p.tensor):
            self.ctx.average(p)  # warm-up: exact averages, Adam's own statistics
            return
        sent = opt.exchange_buffer_(p.tensor, opt.param_groups[p.group])
        self.ctx.push_pull(p, sent, MOMENTUM_TAG, compression=opt.compression)
