"""Training algorithms for the Keras ``DistributedOptimizer`` (docs/guide/algorithms.md,
docs/guide/local-sgd.md), the TensorFlow side of ``fastps.torch.algorithms``.

``hvd.DistributedOptimizer(opt, algorithm=...)`` runs an :class:`Algorithm` (base.py: the
hooks and what each may do); the default, :class:`GradientAveraging`, is synchronous
gradient averaging. :class:`OneBitAdam` is Adam whose momentum travels at 1 bit per value
after a warm-up (Tang et al. 2021); :class:`LocalSGD` and :class:`DiLoCo` take H local steps
between outer steps that the summation servers run.
"""

from __future__ import annotations

from fastps.tensorflow.algorithms.base import Algorithm, Context
from fastps.tensorflow.algorithms.gradient_averaging import GradientAveraging
from fastps.tensorflow.algorithms.local_sgd import DiLoCo, LocalSGD
from fastps.tensorflow.algorithms.onebit_adam import OneBitAdam, OneBitAdamAlgorithm

__all__ = [
    "Algorithm",
    "Context",
    "DiLoCo",
    "GradientAveraging",
    "LocalSGD",
    "OneBitAdam",
    "OneBitAdamAlgorithm",
]
