"""1-bit Adam for MXNet (Tang et al., ICML 2021; the torch plugin's
``fastps.torch.algorithms.OneBitAdam``, docs/guide/algorithms.md).

- warm-up (the first ``freeze_step`` updates of a parameter): Adam on gradients averaged
  exactly, with torch's formula (ε added to the bias-corrected √v);
- compression stage: the variance v is frozen; each worker updates its momentum with its
  own gradient, m ← β₁·m + (1−β₁)·(g + λ·x), the momenta (m / D with ``precondition``, the
  default) are averaged through the core's onebit codec with error feedback, and the step
  is x ← x − lr/(1−β₁ᵗ) · m / D with D = √(v_T / (1−β₂ᵀ)) + ε.

An ``mx.optimizer.Optimizer``, registered as ``"onebitadam"``, wrapped the Horovod way::

    trainer = hvd.DistributedTrainer(
        net.collect_params(), "onebitadam", {"learning_rate": 1e-3, "freeze_step": 200}
    )

The trainer runs :class:`OneBitAdamAlgorithm` by itself (the optimizer names it); so does
``hvd.DistributedOptimizer(OneBitAdam(...))`` for the Module API, one parameter per
update call. Without either (one process, a plain ``gluon.Trainer``) the momentum is
computed locally and nothing is exchanged.

Settings: MXNet's names (``learning_rate``, ``beta1``, ``beta2``, ``epsilon``, ``wd``,
and the base optimizer's ``rescale_grad``, ``clip_gradient``, ``lr_scheduler``, ...) or
torch's (``lr``, ``betas``, ``eps``, ``weight_decay``), plus ``freeze_step``,
``compression`` and ``precondition`` as in torch. The gradient a step uses is MXNet Adam's:
``rescale_grad`` × grad plus ``wd`` × weight (L2), clipped to ±``clip_gradient`` if set.
The step itself is torch's, in the parameters' precision (float32 or float64), on host
memory: parameters live on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Set, Tuple

import mxnet as mx
import numpy as np
from fastps.errors import FastPSError
from fastps.mxnet.algorithms.base import Algorithm, Context, Param
from fastps.mxnet.ops import _HOST_DEVICES, _view, _wait_to_read, _wait_to_write, dtype_name
from fastps.worker.algorithm_args import adam_pair, onebit_adam_args

__all__ = ["OneBitAdam", "OneBitAdamAlgorithm", "SUPPORTED_DTYPES", "MOMENTUM_TAG"]

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

MOMENTUM_TAG = "onebit_adam.momentum"


def _either(mx_name: str, mx_value: Any, torch_name: str, torch_value: Any, default: Any) -> Any:
    """(the name the caller used, its value): MXNet's name, torch's, or the default."""
    if mx_value is not None and torch_value is not None:
        raise TypeError(f"OneBitAdam: give {mx_name} or {torch_name}, not both")
    if torch_value is not None:
        return torch_name, torch_value
    return mx_name, default if mx_value is None else mx_value


@mx.optimizer.Optimizer.register
class OneBitAdam(mx.optimizer.Optimizer):
    """Adam whose momentum travels at 1 bit per value after ``freeze_step`` warm-up updates.

    ``learning_rate`` (or ``lr``, default 1e-3), ``beta1``/``beta2`` (or ``betas``, default
    (0.9, 0.999)), ``epsilon`` (or ``eps``, default 1e-8), ``wd`` (or ``weight_decay``,
    default 0, L2): as Adam. ``freeze_step`` (≥ 1, default 100): warm-up updates of exact
    Adam before the variance is frozen (15–25% of the run in the paper and DeepSpeed).
    ``compression``: how the momentum travels (default
    ``fastps.Compression.onebit(error_feedback=True)``; any core compressor).
    ``precondition`` (default True): send m / D instead of m (docs/guide/algorithms.md)."""

    def __init__(
        self,
        learning_rate: Optional[float] = None,
        beta1: Optional[float] = None,
        beta2: Optional[float] = None,
        epsilon: Optional[float] = None,
        freeze_step: int = 100,
        compression: Any = None,
        precondition: bool = True,
        lr: Optional[float] = None,
        betas: Optional[Tuple[float, float]] = None,
        eps: Optional[float] = None,
        weight_decay: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        lr_name, lr_value = _either("learning_rate", learning_rate, "lr", lr, 1e-3)
        eps_name, eps_value = _either("epsilon", epsilon, "eps", eps, 1e-8)
        wd_name, wd_value = _either("wd", kwargs.pop("wd", None), "weight_decay", weight_decay, 0.0)
        if betas is not None:
            if beta1 is not None or beta2 is not None:
                raise TypeError("OneBitAdam: give beta1/beta2 or betas, not both")
            beta_names = ("betas[0]", "betas[1]")
            beta_values = adam_pair(betas)
        else:
            beta_names = ("beta1", "beta2")
            beta_values = (0.9 if beta1 is None else beta1, 0.999 if beta2 is None else beta2)
        args = onebit_adam_args(
            [
                (lr_name, lr_value, ">= 0"),
                (eps_name, eps_value, "> 0"),
                (wd_name, wd_value, ">= 0"),
            ],
            beta_values,
            freeze_step,
            compression,
            beta_names=beta_names,
        )
        lr_value, eps_value, wd_value = args.rates
        super().__init__(learning_rate=lr_value, wd=wd_value, **kwargs)
        self.beta1, self.beta2 = args.betas
        self.epsilon = eps_value
        self.freeze_step = args.freeze_step
        self.compression = args.compression
        self.precondition = bool(precondition)
        # Parameters (by index) whose momentum the algorithm exchanged for their next
        # update, and the buffers it exchanged (m / D): scratch, never saved.
        self._exchanged: Set[Any] = set()
        self._buffers: Dict[Any, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state["_exchanged"] = set()
        state["_buffers"] = {}
        return dict(state)

    def fastps_algorithm(self) -> Algorithm:
        """The algorithm ``DistributedTrainer`` runs for this optimizer."""
        return OneBitAdamAlgorithm()

    # ------------------------------------------------------------------ state

    def _name(self, index: Any) -> str:
        param = self.param_dict.get(index)
        if param is not None:
            return str(param.name)
        return str(self.idx2name.get(index, index))

    def create_state(self, index: Any, weight: Any) -> Any:
        dtype = np.dtype(weight.dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise FastPSError(
                f"OneBitAdam: parameter '{self._name(index)}' ({dtype.name}"
                f"{list(weight.shape)}) has dtype {dtype.name}; supported: float32, float64"
            )
        if weight.context.device_type not in _HOST_DEVICES:
            # the step runs on host memory, where the core sums the momentum in place
            raise FastPSError(
                f"OneBitAdam: parameter '{self._name(index)}' is on {weight.context}; only "
                "CPU parameters are supported"
            )
        zeros = mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype)
        # [m, v, D (set once the warm-up is over: v no longer moves)]
        return [zeros, zeros.copy(), None]

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        # float16 is refused by create_state, so there is never a master copy to keep
        return self.create_state(index, weight)

    def _count(self, index: Any) -> int:
        """Updates of ``index`` done so far (MXNet's update count, from begin_num_update)."""
        return int(self._index_update_count.get(index, self.begin_num_update))

    def compressing(self, index: Any) -> bool:
        """Whether the next update of ``index`` is past the warm-up (its momentum travels
        compressed)."""
        return self._count(index) >= self.freeze_step

    def _gradient(self, index: Any, weight: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """The gradient of a step as MXNet's Adam takes it: ``rescale_grad`` × grad plus
        L2 weight decay, clipped to ±``clip_gradient`` if set (a new array)."""
        g = grad * self.rescale_grad
        wd = self._get_wd(index)
        if wd:
            g += wd * weight
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        return g

    def local_momentum_(self, index: Any, weight: Any, grad: Any, state: Any) -> Any:
        """m ← β₁·m + (1−β₁)·(g + λ·x) with this worker's gradient, in place; returns m."""
        g = self._gradient(index, _host(weight, False), _host(grad, False))
        m = _host(state[0], True)
        m += (1.0 - self.beta1) * (g - m)  # torch's lerp_
        return state[0]

    def _denominator(self, state: Any) -> np.ndarray:
        """D = √(v_T / (1−β₂ᵀ)) + ε, computed once the warm-up is over (v no longer
        moves); kept in the state, so a saved state holds it."""
        if state[2] is None:
            correction2 = 1.0 - self.beta2**self.freeze_step
            d = np.sqrt(_host(state[1], False)) / math.sqrt(correction2) + self.epsilon
            state[2] = mx.nd.array(d, ctx=state[1].context, dtype=state[1].dtype)
        return _host(state[2], False)

    def exchange_buffer_(self, index: Any, weight: Any, grad: Any, state: Any) -> Any:
        """Past the warm-up: updates the momentum with this worker's gradient and returns
        the NDArray whose average the update needs (m / D, or m itself without
        ``precondition``); the caller averages it in place before the update."""
        m = self.local_momentum_(index, weight, grad, state)
        self._exchanged.add(index)
        if not self.precondition:
            return m
        buf = self._buffers.get(index)
        if buf is None or buf.shape != m.shape:
            buf = self._buffers[index] = mx.nd.empty(m.shape, m.context, dtype=m.dtype)
        np.divide(_host(m, False), self._denominator(state), out=_host(buf, True))
        return buf

    # ------------------------------------------------------------------ the update

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        if isinstance(index, (list, tuple)):  # an updater that aggregates
            for i, w, g, s in zip(index, weight, grad, state):
                self.update(i, w, g, s)
            return
        if grad.stype != "default":
            raise FastPSError("OneBitAdam does not support sparse gradients")
        past_warmup = self.compressing(index)
        exchanged = index in self._exchanged
        self._exchanged.discard(index)
        self._update_count(index)
        t = self._index_update_count[index]
        step_size = self._get_lr(index) / (1.0 - self.beta1**t)
        if past_warmup:
            denom = self._denominator(state)
            x = _host(weight, True)
            if exchanged and self.precondition:
                u = _host(self._buffers[index], False)  # the average of m / D
                np.multiply(u, denom, out=_host(state[0], True))
                x -= step_size * u
                return
            if not exchanged:
                self.local_momentum_(index, weight, grad, state)
            x -= step_size * (_host(state[0], False) / denom)
            return
        x = _host(weight, True)
        g = self._gradient(index, x, _host(grad, False))
        m, v = _host(state[0], True), _host(state[1], True)
        m += (1.0 - self.beta1) * (g - m)
        v *= self.beta2
        v += (1.0 - self.beta2) * g * g
        denom = np.sqrt(v) / math.sqrt(1.0 - self.beta2**t) + self.epsilon
        x -= step_size * (m / denom)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self.update(index, weight, grad, state)


def _host(arr: Any, write: bool) -> np.ndarray:
    """A numpy view of a host NDArray's memory once the engine has no pending write of it
    (``write``: nor read): the step runs in numpy, in the arrays' own precision, as
    torch's does (MXNet's fused ``adam_update`` takes its settings as float32)."""
    if write:
        _wait_to_write(arr)
    else:
        _wait_to_read(arr)
    return _view(arr, dtype_name(arr))


class OneBitAdamAlgorithm(Algorithm):
    """The communication of :class:`OneBitAdam` in a ``DistributedTrainer``: averaged
    gradients during the warm-up, then each parameter's momentum, compressed with error
    feedback."""

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        opt = ctx.optimizer
        if not isinstance(opt, OneBitAdam):
            raise TypeError(
                f"OneBitAdamAlgorithm needs a fastps.mxnet.algorithms.OneBitAdam optimizer, "
                f"got {type(opt).__name__}"
            )
        for p in ctx.params:
            check_parameter(p.name, p.parameter)

    def on_gradient(self, p: Param) -> None:
        opt = self.ctx.optimizer  # read anew: the trainer's load_states replaces it
        if not opt.compressing(p.index):
            self.ctx.average(p)  # warm-up: exact averages, Adam's own statistics
            return
        state = self.ctx.optimizer_state(p)
        sent = opt.exchange_buffer_(p.index, p.data, p.grad, state)
        self.ctx.push_pull(p, sent, MOMENTUM_TAG, compression=opt.compression)


def check_parameter(name: str, parameter: Any) -> None:
    """Refuses, naming it, a Gluon parameter 1-bit Adam cannot exchange."""
    dtype = np.dtype(parameter.dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise FastPSError(
            f"OneBitAdam: parameter '{name}' has dtype {dtype.name}; supported: float32, float64"
        )
    contexts = parameter.list_ctx()
    if len(contexts) != 1:
        # the momentum lives in one updater's state; several devices would each keep one
        raise FastPSError(
            f"OneBitAdam: parameter '{name}' lives on {len(contexts)} devices; one device per "
            "worker process (fastpsrun -np N, one process per device)"
        )
    if contexts[0].device_type not in _HOST_DEVICES:
        # the momentum is summed in place in host memory
        raise FastPSError(
            f"OneBitAdam: parameter '{name}' is on {contexts[0]}; only CPU parameters are supported"
        )
