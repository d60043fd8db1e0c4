"""Asynchronous training for Keras 3 optimizers (docs/guide/async.md):
``DistributedOptimizer(opt, async=True)`` (or FASTPS_MODE=async).

The servers keep the parameters (``fastps.async_mode``). ``apply`` (which ``apply_gradients``
and ``model.fit`` call) runs the wrapped optimizer on this worker's own gradients (no
averaging, no waiting for other workers' gradients), then pushes the change it made (the
delta, as BytePS does) and receives, in the same exchange, the parameters as they now stand
on the servers, every worker's deltas included. The first ``apply`` starts the servers from
rank 0's parameters (Keras creates the optimizer's variables only then). FASTPS_STALENESS
bounds how far a worker may run ahead of the slowest. The exchange is a
``tf.numpy_function``, so it works eagerly and inside ``tf.function`` (not under XLA).
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf
from fastps.errors import FastPSError
from fastps.tensorflow import _engine as E
from fastps.worker.async_mode import DeltaExchange

__all__ = ["make_async_optimizer"]

_HOST_DTYPES = (tf.float32, tf.float64, tf.float16)
_classes: Dict[type, type] = {}
_optimizers = itertools.count()  # creation order, the same on every worker


def _check_dtypes(names: List[str], variables: List[Any]) -> None:
    for name, v in zip(names, variables):
        if tf.as_dtype(v.dtype) not in _HOST_DTYPES:
            raise FastPSError(
                f"async parameter '{name}': dtype {tf.as_dtype(v.dtype).name} is not supported "
                "(float32, float64, float16)"
            )


def _names(prefix: str, variables: List[Any]) -> List[str]:
    return [f"{prefix}{i}.{getattr(v, 'path', v.name)}" for i, v in enumerate(variables)]


def _async_class(base: Any) -> Any:
    """A subclass of ``base`` whose ``apply`` exchanges the local step's delta."""
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @E.no_autograph
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if trainable_variables is None:
            variables = list(getattr(self, "_trainable_variables", []) or [])
            if len(variables) != len(grads):
                return base.apply(self, grads, trainable_variables)  # Keras's own error
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
        E.refuse_xla("DistributedOptimizer(async=True)")
        names = _names(self._fastps_prefix, variables)
        _check_dtypes(names, variables)
        before = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        result = base.apply(self, grads, trainable_variables)
        after = [tf.convert_to_tensor(v) for v in variables]
        exchange: DeltaExchange = self._fastps_exchange

        def run(*arrays: np.ndarray) -> List[np.ndarray]:
            # Own, writable copies: TensorFlow may hand out read-only views of its tensors.
            half = len(arrays) // 2
            old = [np.array(a, copy=True) for a in arrays[:half]]
            new = [np.array(a, copy=True) for a in arrays[half:]]
            exchange.step(names, old, new)
            return new

        fresh = tf.numpy_function(
            run, before + after, [tf.as_dtype(v.dtype) for v in variables], stateful=True
        )
        if not isinstance(fresh, (list, tuple)):  # one output comes back bare
            fresh = [fresh]
        for v, value in zip(variables, fresh):
            v.assign(tf.reshape(value, tf.shape(v)))
        return result

    def pull_parameters(self: Any) -> None:
        """Loads the parameters the servers hold (eagerly; e.g. before a checkpoint on any
        worker). Needs the optimizer built (after its first step or ``build``)."""
        variables = list(getattr(self, "_trainable_variables", []) or [])
        arrays = [np.array(v.numpy(), copy=True) for v in variables]
        self._fastps_exchange.pull(list(zip(_names(self._fastps_prefix, variables), arrays)))
        for v, a in zip(variables, arrays):
            v.assign(a)

    def push_parameters(self: Any) -> None:
        """Rank 0's parameters replace the servers' (and every worker's): call it on every
        worker, eagerly, e.g. after rank 0 loaded a checkpoint."""
        variables = list(getattr(self, "_trainable_variables", []) or [])
        arrays = [np.array(v.numpy(), copy=True) for v in variables]
        self._fastps_exchange.push(list(zip(_names(self._fastps_prefix, variables), arrays)))
        for v, a in zip(variables, arrays):
            v.assign(a)

    cls = type(
        base.__name__,
        (base,),
        {
            "apply": apply,
            "pull_parameters": pull_parameters,
            "push_parameters": push_parameters,
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def make_async_optimizer(optimizer: Any, name: Any = None) -> Any:
    """A copy of the Keras 3 ``optimizer`` (from its config) that trains asynchronously
    against the parameters the servers keep."""
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = _async_class(type(optimizer)).from_config(config)
    n = next(_optimizers)
    prefix = "keras." if n == 0 else f"keras{n}."
    # Bypass attribute tracking: neither holds TensorFlow state.
    object.__setattr__(new, "_fastps_prefix", prefix)
    object.__setattr__(new, "_fastps_exchange", DeltaExchange("DistributedOptimizer(async)"))
    return new
