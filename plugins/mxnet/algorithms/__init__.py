"""Training algorithms of the MXNet plugin (docs/guide/algorithms.md, docs/guide/local-sgd.md).

``hvd.DistributedTrainer(params, optimizer, ..., algorithm=...)`` runs an
:class:`Algorithm` (base.py: the hooks and what each may do) instead of its own gradient
averaging. :class:`OneBitAdam` is Adam whose momentum travels at 1 bit per value after a
warm-up (Tang et al. 2021); the trainer takes its algorithm by itself. :class:`LocalSGD`
and :class:`DiLoCo` take H local steps, then an outer step on the summation servers.
"""

from __future__ import annotations

from fastps.mxnet.algorithms.base import (
    SUM,
    Algorithm,
    Context,
    Param,
    ServerRule,
    check_server_rule,
    register_server_rule,
)
from fastps.mxnet.algorithms.local_sgd import DiLoCo, LocalSGD
from fastps.mxnet.algorithms.onebit_adam import OneBitAdam, OneBitAdamAlgorithm

__all__ = [
    "SUM",
    "Algorithm",
    "Context",
    "DiLoCo",
    "LocalSGD",
    "OneBitAdam",
    "OneBitAdamAlgorithm",
    "Param",
    "ServerRule",
    "check_server_rule",
    "register_server_rule",
]
