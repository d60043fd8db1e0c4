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


def exact_sums(numel: int) -> Dict[str, Any]:
    """Joins the job and sums, over every rank, tensors big enough to be cut into parts that
    go to every server; integers below 2**24, so float32 sums are exact and checked whole.
    Also says how many servers the job has and each one's share of the bytes. numpy and
    fastps's own API: no framework to import in the worker."""
    import fastps
    import numpy as np
    from fastps.worker.api import server_weights

    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    base = (np.arange(numel) % 4096).astype(np.float32)
    exact = True
    for i in range(4):  # several names: parts of several tensors spread over the servers
        got = fastps.push_pull(base * (rank + 1) + i, average=False, name=f"exact.{i}")
        want = base * (size * (size + 1) // 2) + i * size
        exact = exact and bool(np.array_equal(got, want))
    return {
        "rank": rank,
        "exact": exact,
        "num_servers": fastps.num_servers(),
        "server_weights": list(server_weights()),
        "job": os.environ["FASTPS_JOB_ID"],
    }


class ExecutorInPlacementGroup:
    """A Ray actor the test starts inside a placement group (capturing its child tasks), as
    Horovod's test_horovod_train_in_pg does: it runs a RayExecutor from there."""

    def run(self, num_workers: int, num_cpu_servers: int, resource: str) -> Dict[str, Any]:
        import ray
        from fastps.ray import RayExecutor
        from ray.util.placement_group import get_current_placement_group

        current = get_current_placement_group()
        settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
        executor = RayExecutor(
            settings,
            num_workers=num_workers,
            num_cpu_servers=num_cpu_servers,
            cpu_server_resource=resource or None,
        )
        try:
            executor.start()
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            executor.shutdown()
            return {"error": f"{type(exc).__name__}: {exc}"}
        try:
            return {
                "current_pg": current.id.hex() if current else None,
                "used_pg": executor.placement_group.id.hex(),
                "created_placement_group": executor.created_placement_group,
                "groups_while_running": [
                    pg_id
                    for pg_id, g in ray.util.placement_group_table().items()
                    if g["state"] != "REMOVED"
                ],
                "servers": executor.server_placements(),
                "workers": [ray.get(w.node_id.remote(), timeout=30) for w in executor.workers],
                "sums": executor.run(exact_sums, args=[1 << 16]),
            }
        finally:
            executor.shutdown()


class Holder:
    """An actor that only holds the resources the test gives it (other work on a node)."""

    def ready(self) -> bool:
        return True
