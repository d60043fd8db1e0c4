"""Keras 3 callbacks that make ``model.fit`` data-parallel with fastps."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import keras
import numpy as np
from fastps.tensorflow import _engine as E
from fastps.tensorflow import ops as O
from fastps.worker import api as _api

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateWarmupCallback",
    "LearningRateScheduleCallback",
]


class Callback(keras.callbacks.Callback):
    """Keras 3's callback base, with the hooks Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``)
    asks every callback about, so that these callbacks work in either's ``model.fit``."""

    _supports_tf_logs = False
    _chief_worker_only = None

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


def _optimizer_variables(optimizer: Any) -> List[Any]:
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    return list(optimizer.variables)


class BroadcastGlobalVariablesCallback(Callback):
    """Sets every worker's model (and optimizer) state to ``root_rank``'s when training starts.

    At ``on_train_begin`` it broadcasts ``model.weights`` (trainable and non-trainable, e.g.
    batch-norm statistics) and, if the optimizer is built, its variables; an optimizer that
    Keras builds lazily is broadcast after the first batch instead. Workers whose models
    differ get an error naming the first differing variable. ``local_variables`` (Horovod's
    model-parallel layers) keep each worker's own values: they are left out of the
    broadcast.
    """

    def __init__(
        self, root_rank: int = 0, device: str = "", local_variables: Optional[List[Any]] = None
    ) -> None:
        super().__init__()
        del device  # accepted for Horovod compatibility
        self.root_rank = int(root_rank)
        # By identity: Keras variables compare element-wise, not as objects.
        self._local = {id(v) for v in local_variables or []}
        self._model_done = False
        self._optimizer_done = False

    def _broadcast(self) -> None:
        model = self.model
        if not self._model_done:
            weights = [w for w in model.weights if id(w) not in self._local]
            O.broadcast_variables(weights, self.root_rank, name="keras.broadcast.model")
            self._model_done = True
        if not self._optimizer_done:
            variables = _optimizer_variables(getattr(model, "optimizer", None))
            if variables:
                O.broadcast_variables(variables, self.root_rank, name="keras.broadcast.optimizer")
                self._optimizer_done = True

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._broadcast()

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._optimizer_done:
            self._broadcast()
            # An optimizer without variables (plain SGD before Keras builds it) counts as done
            # after the first batch.
            self._optimizer_done = True


