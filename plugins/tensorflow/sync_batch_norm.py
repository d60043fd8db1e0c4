"""``hvd.SyncBatchNormalization``: Keras batch normalization whose batch statistics span
every rank of a process set (Horovod's layer, for Keras 3).

During training each rank sums its inputs, their squares and their count per channel;
one grouped Sum allreduce of those three gives every rank the statistics of the global
batch: ``mean = sum / count`` and ``variance = sum of squares / count - mean²``. The
allreduce is differentiable (its gradient is the Sum allreduce of the incoming
gradients), so backpropagation through the statistics is global too. Inference uses the
moving statistics, which every rank updates alike from the global batch.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import keras
import tensorflow as tf

from . import _engine as E
from . import ops as O

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with statistics over ``process_set`` (default:
    all ranks). Horovod's ``fused`` argument is accepted; ``fused=True`` is refused, as
    Horovod refuses it."""

    def __init__(self, fused: Optional[bool] = False, process_set: Any = None, **kwargs: Any):
        if fused or fused is None:
            raise ValueError("SyncBatchNormalization does not support fused=True")
        if kwargs.get("synchronized"):
            raise ValueError(
                "SyncBatchNormalization synchronizes through fastps; synchronized=True (a "
                "tf.distribute strategy's) cannot be combined with it"
            )
        super().__init__(**kwargs)
        self._process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> Tuple[tf.Tensor, tf.Tensor]:
        ps = O._ps(self._process_set)
        # A graph traced alone in an elastic job may run in a bigger world later.
        if ps.size() == 1 and (E.executing_eagerly() or not E.world_may_change()):
            return super()._moments(inputs, mask)
        x = tf.convert_to_tensor(inputs)
        axes = list(self._reduction_axes)
        if mask is None:
            total = tf.reduce_sum(x, axes)
            squares = tf.reduce_sum(tf.square(x), axes)
            per_rank = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
            count = tf.fill(tf.shape(total), per_rank)
        else:  # mask: one dimension less than the inputs (Keras's contract)
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            total = tf.reduce_sum(x * weights, axes)
            squares = tf.reduce_sum(tf.square(x) * weights, axes)
            count = tf.reduce_sum(weights, axes)
        total, squares, count = O.grouped_allreduce(
            [total, squares, count], op=O.Sum, process_set=ps
        )
        count = tf.maximum(count, keras.backend.epsilon())
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return mean, variance
