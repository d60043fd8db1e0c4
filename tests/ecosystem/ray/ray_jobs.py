"""Functions the Ray tests ship to the worker actors (importable there: the test cluster's
workers get this folder on PYTHONPATH)."""

from __future__ import annotations

import os
from typing import Any, Dict


def rank_and_sum(scale: int, offset: int = 0) -> Dict[str, Any]:
    """Joins the job, returns the rank, the size and a sum over every rank (proof that the
    ranks talk to each other through fastps's servers)."""
    import fastps.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "sum": float(total[0]),
        "value": hvd.rank() * scale + offset,
        "job": os.environ["FASTPS_JOB_ID"],
    }


def fail_on_rank_1() -> int:
    import fastps.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 was told to fail")
    return hvd.rank()


class Executable:
    """What start(executable_cls=...) builds in every worker: it joins the job at once."""

    def __init__(self, epochs: int) -> None:
        import fastps.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.epochs = epochs

    def rank_epoch(self) -> int:
        return int(self.hvd.rank()) * self.epochs