class MetricAverageCallback(Callback):
    """Replaces each numeric value of the epoch's logs by its average over all workers.

    Put it before callbacks that read the metrics (checkpointing, early stopping, schedules),
    so they see, and every worker decides on, the same averaged values. The progress bar
    Keras prints runs before user callbacks and so still shows this worker's values.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        del device

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is None or _api.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        E.check_same_everywhere(
            "keras.metric_average",
            E.Group(keys, keys),
            "the metric names MetricAverageCallback averages",
        )
        values = np.array([float(np.asarray(logs[k])) for k in keys], dtype=np.float64)
        averaged = O.allreduce(
            values, op=O.Average, name=f"keras.metric_average.{E.digest(keys)}"
        ).numpy()
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


def _is_number(value: Any) -> bool:
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not array-like is not a metric
        return False
    return arr.shape == () and (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool)


def _optimizer(model: Any) -> Any:
    opt = getattr(model, "optimizer", None)
    if opt is None:
        raise ValueError("the learning-rate callbacks need a compiled model with an optimizer")
    return opt


def _current_lr(model: Any) -> float:
    return float(np.asarray(keras.ops.convert_to_numpy(_optimizer(model).learning_rate)))


def _set_lr(model: Any, lr: float, momentum_correction: bool) -> None:
    """Sets the optimizer's rate; with ``momentum_correction``, momentum buffers that hold
    the rate in them (Keras ``SGD`` with momentum) are rescaled by new / old, so the change
    takes effect at once."""
    opt = _optimizer(model)
    old = _current_lr(model)
    opt.learning_rate = lr
    if momentum_correction and old > 0 and lr != old:
        for m in getattr(opt, "momentums", None) or []:
            m.assign(m * (lr / old))


class LearningRateWarmupCallback(Callback):
    """Ramps the learning rate from ``initial_lr / size()`` up to ``initial_lr`` over the
    first ``warmup_epochs`` epochs, batch by batch (Goyal et al., "Accurate, Large Minibatch
    SGD"): large data-parallel batches train stably when the scaled-up rate is reached
    gradually.

    ``initial_lr`` (the target, usually the single-worker rate times ``size()``) defaults to
    the optimizer's learning rate when training starts. ``steps_per_epoch`` defaults to the
    ``steps`` Keras reports to callbacks. With ``momentum_correction`` (default on), an
    optimizer with momentum buffers that include the learning rate (Keras ``SGD`` with
    ``momentum > 0``) has them rescaled by new_lr / old_lr at every change, so the change
    takes effect at once; other optimizers are not touched. The optimizer's learning rate
    must be a plain number, not a schedule.
    """

    def __init__(
        self,
        initial_lr: Optional[float] = None,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if warmup_epochs <= 0:
            raise ValueError("warmup_epochs must be positive")
        self.initial_lr = initial_lr
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0
        self._finished = False

    def _current_lr(self) -> float:
        return _current_lr(self.model)

    def lr_at(self, epoch: float) -> float:
        """The warm-up learning rate at a fractional epoch."""
        assert self.initial_lr is not None
        n = _api.size()
        progress = min(max(epoch / self.warmup_epochs, 0.0), 1.0)
        return self.initial_lr / n * (1.0 + progress * (n - 1))

    def _set_lr(self, lr: float) -> None:
        _set_lr(self.model, lr, self.momentum_correction)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = self._current_lr()
        if self.steps_per_epoch is None:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(
                    "LearningRateWarmupCallback: pass steps_per_epoch (Keras does "
                    "not know the number of steps of this dataset)"
                )
            self.steps_per_epoch = int(steps)

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._finished or self._epoch >= self.warmup_epochs:
            return
        assert self.steps_per_epoch
        self._set_lr(self.lr_at(self._epoch + batch / self.steps_per_epoch))

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._finished:
            return
        if epoch + 1 >= self.warmup_epochs:
            assert self.initial_lr is not None
            self._set_lr(self.initial_lr)
            self._finished = True
            if self.verbose and _api.rank() == 0:
                print(
                    f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                    f"{self.initial_lr:g}.",
                    flush=True,
                )
        if logs is not None:
            logs["learning_rate"] = self._current_lr()


class LearningRateScheduleCallback(Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` up to
    (not including) ``end_epoch`` (Horovod's callback of the same name).

    ``multiplier`` is a number or a function of the epoch. With ``staircase`` (always for a
    number) the rate changes at the first batch of each epoch; otherwise at every batch,
    with the fractional epoch ``epoch + batch / steps_per_epoch`` (``steps_per_epoch``
    defaults to the ``steps`` Keras reports). ``initial_lr`` defaults to the optimizer's
    rate when training starts. Momentum buffers are rescaled at each change as in
    :class:`LearningRateWarmupCallback`. Outside the epoch range the rate is left alone, so
    several of these callbacks (and a warm-up before them) chain into one schedule.
    """

    def __init__(
        self,
        initial_lr: Optional[float] = None,
        multiplier: Any = 1.0,
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> None:
        super().__init__()
        if callable(multiplier):
            self.multiplier = multiplier
            self.staircase = bool(staircase)
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor
            self.staircase = True
        if end_epoch is not None and end_epoch < start_epoch:
            raise ValueError(f"end_epoch={end_epoch} is before start_epoch={start_epoch}")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0

    def _in_range(self) -> bool:
        if self._epoch < self.start_epoch:
            return False
        return self.end_epoch is None or self._epoch < self.end_epoch

    def lr_at(self, epoch: float) -> float:
        """The scheduled learning rate at a (fractional) epoch."""
        assert self.initial_lr is not None
        return self.initial_lr * float(self.multiplier(epoch))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _current_lr(self.model)
        if not self.staircase and self.steps_per_epoch is None:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(
                    "LearningRateScheduleCallback(staircase=False): pass steps_per_epoch "
                    "(Keras does not know the number of steps of this dataset)"
                )
            self.steps_per_epoch = int(steps)

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                _set_lr(self.model, self.lr_at(self._epoch), self.momentum_correction)
        else:
            assert self.steps_per_epoch
            epoch = self._epoch + batch / self.steps_per_epoch
            _set_lr(self.model, self.lr_at(epoch), self.momentum_correction)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            logs["learning_rate"] = _current_lr(self.model)
