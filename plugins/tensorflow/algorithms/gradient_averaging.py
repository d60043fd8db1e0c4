"""Synchronous gradient averaging: the ``DistributedOptimizer``'s default algorithm.

``GradientAveraging(compression=c)`` is the same as ``DistributedOptimizer(...,
compression=c)``: an instance of this class itself (not of a subclass) takes the optimizer's
own code path (cross-barrier updates, fusion, local aggregation included), so choosing it
costs nothing per step. A subclass runs through the algorithm hooks (base.py) like any other
algorithm.
"""

from __future__ import annotations

from typing import Any

from fastps.tensorflow.algorithms.base import Algorithm

__all__ = ["GradientAveraging"]


class GradientAveraging(Algorithm):
    """Averages every gradient over the workers before the optimizer's update.

    ``compression``: ``None`` (uncompressed; ``FASTPS_COMPRESSION`` applies when set),
    ``fastps.tensorflow.Compression.fp16`` (a cast), or one of the core's compressors
    (``fastps.Compression.onebit(error_feedback=True)``, ``.topk(k, ...)``, ...)."""

    def __init__(self, compression: Any = None) -> None:
        self.compression = compression

    def __repr__(self) -> str:
        return f"GradientAveraging(compression={self.compression!r})"
