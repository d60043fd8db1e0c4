"""Horovod's elastic API for TensorFlow 2 and Keras 3: ``hvd.elastic.run``,
``TensorFlowKerasState`` (``KerasState``), ``TensorFlowState`` and ``ObjectState``.

A thin adapter over ``fastps.elastic`` (the run loop, the state classes, the rendezvous),
as ``fastps.torch.elastic`` is: this module only says how Keras models, optimizers and
``tf.Variable`` lists are committed (a numpy copy of each variable), restored (assigned
back) and synced (``broadcast_variables`` from rank 0). Launch with
``fastpsrun --min-np A --max-np B --host-discovery-script S python train.py``
(docs/guide/elastic.md). Keras's fit-loop callbacks are in ``fastps.tensorflow.keras.elastic``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Sequence

import fastps
import numpy as np
import tensorflow as tf
from fastps.elastic import binding as _binding
from fastps.elastic import state as _state
from fastps.errors import HorovodInternalError, HostsUpdatedInterrupt, WorkerLostError

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TensorFlowState",
    "TensorFlowKerasState",
    "KerasState",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
]

State = _state.State


# Inside a tf.function a failed fastps op reaches the caller as TensorFlow's OpError, not
# as fastps's exception: one raised while the generation is aborted is its failure.
_framework = _binding.Framework("fastps.tensorflow", framework_errors=(tf.errors.OpError,))
run = _framework.run
ObjectState = _framework.object_state_class(__name__)


# ------------------------------------------------------------------ handlers


class _VariablesHandler(_state.Handler):
    """A list of variables (``tf.Variable`` or Keras variables), read by ``variables()``
    each time: a Keras optimizer creates its slots on its first step."""

    def __init__(self, value: Any, variables: Callable[[Any], List[Any]], what: str) -> None:
        self._variables = variables
        self._what = what
        super().__init__(value)

    def save(self) -> None:
        self._saved = [np.array(v.numpy(), copy=True) for v in self._variables(self.value)]

    def restore(self) -> None:
        current = self._variables(self.value)
        if len(current) != len(self._saved):
            # Slots created after the commit (the first step): a rollback to before them
            # cannot unbuild them; keep their values, as Horovod does.
            return
        for var, saved in zip(current, self._saved):
            var.assign(saved)

    def sync(self) -> None:
        from fastps.tensorflow.ops import broadcast_variables

        variables = self._variables(self.value)
        if variables:
            broadcast_variables(variables, root_rank=0, name=f"elastic.{self._what}")
        # Horovod's TensorFlow states commit what they synced: a restore before the next
        # commit goes back to rank 0's values, not to this rank's own from before.
        self.save()


def _model_variables(model: Any) -> List[Any]:
    return list(model.variables)


def _optimizer_variables(optimizer: Any) -> List[Any]:
    if optimizer is None or not getattr(optimizer, "built", True):
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _keras_modules() -> List[Any]:
    """Keras 3, and Keras 2 (``tf_keras``, what ``tf.keras`` is under
    ``TF_USE_LEGACY_KERAS=1``) when the program has loaded it: a Keras 2 model or optimizer
    exists only then."""
    mods = []
    try:
        import keras

        mods.append(keras)
    except ImportError:  # pragma: no cover - TensorFlow 2 ships Keras
        pass
    keras2 = sys.modules.get("tf_keras")
    if keras2 is not None:
        mods.append(keras2)
    return mods


def _is_keras_model(value: Any) -> bool:
    return any(isinstance(value, k.Model) for k in _keras_modules())


def _is_optimizer(value: Any) -> bool:
    # fastps's DistributedOptimizer subclasses the optimizer it wraps.
    kinds = []
    for k in _keras_modules():
        kinds.append(k.optimizers.Optimizer)
        legacy = getattr(k.optimizers, "legacy", None)
        if legacy is not None and isinstance(getattr(legacy, "Optimizer", None), type):
            kinds.append(legacy.Optimizer)
    return isinstance(value, tuple(kinds))


def _handler_for(value: Any) -> Optional[_state.Handler]:
    if _is_keras_model(value):
        return _VariablesHandler(value, _model_variables, "model")
    if _is_optimizer(value):
        return _VariablesHandler(value, _optimizer_variables, "optimizer")
    return None


class TensorFlowKerasState(_state.HandlerState):
    """Horovod's TensorFlowKerasState: a Keras ``model``, its ``optimizer`` (default:
    ``model.optimizer``) and any other attribute (``epoch=0, batch=0``...) committed
    together. ``backend`` is accepted for Horovod compatibility."""

    def __init__(
        self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any
    ) -> None:
        del backend
        if optimizer is None:
            optimizer = getattr(model, "optimizer", None)
        kwargs.update(model=model, optimizer=optimizer)
        super().__init__(**_framework.state_args(), handler_for=_handler_for, **kwargs)


KerasState = TensorFlowKerasState


class TensorFlowState(_state.HandlerState):
    """Horovod's TensorFlowState for eager TensorFlow 2: ``variables`` committed by copy,
    restored by assignment and synced from rank 0, with plain attributes beside them
    (TensorFlow 2 has no global variable collection to default to: pass them)."""

    def __init__(
        self, variables: Optional[Sequence[Any]] = None, session: Any = None, **kwargs: Any
    ) -> None:
        if session is not None:
            raise fastps.FastPSError(
                "TensorFlowState(session=...): TensorFlow 1 sessions are not supported; "
                "pass the variables of an eager (TensorFlow 2) program"
            )
        if variables is None:
            raise fastps.FastPSError(
                "TensorFlowState needs variables=[...] (TensorFlow 2 has no global collection)"
            )
        held = list(variables)
        handler = _VariablesHandler(held, lambda vs: vs, "variables")
        super().__init__(
            **_framework.state_args(),
            handler_for=lambda v: handler if v is held else None,
            variables=held,
            **kwargs,
        )
