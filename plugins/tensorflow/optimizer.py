"""DistributedOptimizer for Keras 3 (and Keras 2 ``tf_keras``) optimizers: gradients are
averaged before every update."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Type

from fastps.async_mode import async_requested, current_mode

from . import _engine as E
from . import cross_barrier as CB
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
        cb = self.__dict__.get("_fastps_cb")
        if cb is not None:
            if E.executing_eagerly():
                arriving = self._fastps_reducer.start_each(grads, variables)
                if arriving is not None:
                    cb.step(arriving, variables)
                    return None
            cb.flush()
        reduced = self._fastps_reducer.reduce(grads, variables)
        return base.apply(self, reduced, trainable_variables)

    def wait_for_updates(self: Any) -> None:
        """Applies every deferred cross-barrier update (before reads that bypass the Keras
        variables: a compiled ``predict``/``evaluate``, a ``tf.function`` traced earlier)."""
        cb = self.__dict__.get("_fastps_cb")
        if cb is not None:
            cb.flush()

    def __setattr__(self: Any, name: str, value: Any) -> None:
        # A hyperparameter set between steps (a learning rate callback) must not reach the
        # updates of the step before.
        cb = self.__dict__.get("_fastps_cb")
        if cb is not None and cb.pending and not name.startswith("_"):
            cb.flush()
        base.__setattr__(self, name, value)

    def variables(self: Any) -> Any:
        self.wait_for_updates()
        return base.variables.fget(self)

    cls = type(
        base.__name__,
        (base,),
        {
            "apply": apply,
            "wait_for_updates": wait_for_updates,
            "__setattr__": __setattr__,
            "variables": property(variables),
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def _keras2_class(base: Any) -> Any:
    """A subclass of a Keras 2 (``tf_keras``) optimizer class whose ``apply_gradients``
    (which ``model.fit`` and custom loops call) reduces the gradients first."""
    cls = _classes.get(base)
    if cls is not None:
        return cls

    @E.no_autograph
    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        reduced = self._fastps_reducer.reduce([g for g, _ in pairs], variables)
        return base.apply_gradients(self, list(zip(reduced, variables)), *args, **kwargs)

    cls = type(
        base.__name__,
        (base,),
        {
            "apply_gradients": apply_gradients,
            "__module__": base.__module__,
            "__doc__": base.__doc__,
            "_fastps_distributed": True,
        },
    )
    _classes[base] = cls
    return cls


def _is_keras2_optimizer(optimizer: Any) -> bool:
    """A ``tf_keras`` optimizer (Keras 2: ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` it),
    current or legacy."""
    try:
        import tf_keras
    except ImportError:
        return False
    kinds = [tf_keras.optimizers.Optimizer]
    legacy = getattr(tf_keras.optimizers, "legacy", None)
    if legacy is not None:
        kinds.append(legacy.Optimizer)
    return isinstance(optimizer, tuple(kinds))


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
    cross_barrier: Optional[bool] = None,
    **kwargs: Any,
) -> Any:
    """Returns a copy of the Keras 3 ``optimizer`` (built from its config) whose updates use
    gradients averaged (``op=Sum``: summed) over all workers. A Keras 2 optimizer
    (``tf_keras``, current or ``legacy``) is wrapped the same way at ``apply_gradients``.

    ``apply`` and ``apply_gradients`` (which ``model.fit`` calls) push_pull every gradient,
    highest priority to the variable first in ``trainable_variables`` (layer order), then
    update as the wrapped optimizer would. Works eagerly and inside ``tf.function``; not with
    ``jit_compile=True`` (XLA cannot compile the calls into fastps). ``num_groups=k`` bundles
    the gradients into k groups of one start and one wait op each (fewer Python calls per
    step; see ``fastps.tensorflow._reducer``).

    ``cross_barrier=True`` (or ``FASTPS_CROSS_BARRIER=1`` when the argument is None; default
    off): when ``apply`` runs eagerly it returns before every sum is in, and each variable is
    updated when its own sum has arrived, at the latest when something reads it (the next
    forward pass of its layer). Exactly the synchronous update; see
    ``fastps.tensorflow.cross_barrier`` for the optimizers it covers and the reads (compiled
    functions) that need ``optimizer.wait_for_updates()`` first.
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

    if isinstance(optimizer, keras.optimizers.Optimizer):
        make_class = _distributed_class
    elif _is_keras2_optimizer(optimizer):
        make_class = _keras2_class
    else:
        raise TypeError(
            f"DistributedOptimizer wraps Keras 3 optimizers (keras.optimizers.Optimizer) and "
            f"Keras 2 ones (tf_keras.optimizers, current or legacy); got "
            f"{type(optimizer).__name__}. For custom loops use DistributedGradientTape."
        )
    if getattr(optimizer, "_fastps_distributed", False):
        raise ValueError("this optimizer is already a fastps DistributedOptimizer")
    if async_requested(kwargs, current_mode()):
        if make_class is _keras2_class:
            # The async class replaces Keras 3's apply, which Keras 2 never calls: every
            # worker would silently train alone.
            raise ValueError(
                f"DistributedOptimizer(async=True) needs a Keras 3 optimizer; "
                f"{type(optimizer).__name__} is a Keras 2 (tf_keras) one"
            )
        return make_async_optimizer(optimizer, name)
    op = O._resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != O.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    cls = make_class(type(optimizer))
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
    cb = None
    if _cross_barrier_asked(cross_barrier):
        why = CB.coupling(new, type(optimizer))
        if why is None and op not in (O.Average, O.Sum):
            why = "the reduction op is not Average or Sum"
        if why is None and process_set is not None and process_set is not O.global_process_set:
            why = "a process set"
        if why is None:
            cb = CB.CrossBarrier(new, base_apply=type(optimizer).apply)
        else:
            CB.warn(why)
    object.__setattr__(new, "_fastps_cb", cb)
    return new


def _cross_barrier_asked(option: Optional[bool]) -> bool:
    if option is not None:
        if not isinstance(option, bool):
            raise TypeError(f"cross_barrier must be True, False or None, got {option!r}")
        return option
    raw = os.environ.get(CB.ENV, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"invalid {CB.ENV}={raw!r}: expected 1 or 0")
