"""Gradient compression around a push_pull: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Tuple

import mxnet as mx
import numpy as np

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]

if TYPE_CHECKING:  # mxnet has no type information: its classes are Any here
    from typing_extensions import TypeAlias

NDArray: TypeAlias = mx.nd.NDArray


class Compressor(ABC):
    """Turns a tensor into what is sent (``compress``) and back (``decompress``)."""

    @staticmethod
    @abstractmethod
    def compress(tensor: NDArray) -> Tuple[NDArray, Any]:
        """Implemented by each compressor."""

    @staticmethod
    @abstractmethod
    def decompress(tensor: NDArray, ctx: Any) -> NDArray:
        """Implemented by each compressor."""


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: NDArray) -> Tuple[NDArray, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: NDArray, ctx: Any) -> NDArray:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes); other dtypes unchanged.

    The sum over workers is computed in float16, so it can overflow past 65504 and loses
    precision; scale losses accordingly.
    """

    @staticmethod
    def compress(tensor: NDArray) -> Tuple[NDArray, Any]:
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f" and dtype != np.float16:
            return tensor.astype("float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: NDArray, ctx: Any) -> NDArray:
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """The compressors, by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
