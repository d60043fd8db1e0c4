"""``hvd.SyncBatchNormalization``: Keras batch normalization whose batch statistics span
every rank of a process set (Horovod's layer). It subclasses the batch normalization of
the Keras that ``tf.keras`` is: Keras 3's, or Keras 2's (``tf_keras``, under
``TF_USE_LEGACY_KERAS=1``; that one also runs in TensorFlow 1 graphs and sessions).

During training each rank sums its inputs, their squares and their count per channel;
one grouped Sum allreduce of those three gives every rank the statistics of the global
batch: ``mean = sum / count`` and ``variance = sum of squares / count - mean²``. The
allreduce is differentiable (its gradient is the Sum allreduce of the incoming
gradients), so backpropagation through the statistics is global too. Inference uses the
moving statistics, which every rank updates alike from the global batch.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from fastps.tensorflow import _engine as E
from fastps.tensorflow import ops as O

__all__ = ["SyncBatchNormalization"]


def _check_args(fused: Optional[bool], kwargs: Dict[str, Any]) -> None:
    if fused or fused is None:
        raise ValueError("SyncBatchNormalization does not support fused=True")
    if kwargs.get("synchronized"):
        raise ValueError(
            "SyncBatchNormalization synchronizes through fastps; synchronized=True (a "
            "tf.distribute strategy's) cannot be combined with it"
        )


def _global_moments(
    inputs: Any, axes: Sequence[int], mask: Any, keepdims: bool, process_set: Any
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Mean and variance over ``axes`` of the inputs of every rank of the set."""
    ps = O._ps(process_set)
    x = tf.convert_to_tensor(inputs)
    axes = list(axes)
    if mask is None:
        total = tf.reduce_sum(x, axes, keepdims=keepdims)
        squares = tf.reduce_sum(tf.square(x), axes, keepdims=keepdims)
        per_rank = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        count = tf.fill(tf.shape(total), per_rank)
    else:  # mask: one dimension less than the inputs (Keras's contract)
        weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
        total = tf.reduce_sum(x * weights, axes, keepdims=keepdims)
        squares = tf.reduce_sum(tf.square(x) * weights, axes, keepdims=keepdims)
        count = tf.reduce_sum(weights, axes, keepdims=keepdims)
    total, squares, count = O.grouped_allreduce([total, squares, count], op=O.Sum, process_set=ps)
    count = tf.maximum(count, keras.backend.epsilon())
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return mean, variance


def _alone(process_set: Any) -> bool:
    """Local statistics suffice: one rank, and (in a graph) a world that cannot grow (a
    graph traced alone in an elastic job may run in a bigger world later)."""
    ps = O._ps(process_set)
    return ps.size() == 1 and (E.executing_eagerly() or not E.world_may_change())


class _Keras3SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with statistics over ``process_set`` (default:
    all ranks). Horovod's ``fused`` argument is accepted; ``fused=True`` is refused, as
    Horovod refuses it."""

    def __init__(self, fused: Optional[bool] = False, process_set: Any = None, **kwargs: Any):
        _check_args(fused, kwargs)
        super().__init__(**kwargs)
        self._process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> Tuple[tf.Tensor, tf.Tensor]:
        if _alone(self._process_set):
            return super()._moments(inputs, mask)
        return _global_moments(inputs, self._reduction_axes, mask, False, self._process_set)


# Keras names layers after their class ("sync_batch_normalization_2"), Horovod's name.
_Keras3SyncBatchNormalization.__name__ = "SyncBatchNormalization"
_Keras3SyncBatchNormalization.__qualname__ = "SyncBatchNormalization"


def _keras2_class() -> Any:
    """The same layer on Keras 2's ``BatchNormalization`` (its statistics come from
    ``_calculate_mean_and_var``)."""
    import tf_keras

    class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
        __doc__ = _Keras3SyncBatchNormalization.__doc__

        def __init__(
            self, fused: Optional[bool] = False, process_set: Any = None, **kwargs: Any
        ) -> None:
            _check_args(fused, kwargs)
            super().__init__(fused=False, **kwargs)
            self._process_set = process_set

        def _calculate_mean_and_var(
            self, inputs: Any, reduction_axes: Any, keep_dims: bool, mask: Any = None
        ) -> Tuple[tf.Tensor, tf.Tensor]:
            if _alone(self._process_set):
                return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask)
            return _global_moments(inputs, reduction_axes, mask, keep_dims, self._process_set)

    SyncBatchNormalization.__module__ = __name__
    return SyncBatchNormalization


def _tf_keras_is_keras2() -> bool:
    return tf.keras.layers.BatchNormalization.__module__.startswith("tf_keras")


SyncBatchNormalization: Any = (
    _keras2_class() if _tf_keras_is_keras2() else _Keras3SyncBatchNormalization
)
