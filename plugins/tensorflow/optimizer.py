"""DistributedOptimizer for Keras 3 optimizers: gradients are averaged before every update."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

from fastps.async_mode import async_requested, current_mode

from . import _engine as E
from . import ops as O
from ._reducer import GradientReducer
from .async_optimizer import make_async_optimizer
from .compression import Compression, Compressor

__all__ = ["DistributedOptimizer"]

_classes: Dict[type, type] = {}


def _distributed_class(base: Any) -> Any:
    """A subclass of ``base`` whose ``apply`` reduces the gradients first.

    It keeps ``base``'s name and module, so a model saved with it loads (as the plain
    optimizer) where fastps is not installed.
    """
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @E.no_autograph
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if trainable_variables is None:
            variables = list(getattr(self, "_trainable_variables", []) or [])
            if len(variables) != len(grads):
                # Let Keras raise its own error about the missing variables.
                return base.apply(self, grads, trainable_variables)
        else:
            trainable_variables = list(trainable_variables)
            variables = trainable_variables
        reduced = self._fastps_reducer.reduce(grads, variables)
        return base.apply(self, reduced, trainable_variables)

    cls = type(
        base.__name__,
        (base,),
        {
            "apply": apply,
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = O.Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
    **kwargs: Any,
) -> Any:
    """Returns a copy of the Keras 3 ``optimizer`` (built from its config) whose updates use
    gradients averaged (``op=Sum``: summed) over all workers.

    ``apply`` and ``apply_gradients`` (which ``model.fit`` calls) push_pull every gradient,
    highest priority to the variable first in ``trainable_variables`` (layer order), then
    update as the wrapped optimizer would. Works eagerly and inside ``tf.function``; not with
    ``jit_compile=True`` (XLA cannot compile the calls into fastps). ``num_groups=k`` bundles
    the gradients into k groups of one start and one wait op each (fewer Python calls per
    step; see ``fastps.tensorflow._reducer``).

    ``async=True`` (``**{"async": True}``, or ``asynchronous=True``; default: FASTPS_MODE):
    asynchronous training against parameters the servers keep (``async_optimizer.py``,
    docs/async.md); the reduction arguments then do not apply.
    """
    # Accepted for Horovod compatibility (CPU path; priorities instead of explicit groups).
    del device_dense, device_sparse, groups, scale_local_gradients, average_aggregated_gradients
    if backward_passes_per_step != 1:
        raise ValueError(
            f"backward_passes_per_step={backward_passes_per_step}: fastps reduces every step's "
            "gradients (local gradient aggregation is not implemented); use 1"
        )
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps Keras 3 optimizers (keras.optimizers.Optimizer); got "
            f"{type(optimizer).__name__}. For custom loops use DistributedGradientTape."
        )
    if getattr(optimizer, "_fastps_distributed", False):
        raise ValueError("this optimizer is already a fastps DistributedOptimizer")
    if async_requested(kwargs, current_mode()):
        return make_async_optimizer(optimizer, name)
    op = O._resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != O.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    cls = _distributed_class(type(optimizer))
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    reducer = GradientReducer(
        "DistributedOptimizer",
        compression=compression,
        op=op,
        sparse_as_dense=sparse_as_dense,
        prescale_factor=1.0 / gradient_predivide_factor,
        postscale_factor=gradient_predivide_factor,
        num_groups=num_groups,
        process_set=process_set,
    )
    # Bypass attribute tracking: the reducer holds no TensorFlow state.
    object.__setattr__(new, "_fastps_reducer", reducer)
    return new
