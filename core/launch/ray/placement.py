"""Where a job's actors go: the workers' placement group, and the servers and the scheduler
in it (zero CPUs, in the bundle of a worker on their node); the extra summation servers on
CPU-only nodes (``num_cpu_servers``), one on each of as many nodes without workers.

``num_workers=N``: one bundle per worker, packed onto as few nodes as fit (Ray's PACK);
``num_hosts=H, num_workers_per_host=W``: one bundle of ``W`` workers' resources per node,
on ``H`` different nodes (STRICT_SPREAD). Either way ranks are numbered node by node, so
the ranks of a node are consecutive, as under fastpsrun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence

from fastps.errors import FastPSError

__all__ = [
    "WorkerLayout",
    "worker_layout",
    "order_by_node",
    "workers_fitting",
    "cpu_server_nodes",
]


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


def workers_fitting(bundles: Sequence[Mapping[str, float]], cpus: float, gpus: float) -> int:
    """How many workers of ``cpus``/``gpus`` each the ``bundles`` of a placement group hold
    (a worker lives in one bundle; a bundle may hold several)."""
    total = 0
    for bundle in bundles:
        fit = [
            bundle.get(name, 0.0) / need for name, need in (("CPU", cpus), ("GPU", gpus)) if need
        ]
        # Tiny epsilon: 0.3 * 3 is 0.8999... in floating point and must still count 3.
        total += int(min(fit) + 1e-9) if fit else 1
    return total


def cpu_server_nodes(
    nodes: Sequence[Mapping[str, Any]],
    worker_nodes: Collection[str],
    num_cpu_servers: int,
    resource: Optional[str],
    cpus: float,
) -> List[str]:
    """The Ray node ids for ``num_cpu_servers`` servers, one per node: alive nodes (entries
    of ``ray.nodes()``) that hold no worker of the job, have at least one unit of
    ``resource`` (when named) and ``cpus`` CPUs in total, in address order. A clear error,
    naming the request, when there are fewer; none when ``num_cpu_servers`` is 0."""
    if num_cpu_servers <= 0:
        return []
    alive = [n for n in nodes if n.get("Alive")]
    marked = [n for n in alive if resource is None or n["Resources"].get(resource, 0.0) >= 1.0]
    if resource is not None and not marked:
        raise FastPSError(
            f"RayExecutor: num_cpu_servers={num_cpu_servers} with cpu_server_resource="
            f"{resource!r}, but no alive Ray node has one unit of {resource!r} (mark the "
            f"CPU-only nodes: ray start ... --resources='{{\"{resource}\": 1}}')"
        )
    fit = [
        n
        for n in marked
        if n["NodeID"] not in worker_nodes and n["Resources"].get("CPU", 0.0) + 1e-9 >= cpus
    ]
    if len(fit) < num_cpu_servers:
        which = "Ray node" if resource is None else f"Ray node with resource {resource!r}"
        found = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in fit) or "none"
        raise FastPSError(
            f"RayExecutor: num_cpu_servers={num_cpu_servers}, but only {len(fit)} alive "
            f"{which} without workers and with {cpus:g} CPUs (cpus_per_cpu_server) can take "
            f"one (one server per node): {found}"
        )
    fit.sort(key=lambda n: (str(n["NodeManagerAddress"]), str(n["NodeID"])))
    return [str(n["NodeID"]) for n in fit[:num_cpu_servers]]
