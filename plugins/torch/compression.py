"""Gradient compression applied around a push_pull.

A compressor turns a tensor into the tensor that travels (``compress``) and back
(``decompress``). ``compress`` returns the travelling tensor and a context object that
``decompress`` receives; the context is whatever the compressor needs to undo its work.
User-defined compressors with the same two static methods work everywhere a built-in one
does. The core's compressors (``Compression.onebit``, ``.topk(k)``, ...) are not run here:
they travel to the core with the tensor (docs/guide/compression.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Tuple

import torch
from fastps.worker.compression import Compression as _Core
from fastps.worker.compression import is_core

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression", "is_core"]


class Compressor(ABC):
    """Interface: subclasses override both static methods."""

    @staticmethod
    @abstractmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """Implemented by each compressor."""

    @staticmethod
    @abstractmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Implemented by each compressor."""


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


# Only wide floating types gain from travelling as float16; bfloat16 is already 16 bits
# and converting it to float16 could overflow.
_SHRINKABLE = (torch.float32, torch.float64)


class FP16Compressor(Compressor):
    """Sends float32/float64 tensors as float16 (half the bytes) and casts the sum back.

    Other dtypes travel unchanged. The sum is computed in float16, so values whose sum
    exceeds 65504 overflow: use ``prescale_factor`` (or ``gradient_predivide_factor``) to
    keep large gradients in range.
    """

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        if tensor.dtype in _SHRINKABLE:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is None:
            return tensor
        return tensor.to(ctx)


class Compression:
    """The built-in compressors, by the names Horovod scripts use (``none``, ``fp16``: a
    cast around the push_pull), and the C++ core's (docs/guide/compression.md): the servers
    decode, sum in float32 and recompress, with error feedback where asked."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = _Core.bf16
    onebit = _Core.onebit
    topk = staticmethod(_Core.topk)
    randomk = staticmethod(_Core.randomk)
    dithering = staticmethod(_Core.dithering)
    select = staticmethod(_Core.select)
    core_fp16 = _Core.fp16
