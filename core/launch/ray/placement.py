"""Where a job's actors go: the workers' placement group, and the servers and the scheduler
in it (zero CPUs, in the bundle of a worker on their node).

``num_workers=N``: one bundle per worker, packed onto as few nodes as fit (Ray's PACK);
``num_hosts=H, num_workers_per_host=W``: one bundle of ``W`` workers' resources per node,
on ``H`` different nodes (STRICT_SPREAD). Either way ranks are numbered node by node, so
the ranks of a node are consecutive, as under fastpsrun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from fastps.errors import FastPSError

__all__ = ["WorkerLayout", "worker_layout", "order_by_node", "server_bundles"]


@dataclass(frozen=True)
class WorkerLayout:
    bundles: List[Dict[str, float]]
    strategy: str
    bundle_of_worker: List[int]  # the bundle each worker (in creation order) goes into

    @property
    def num_workers(self) -> int:
        return len(self.bundle_of_worker)


def worker_layout(
    num_workers: Optional[int],
    num_hosts: Optional[int],
    num_workers_per_host: Optional[int],
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> WorkerLayout:
    """The placement group for the workers; a clear error for a contradictory request."""
    if cpus_per_worker < 0 or gpus_per_worker < 0:
        raise FastPSError(
            f"RayExecutor: cpus_per_worker={cpus_per_worker} and gpus_per_worker="
            f"{gpus_per_worker} must not be negative"
        )

    def resources(workers: int) -> Dict[str, float]:
        out = {"CPU": cpus_per_worker * workers}
        if gpus_per_worker:
            out["GPU"] = gpus_per_worker * workers
        if not any(out.values()):
            # Ray refuses empty bundles; a token share keeps the placement meaningful.
            out["CPU"] = 0.001 * workers
        return out

    if num_workers is not None and num_hosts is not None:
        raise FastPSError(
            f"RayExecutor: give num_workers ({num_workers}) or num_hosts ({num_hosts}) "
            "with num_workers_per_host, not both"
        )
    if num_hosts is not None:
        per = 1 if num_workers_per_host is None else int(num_workers_per_host)
        if num_hosts < 1 or per < 1:
            raise FastPSError(
                f"RayExecutor: num_hosts={num_hosts} and num_workers_per_host={per} must be >= 1"
            )
        bundles = [resources(per) for _ in range(num_hosts)]
        return WorkerLayout(
            bundles, "STRICT_SPREAD", [h for h in range(num_hosts) for _ in range(per)]
        )
    if num_workers is None:
        raise FastPSError("RayExecutor: give num_workers, or num_hosts and num_workers_per_host")
    if num_workers < 1:
        raise FastPSError(f"RayExecutor: num_workers={num_workers} must be >= 1")
    bundles = [resources(1) for _ in range(num_workers)]
    return WorkerLayout(bundles, "PACK", list(range(num_workers)))


def order_by_node(node_of_worker: Sequence[str]) -> List[int]:
    """The workers (indexes in creation order) in rank order: node by node, each node's in
    creation order, nodes in the order their first worker was created."""
    nodes: List[str] = []
    for node in node_of_worker:
        if node not in nodes:
            nodes.append(node)
    return [i for node in nodes for i, n in enumerate(node_of_worker) if n == node]


def server_bundles(node_of_rank: Sequence[str], bundle_of_rank: Sequence[int]) -> List[int]:
    """One server per node that has workers: the bundle of that node's first rank, for each
    node in rank order (server ``i`` serves the ``i``-th node)."""
    seen: Dict[str, int] = {}
    for node, bundle in zip(node_of_rank, bundle_of_rank):
        seen.setdefault(node, bundle)
    return list(seen.values())
