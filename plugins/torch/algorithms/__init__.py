"""Training algorithms behind one interface (docs/guide/algorithms.md).

``hvd.DistributedOptimizer(opt, named_parameters=..., algorithm=...)`` runs an
:class:`Algorithm` (base.py: the hooks and what each may do); the default,
:class:`GradientAveraging`, is synchronous gradient averaging. :class:`OneBitAdam` is Adam
whose momentum travels at 1 bit per value after a warm-up (Tang et al. 2021).
"""

from __future__ import annotations

from fastps.torch.algorithms.base import (
    SUM,
    Algorithm,
    Context,
    Param,
    ServerRule,
    check_server_rule,
    register_server_rule,
)
from fastps.torch.algorithms.gradient_averaging import GradientAveraging
from fastps.torch.algorithms.onebit_adam import OneBitAdam, OneBitAdamAlgorithm

__all__ = [
    "SUM",
    "Algorithm",
    "Context",
    "GradientAveraging",
    "OneBitAdam",
    "OneBitAdamAlgorithm",
    "Param",
    "ServerRule",
    "check_server_rule",
    "register_server_rule",
]

from fastps.torch.algorithms.local_sgd import DiLoCo, LocalSGD  # noqa: E402

__all__ += ["DiLoCo", "LocalSGD"]
