"""The simulated machines: worker hosts (each with its colocated server), CPU-only hosts,
their links, racks with oversubscribed uplinks, stragglers; and how they are grouped.

A **host group** stands for ``count`` identical hosts (same role, rack, link rate and
compute speed). Every host of a group does the same thing at the same time, so one
simulated entity can stand for all of them and the cost of a run does not grow with the
number of workers: that is what lets the simulator reach 1,024 workers. A part pushed to a
group of m servers is spread over its m members (the partitioner's round robin does that
over a few parts), and a flow's coefficient on a link says how many copies of each byte the
link carries (``fastps.sim.network``). With every group of size 1 (``explicit``) the model is
per host and per connection, exactly as the real job; small clusters use that.

Shares come from the real placement (``fastps.placement.server_weights``) and the pacing
caps from the rule of ``fastps.placement.pacing_plan``, evaluated per group
(``group_pacing``; tests check it against pacing_plan on expanded hosts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from ..control import placement
from ..errors import FastPSError

# TCP goodput on a shaped link, measured on the emulated rack (docs/performance.md section 6).
RACK_GOODPUT = 0.956
# One-way latency of a message on the emulated rack (veth pairs through a bridge, htb).
RACK_LATENCY_S = 60e-6


@dataclass(frozen=True)
class Cluster:
    """n worker hosts and k CPU hosts on one switch, or on ``racks`` racks whose uplinks
    carry ``hosts_in_rack * link / oversubscription``."""

    workers: int
    cpu_machines: int = 0
    link_mbit: float = 1000.0
    goodput: float = RACK_GOODPUT
    latency_s: float = RACK_LATENCY_S
    racks: int = 1
    oversubscription: float = 1.0
    # Unequal links: Mbit/s of particular hosts, "w3" (worker 3) or "c1" (CPU host 1).
    host_mbit: Mapping[str, float] = field(default_factory=dict)
    # Stragglers: worker rank -> compute-time factor (2.0 computes twice as slowly).
    slow_workers: Mapping[int, float] = field(default_factory=dict)
    explicit: Optional[bool] = None  # None: one entity per host when n + k <= 16

    def check(self) -> None:
        if self.workers < 1:
            raise FastPSError(f"workers must be >= 1, got {self.workers}")
        if self.cpu_machines < 0:
            raise FastPSError(f"cpu_machines must be >= 0, got {self.cpu_machines}")
        if not self.link_mbit > 0:
            raise FastPSError(f"link rate must be > 0 Mbit/s, got {self.link_mbit}")
        if not 0 < self.goodput <= 1:
            raise FastPSError(f"goodput must be in (0, 1], got {self.goodput}")
        if self.latency_s < 0:
            raise FastPSError(f"latency must be >= 0 s, got {self.latency_s}")
        if self.racks < 1 or self.racks > self.workers:
            raise FastPSError(f"racks must be in 1..workers ({self.workers}), got {self.racks}")
        if not self.oversubscription >= 1:
            raise FastPSError(f"oversubscription must be >= 1, got {self.oversubscription}")
        for h, v in self.host_mbit.items():
            if not (h[:1] in "wc" and h[1:].isdigit()) or not v > 0:
                raise FastPSError(f"host_mbit entry {h!r}={v!r}: expected wN or cN = Mbit/s > 0")
            idx = int(h[1:])
            if idx >= (self.workers if h[0] == "w" else self.cpu_machines):
                raise FastPSError(f"host_mbit names {h!r}, which this cluster does not have")
        for r, f in self.slow_workers.items():
            if not 0 <= r < self.workers or not f > 0:
                raise FastPSError(f"slow worker {r!r} x{f!r}: rank must exist, factor > 0")

    @property
    def is_explicit(self) -> bool:
        if self.explicit is not None:
            return self.explicit
        return self.workers + self.cpu_machines <= 16


@dataclass(frozen=True)
class HostGroup:
    index: int
    kind: str  # "worker" (runs a worker and a colocated server) or "cpu"
    hosts: Tuple[str, ...]
    rack: int
    mbit: float
    compute_scale: float = 1.0

    @property
    def count(self) -> int:
        return len(self.hosts)


@dataclass(frozen=True)
class Layout:
    cluster: Cluster
    groups: Tuple[HostGroup, ...]
    # Share of the model bytes each group's servers sum together (the real placement).
    server_share: Tuple[float, ...]
    rack_uplink_mbit: Tuple[float, ...]

    @property
    def worker_groups(self) -> List[HostGroup]:
        return [g for g in self.groups if g.kind == "worker"]

    @property
    def num_workers(self) -> int:
        return self.cluster.workers

    @property
    def num_servers(self) -> int:
        return self.cluster.workers + self.cluster.cpu_machines

    def bytes_per_s(self, mbit: float) -> float:
        return mbit * 1e6 / 8 * self.cluster.goodput

    def remote_fraction(self, src: HostGroup, dst: HostGroup) -> float:
        """Per member of ``src``: the fraction of a part for ``dst``'s servers that leaves
        the host (its own colocated server takes it locally)."""
        if src.index != dst.index:
            return 1.0
        return (src.count - 1) / src.count


def host_racks(n: int, k: int, racks: int) -> Tuple[List[int], List[int]]:
    """Rack of each worker and CPU host: contiguous blocks of workers, CPU hosts spread."""
    return [i * racks // n for i in range(n)], [j % racks for j in range(k)]


def layout(c: Cluster) -> Layout:
    c.check()
    n, k = c.workers, c.cpu_machines
    w_racks, c_racks = host_racks(n, k, c.racks)
    hosts: List[Tuple[str, str, int, float, float]] = []
    for i in range(n):
        h = f"w{i}"
        hosts.append(
            (
                "worker",
                h,
                w_racks[i],
                c.host_mbit.get(h, c.link_mbit),
                float(c.slow_workers.get(i, 1.0)),
            )
        )
    for j in range(k):
        h = f"c{j}"
        hosts.append(("cpu", h, c_racks[j], c.host_mbit.get(h, c.link_mbit), 1.0))
    # The real placement: one server per host, ids in host order.
    spots = [placement.ServerSpot(i, h[1]) for i, h in enumerate(hosts)]
    bw = {h[1]: h[3] for h in hosts} if c.host_mbit else None
    weights = placement.server_weights([f"w{i}" for i in range(n)], spots, bw)
    groups: List[HostGroup] = []
    shares: List[float] = []
    if c.is_explicit:
        for i, (kind, h, rack, mbit, scale) in enumerate(hosts):
            groups.append(HostGroup(i, kind, (h,), rack, mbit, scale))
            shares.append(weights[i])
    else:
        keyed: Dict[Tuple[str, int, float, float], List[int]] = {}
        for i, (kind, _, rack, mbit, scale) in enumerate(hosts):
            keyed.setdefault((kind, rack, mbit, scale), []).append(i)
        for key, idx in keyed.items():
            groups.append(
                HostGroup(
                    len(groups), key[0], tuple(hosts[i][1] for i in idx), key[1], key[2], key[3]
                )
            )
            shares.append(sum(weights[i] for i in idx))
    per_rack = [0.0] * c.racks
    for _, _, rack, mbit, _ in hosts:
        per_rack[rack] += mbit
    uplinks = tuple(m / c.oversubscription for m in per_rack) if c.racks > 1 else ()
    return Layout(c, tuple(groups), tuple(shares), uplinks)


def group_pacing(
    lay: Layout, paced: bool = True, answer_headroom: float = placement.ANSWER_HEADROOM
) -> Tuple[Dict[Tuple[int, int], float], ...]:
    """Rate caps (bytes/s of part per member) of the push flow worker group A -> server group
    S and of the answer flow S -> A: placement.pacing_plan's rule (each host's link split by
    the bytes each flow leaving it carries; answers x ``answer_headroom``), summed over the
    real per-host flows a group flow stands for. Unpaced: no caps."""
    push: Dict[Tuple[int, int], float] = {}
    answer: Dict[Tuple[int, int], float] = {}
    inf = float("inf")
    nw = lay.num_workers
    egress: Dict[int, float] = {}
    for g, share in zip(lay.groups, lay.server_share):
        per_server = share / g.count
        if g.kind == "worker":
            # pushes to every remote server + answers of its own server to remote workers
            out = sum(s * lay.remote_fraction(g, h) for h, s in zip(lay.groups, lay.server_share))
            egress[g.index] = out + (nw - 1) * per_server
        else:
            egress[g.index] = nw * per_server
    for a in lay.worker_groups:
        for s, share in zip(lay.groups, lay.server_share):
            if not paced or share <= 0 or lay.remote_fraction(a, s) == 0:
                push[(a.index, s.index)] = inf
                answer[(a.index, s.index)] = inf
                continue
            # The kernel paces whole packets: a cap is the goodput's share of the link (and a
            # push's, with placement.PUSH_HEADROOM, as the workers' caps).
            push[(a.index, s.index)] = (
                placement.PUSH_HEADROOM * lay.bytes_per_s(a.mbit) * share / egress[a.index]
            )
            answer[(a.index, s.index)] = (
                answer_headroom * lay.bytes_per_s(s.mbit) * share / egress[s.index]
            )
    return push, answer
