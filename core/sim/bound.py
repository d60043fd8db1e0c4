"""Closed-form lower bounds on one iteration's communication, to check the simulator and
to print next to its predictions.

``link_bound``: every link must carry its bytes, so the time is at least the largest
bytes / capacity over the links. With equal links on one switch and the placement's shares
it equals BytePS Eq. 6 (``fastps.placement.optimal_time``); with racks it is the larger of
the in-rack term and the uplink term (the PHub form: cross-rack bytes over the uplink).
``ring_allreduce``: 2(n-1)/n M over the slowest hop of the ring, plus 2(n-1) latencies.
"""

from __future__ import annotations

from typing import Dict

from ..control import placement
from .cluster import Layout


def link_loads(lay: Layout, model_bytes: float) -> Dict[str, float]:
    """Seconds each link needs for one iteration's pushes and answers (per member)."""
    loads: Dict[str, float] = {}

    def add(name: str, nbytes: float, mbit: float) -> None:
        loads[name] = loads.get(name, 0.0) + nbytes / lay.bytes_per_s(mbit)

    for a in lay.worker_groups:
        for s, share in zip(lay.groups, lay.server_share):
            f = lay.remote_fraction(a, s)
            b = model_bytes * share * f  # per member of a, each way
            copies = a.count
            if b <= 0:
                continue
            add(f"{a.index}.up", b, a.mbit)
            add(f"{a.index}.down", b, a.mbit)
            add(f"{s.index}.down", b * copies / s.count, s.mbit)
            add(f"{s.index}.up", b * copies / s.count, s.mbit)
            if a.rack != s.rack:
                for d in ("up", "down"):
                    add(f"rack{a.rack}.{d}", b * copies, lay.rack_uplink_mbit[a.rack])
                    add(f"rack{s.rack}.{d}", b * copies, lay.rack_uplink_mbit[s.rack])
    return loads


def link_bound(lay: Layout, model_bytes: float) -> float:
    return max(link_loads(lay, model_bytes).values(), default=0.0)


def byteps_bound(lay: Layout, model_bytes: float) -> float:
    """BytePS Eq. 6 at the cluster's goodput (the real placement's formula)."""
    c = lay.cluster
    return placement.optimal_time(
        c.workers, c.cpu_machines, model_bytes, lay.bytes_per_s(c.link_mbit)
    )


def ring_allreduce(lay: Layout, model_bytes: float, latency: bool = True) -> float:
    """One ring all-reduce of ``model_bytes`` over the worker hosts: each hop moves
    2(n-1)/n of the bytes; across racks one ring edge per rack crosses each uplink."""
    c = lay.cluster
    n = c.workers
    if n <= 1:
        return 0.0
    rates = [lay.bytes_per_s(g.mbit) for g in lay.worker_groups]
    if lay.rack_uplink_mbit:
        rates += [lay.bytes_per_s(m) for m in lay.rack_uplink_mbit]
    t = 2 * (n - 1) / n * model_bytes / min(rates)
    return t + (2 * (n - 1) * c.latency_s if latency else 0.0)
