"""1-bit Adam for Keras 3 (Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang and He, "1-bit
Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed", ICML 2021);
the torch version is ``fastps.torch.algorithms.OneBitAdam`` (docs/guide/algorithms.md).

Compressing Adam's gradients with error feedback does not train: Adam divides each
coordinate by √v, which is not linear in the gradient. After a warm-up Adam's variance
changes slowly, so 1-bit Adam freezes it; the update is then linear in the momentum m, and m
is what travels, compressed with error feedback:

- warm-up (the first ``freeze_step`` steps): Adam on gradients averaged exactly, with
  ``torch.optim.Adam``'s step (ε added to √v̂; Keras's ``Adam`` adds it to √v);
- compression stage: each worker updates its momentum with its own gradient,
  m ← β₁·m + (1−β₁)·(g + λ·x); the momenta are averaged through the core's onebit codec with
  error feedback on the workers and the servers, which gives every worker the same m; the
  step is x ← x − lr/(1−β₁ᵗ) · m / D with D = √(v_T / (1−β₂ᵀ)) + ε, v_T the variance at the
  end of the warm-up (T = ``freeze_step``).

What travels is m / D (``precondition=True``, the default): D is frozen and the same on
every worker, so the average of m / D times D is the average of m, and onebit's one scale
per part fits m / D, whose coordinates are all of Adam's step size (sending m, as the paper
does, turned the digits example's weights to NaN; see the torch module).

Usage, with the Keras ``DistributedOptimizer`` (which takes the algorithm this optimizer
names, :class:`OneBitAdamAlgorithm`)::

    opt = hvd.DistributedOptimizer(OneBitAdam(lr=1e-3 * hvd.size(), freeze_step=200))
    model.compile(optimizer=opt, loss=...)

Without the wrapper (or with one worker) it trains as 1-bit Adam on the local momentum.
Everything runs eagerly and in ``tf.function`` (``model.fit``); the phase is decided by ops
on ``iterations``, so one traced step serves both.
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple

import keras
import tensorflow as tf
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.tensorflow._reducer import GradientReducer
from fastps.tensorflow.algorithms.base import Algorithm, Context
from fastps.worker.algorithm_args import adam_rates, onebit_adam_args
from fastps.worker.compression import CoreCompressor

__all__ = ["OneBitAdam", "OneBitAdamAlgorithm", "SUPPORTED_DTYPES"]

# Adam's state in half precision loses the variance's small values; the codec sums in
# float32 on the servers either way.
SUPPORTED_DTYPES = (tf.float32, tf.float64)

MOMENTUM_TAG = "onebit_adam.momentum"

# Keras options that transform the gradients inside ``apply``: after the warm-up the update
# is given the averaged momentum, which they must not touch.
_GRADIENT_OPTIONS = (
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)


def _const(value: float, dtype: Any) -> tf.Tensor:
    """A Python number as a tensor of ``dtype`` (``tf.cast`` would round it to float32 first)."""
    return tf.constant(value, dtype=dtype)


def _dense(value: Any, dtype: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), dtype)


class OneBitAdam(keras.optimizers.Optimizer):
    """Adam whose momentum travels at 1 bit per value after ``freeze_step`` warm-up steps.

    ``lr`` (or Keras's ``learning_rate``, which may be a schedule), ``betas``, ``eps``,
    ``weight_decay`` (L2, added to the gradient, as ``torch.optim.Adam``'s): the torch
    version's names and defaults. ``freeze_step`` (≥ 1): warm-up steps of exact Adam before
    the variance is frozen; the paper and DeepSpeed use 15–25% of the run's steps.
    ``compression``: how the momentum travels (default
    ``fastps.Compression.onebit(error_feedback=True)``; any core compressor, or its spec
    string such as ``"onebit:ef"``). ``precondition``: send m / D instead of m. Keras's
    ``use_ema`` options apply; the options that transform gradients (clipping, loss
    scaling, gradient accumulation) are refused: past the warm-up the update is given the
    averaged momentum, not a gradient."""

    def __init__(
        self,
        lr: Any = None,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: Any = 0.0,
        freeze_step: int = 100,
        compression: Any = None,
        precondition: bool = True,
        name: Any = None,
        learning_rate: Any = None,
        **kwargs: Any,
    ) -> None:
        if lr is not None and learning_rate is not None:
            raise ValueError(
                "OneBitAdam: give lr or learning_rate (Keras's name for it), not both; got "
                f"lr={lr!r} and learning_rate={learning_rate!r}"
            )
        rate = learning_rate if learning_rate is not None else (1e-3 if lr is None else lr)
        if not callable(rate):  # a number (a schedule is checked by Keras)
            rate = adam_rates(("lr", rate, ">= 0"))[0]
        wd = 0.0 if weight_decay is None else weight_decay
        args = onebit_adam_args(
            [("eps", eps, "> 0"), ("weight_decay", wd, ">= 0")],
            betas,
            freeze_step,
            compression,
            spec=True,  # a spec string too: what get_config saves
        )
        for key in _GRADIENT_OPTIONS:
            if kwargs.get(key) is not None:
                raise ValueError(
                    f"OneBitAdam: {key}={kwargs[key]!r} is not supported: after the warm-up "
                    "the update is given the averaged momentum, not a gradient"
                )
        super().__init__(learning_rate=rate, name=name, **kwargs)
        # L2 added to the gradient (torch.optim.Adam's weight_decay), not Keras's decoupled
        # decay: _apply_weight_decay below does nothing.
        self.eps, self.weight_decay = args.rates
        self.beta_1, self.beta_2 = args.betas
        self.freeze_step = args.freeze_step
        self.compression = args.compression
        self.precondition = bool(precondition)

    @property
    def betas(self) -> Tuple[float, float]:
        return (self.beta_1, self.beta_2)

    def fastps_algorithm(self) -> Algorithm:
        """The algorithm ``DistributedOptimizer`` runs for this optimizer."""
        return OneBitAdamAlgorithm()

    def get_config(self) -> Any:
        config = super().get_config()
        comp = self.compression
        plain = isinstance(comp, CoreCompressor) and not comp.min_bytes and comp.names is None
        config.update(
            {
                "betas": [self.beta_1, self.beta_2],
                "eps": self.eps,
                "freeze_step": self.freeze_step,
                # a spec string keeps the config serializable (model.save)
                "compression": comp.spec if plain else comp,
                "precondition": self.precondition,
            }
        )
        return config

    def build(self, var_list: Any) -> None:
        if self.built:
            return
        for v in var_list:
            if tf.as_dtype(v.dtype) not in SUPPORTED_DTYPES:
                raise FastPSError(
                    f"OneBitAdam: parameter '{E.label_of(v)}' has dtype "
                    f"{tf.as_dtype(v.dtype).name}; supported: float32, float64"
                )
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )
        # D = √(v_T / (1−β₂ᵀ)) + ε, set at the last warm-up step
        self._denominators = self.add_optimizer_variables(
            var_list, "denominator", initializer="ones"
        )

    def _apply_weight_decay(self, variables: Any) -> None:
        """Nothing: weight decay is L2, added to the gradient in the step."""

    def _slots(self, variable: Any) -> Tuple[Any, Any, Any]:
        i = self._get_variable_index(variable)
        return self._momentums[i], self._velocities[i], self._denominators[i]

    def _with_l2(self, grad: tf.Tensor, variable: Any) -> tf.Tensor:
        if self.weight_decay == 0:
            return grad
        return grad + _const(self.weight_decay, grad.dtype) * tf.convert_to_tensor(variable)

    def compressing(self) -> tf.Tensor:
        """Whether the next step is past the warm-up (a boolean tensor)."""
        return self.iterations >= self.freeze_step

    def exchange_buffer(self, grad: Any, variable: Any) -> tf.Tensor:
        """Past the warm-up: the tensor whose average the step needs for ``variable``
        (m / D, or m without ``precondition``), with this worker's gradient in its
        momentum: β₁·m + (1−β₁)·(g + λ·x). Nothing is written."""
        m, _v, d = self._slots(variable)
        dtype = tf.as_dtype(variable.dtype)
        g = self._with_l2(_dense(grad, dtype), variable)
        m = tf.convert_to_tensor(m)
        local = m + _const(1 - self.beta_1, dtype) * (g - m)  # torch's lerp
        return local / tf.convert_to_tensor(d) if self.precondition else local

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        dtype = tf.as_dtype(variable.dtype)
        m_var, v_var, d_var = self._slots(variable)
        grad = _dense(gradient, dtype)
        lr = tf.cast(learning_rate, dtype)
        done = tf.cast(self.iterations, tf.int64)  # steps applied before this one
        t = tf.cast(done + 1, dtype)
        b1, b2 = _const(self.beta_1, dtype), _const(self.beta_2, dtype)
        w1, w2 = _const(1 - self.beta_1, dtype), _const(1 - self.beta_2, dtype)
        eps = _const(self.eps, dtype)
        step_size = lr / (1 - tf.pow(b1, t))
        # Set by the DistributedOptimizer while it applies what the workers exchanged.
        exchanged = bool(self.__dict__.get("_fastps_exchanged", False))
        x = tf.convert_to_tensor(variable)
        m = tf.convert_to_tensor(m_var)
        v = tf.convert_to_tensor(v_var)
        d = tf.convert_to_tensor(d_var)

        def warmup() -> List[tf.Tensor]:
            g = self._with_l2(grad, x)
            m1 = m + w1 * (g - m)
            v1 = v * b2 + w2 * (g * g)
            denom = tf.sqrt(v1) / tf.sqrt(1 - tf.pow(b2, t)) + eps
            x1 = x - step_size * (m1 / denom)
            frozen = tf.sqrt(v1) / _const(math.sqrt(1 - self.beta_2**self.freeze_step), dtype)
            d1 = tf.where(done + 1 == self.freeze_step, frozen + eps, d)
            return [m1, v1, x1, d1]

        def compressed() -> List[tf.Tensor]:
            if exchanged and self.precondition:
                u = grad  # the average of m / D
                return [u * d, v, x - step_size * u, d]
            if exchanged:
                m1 = grad  # the average of m
            else:  # this worker's momentum: nothing was exchanged
                m1 = m + w1 * (self._with_l2(grad, x) - m)
            return [m1, v, x - step_size * (m1 / d), d]

        m1, v1, x1, d1 = tf.cond(done >= self.freeze_step, compressed, warmup)
        self.assign(m_var, m1)
        self.assign(v_var, v1)
        self.assign(d_var, d1)
        self.assign(variable, x1)


class OneBitAdamAlgorithm(Algorithm):
    """The communication of :class:`OneBitAdam`: averaged gradients during the warm-up
    (the optimizer's own averaging), then each variable's momentum, compressed with error
    feedback, under ``onebit_adam.momentum.*``."""

    opt: OneBitAdam

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        opt = ctx.optimizer
        if not isinstance(opt, OneBitAdam):
            raise TypeError(
                "OneBitAdamAlgorithm needs a fastps.tensorflow.algorithms.OneBitAdam optimizer, "
                f"got {type(opt).__name__}"
            )
        self.opt = opt
        self._momentum = GradientReducer(MOMENTUM_TAG, compression=opt.compression)
        # The averaged momentum becomes every replica's: every worker's push counts.
        self._momentum.quorum = False

    def exchange(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        opt = self.opt

        def warmup() -> List[Any]:
            return self.ctx.average(grads, variables)  # exact averages, Adam's statistics

        def compressed() -> List[Any]:
            sent = [opt.exchange_buffer(g, v) for g, v in zip(grads, variables)]
            return self._momentum.reduce(sent, variables)

        if E.executing_eagerly():
            return compressed() if bool(opt.compressing()) else warmup()
        out = tf.cond(opt.compressing(), compressed, warmup)
        return list(out) if isinstance(out, (list, tuple)) else [out]
