"""Gradient compression applied around a push_pull: ``Compression.none`` and ``Compression.fp16``.

A compressor turns a tensor into what travels (``compress`` returns it and a context) and
the result back (``decompress``). Both are TensorFlow ops, so they work eagerly and in graphs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Tuple

import tensorflow as tf

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor(ABC):
    """Interface: subclasses override both static methods."""

    @staticmethod
    @abstractmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        """Implemented by each compressor."""

    @staticmethod
    @abstractmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """Implemented by each compressor."""


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes unchanged.

    The sum is computed in float16 by the servers, so values beyond float16's range
    (about 65504) overflow: scale large gradients down (e.g. with ``prescale_factor``).
    """

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The available compressors, as Horovod names them."""

    none = NoneCompressor
    fp16 = FP16Compressor
