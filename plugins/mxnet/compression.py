"""Gradient compression: ``Compression.none`` and ``Compression.fp16`` (a cast around the
push_pull, run here), and the C++ core's compressors (``Compression.onebit``, ``.topk(k)``,
...: they travel to the core with the tensor, which compresses on the wire, and the
servers decode, sum in float32 and recompress; docs/guide/compression.md)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Tuple

import mxnet as mx
import numpy as np
from fastps.worker.compression import Compression as _Core
from fastps.worker.compression import is_core

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "is_core"]

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
    """The compressors, by Horovod's names (``none``, ``fp16``: a cast), and the core's."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = _Core.bf16
    onebit = _Core.onebit
    topk = staticmethod(_Core.topk)
    randomk = staticmethod(_Core.randomk)
    dithering = staticmethod(_Core.dithering)
    select = staticmethod(_Core.select)
    core_fp16 = _Core.fp16
