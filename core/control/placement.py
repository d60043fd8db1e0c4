"""How much of the model each summation server sums (BytePS §4.1, Eq. 1 and 2).

With n worker machines (each with a colocated server) and k CPU-only machines, all of
bandwidth B, the communication time is minimised when each CPU-machine server sums
2(n-1)/(n^2+kn-2k) of the model and each colocated server (n-k)/(n^2+kn-2k). When k >= n
that puts nothing on the colocated servers (plain PS); with k = 0 it is all-reduce's split.

Unequal CPU-machine bandwidths (BytePS footnote 4) generalise the same balance: a CPU
machine with bandwidth b moves n*x bytes for a share x, a worker machine M + (n-2)y bytes
for its colocated share y; equalising their times gives x_i proportional to b_i.

The result is a pure function of the membership, so every worker computes the same weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from fastps import config
from fastps.errors import FastPSError

log = logging.getLogger("fastps.placement")


@dataclass(frozen=True)
class ServerSpot:
    id: int
    hostname: str


def parse_bandwidths(text: Optional[str]) -> Dict[str, float]:
    """``"c0=1000,c1=500"`` (host name = Mbit/s) -> dict."""
    out: Dict[str, float] = {}
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, value = item.partition("=")
        try:
            bw = float(value)
        except ValueError:
            bw = -1.0
        if not sep or not host or bw <= 0:
            raise FastPSError(
                f"invalid FASTPS_HOST_BANDWIDTHS entry {item!r}: expected host=Mbit/s, e.g. c0=1000"
            )
        out[host.strip()] = bw
    return out


def host_shares(n: int, cpu_bandwidths: Sequence[float], worker_bandwidth: float) -> tuple:
    """(share of each colocated server, [share of each CPU machine]) of the model bytes."""
    k = len(cpu_bandwidths)
    if n < 1:
        raise FastPSError("placement needs at least one worker machine")
    if k == 0:
        return 1.0 / n, []
    total_cpu = float(sum(cpu_bandwidths))
    if n <= 2:
        # Each worker machine moves M bytes whatever the split; the CPU machines can take
        # load up to that time without slowing the job (for equal bandwidths: Eq. 1 and 2).
        t = 1.0 / worker_bandwidth
        xs = [t * b / n for b in cpu_bandwidths]
        if sum(xs) >= 1.0:
            return 0.0, [b / total_cpu for b in cpu_bandwidths]
        return (1.0 - sum(xs)) / n, xs
    # t: balanced time per model byte; x_i = t*b_i/n; y = (t*Bw - 1)/(n-2); sum x + n*y = 1.
    t = (2 * n - 2) / ((n - 2) * total_cpu / n + n * worker_bandwidth)
    y = (t * worker_bandwidth - 1.0) / (n - 2)
    if y <= 0:
        # CPU machines alone are fast enough: parameter-server split by bandwidth.
        return 0.0, [b / total_cpu for b in cpu_bandwidths]
    return y, [t * b / n for b in cpu_bandwidths]


def server_weights(
    worker_hostnames: Sequence[str],
    servers: Sequence[ServerSpot],
    bandwidths: Optional[Mapping[str, float]] = None,
    default_mbit: Optional[float] = None,
) -> List[float]:
    """Share of bytes for each server id (sorted by id), summing to 1.

    A server whose host also runs a worker is "colocated"; others are CPU machines. Several
    servers on one host split that host's share evenly. A host missing from ``bandwidths``
    runs at ``default_mbit`` when given, else at the fastest listed rate.
    """
    if not servers:
        return []
    bandwidths = dict(bandwidths or {})
    worker_hosts = list(dict.fromkeys(worker_hostnames))
    by_host: Dict[str, List[int]] = {}
    for s in sorted(servers, key=lambda s: s.id):
        by_host.setdefault(s.hostname, []).append(s.id)
    cpu_hosts = [h for h in by_host if h not in worker_hosts]
    colocated_hosts = [h for h in by_host if h in worker_hosts]
    if default_mbit is not None and default_mbit > 0:
        default_bw = float(default_mbit)
    else:
        default_bw = max(bandwidths.values(), default=1.0)
    worker_bw = min((bandwidths.get(h, default_bw) for h in worker_hosts), default=default_bw)
    # Worker machines without a server cannot take a colocated share.
    n = len(worker_hosts)
    if cpu_hosts and colocated_hosts:
        y, xs = host_shares(n, [bandwidths.get(h, default_bw) for h in cpu_hosts], worker_bw)
        shares = {h: x for h, x in zip(cpu_hosts, xs)}
        shares.update({h: y for h in colocated_hosts})
    elif cpu_hosts:
        total = sum(bandwidths.get(h, default_bw) for h in cpu_hosts)
        shares = {h: bandwidths.get(h, default_bw) / total for h in cpu_hosts}
    else:
        shares = {h: 1.0 for h in colocated_hosts}
    weights = {sid: shares[h] / len(ids) for h, ids in by_host.items() for sid in ids}
    total = sum(weights.values())
    return [weights[s.id] / total for s in sorted(servers, key=lambda s: s.id)]


def optimal_time(n: int, k: int, model_bytes: float, bandwidth: float) -> float:
    """BytePS Eq. 6: 2n(n-1)M / ((n^2 + kn - 2k) B); PS time M/B once k >= n."""
    if n <= 1:
        return 0.0
    k = min(k, n)
    return 2 * n * (n - 1) * model_bytes / ((n * n + k * n - 2 * k) * bandwidth)


# Answers may exceed their share of the link by this factor: a server can only answer a
# part once every push of it arrived, so answers that fell behind must be able to catch up.
# On the rack (n = 4, k = 2) answers paced at exactly their share took 4 points of the bound
# more than at 1.5x; 1.2x-2x measured the same within noise (docs/performance.md section 6).
ANSWER_HEADROOM = 1.5
# A worker's push flow is capped at its share of the link's TCP payload rate (frames of the
# interface's MTU: linkspeed.payload_fraction) times this. Caps are counted in payload
# bytes, link rates in frame bytes: capped at the share of the frame rate (as until
# 2026-12-01), pushes could run 4.6% ahead of their share at MTU 1500 and queue at the
# shaper behind the answers. At 1.5% above the payload share, ResNet-50's gradient set on
# the rack: the same time at every k, 9-22% more bytes per CPU-second (paired medians of
# 5 repeats); 10% above: 0.5-1.5% slower (docs/results/ab-2026-12-01-push-pace/README.md).
PUSH_HEADROOM = 1.015


def pacing_plan(
    worker_hosts: Sequence[str],
    server_hosts: Sequence[str],
    weights: Sequence[float],
    link_mbit: float,
    bandwidths: Optional[Mapping[str, float]] = None,
    local_reduce: bool = True,
    payload_fraction: float = 1.0,
) -> tuple:
    """Rate caps (bytes/s) that split each host's link by the bytes each flow must carry.

    ``worker_hosts[r]`` is worker rank r's host, ``server_hosts[s]`` server s's host,
    ``weights[s]`` its share of the model. Per unit of model, worker r pushes
    ``weights[s] / L`` to each server s on another host (L: workers on r's host when they
    reduce locally, so each part leaves the host once; else 1) and s answers the same
    bytes. A host's link is divided among the flows leaving it in proportion to those
    bytes, so no flow gets the even per-connection split TCP would give it and finish
    late. Each host's rate is ``bandwidths[host]`` when stated, else ``link_mbit``.

    Returns ``(worker_rates, server_rates)``: ``worker_rates[r][s]`` for worker r's flow to
    server s, that share of the link's payload rate (``payload_fraction`` of its rate:
    linkspeed.payload_fraction) with PUSH_HEADROOM, and ``server_rates[s][r]`` for server
    s's answers to worker r, that share of the link's rate with ANSWER_HEADROOM; 0 means
    unpaced (same host, or ``link_mbit <= 0``).
    """
    if not 0 < payload_fraction <= 1:
        raise ValueError(f"payload_fraction must be in (0, 1], got {payload_fraction}")
    nw, ns = len(worker_hosts), len(server_hosts)
    worker_rates = [[0.0] * ns for _ in range(nw)]
    server_rates = [[0.0] * nw for _ in range(ns)]
    if link_mbit <= 0:
        return worker_rates, server_rates
    per_host: Dict[str, int] = {}
    for h in worker_hosts:
        per_host[h] = per_host.get(h, 0) + 1
    flow = [[0.0] * ns for _ in range(nw)]
    egress: Dict[str, float] = {}
    for r, wh in enumerate(worker_hosts):
        for s, sh in enumerate(server_hosts):
            if sh == wh:
                continue
            b = weights[s] / (per_host[wh] if local_reduce else 1)
            flow[r][s] = b
            egress[wh] = egress.get(wh, 0.0) + b  # push r -> s
            egress[sh] = egress.get(sh, 0.0) + b  # answer s -> r
    bw = dict(bandwidths or {})

    def rate(host: str, b: float) -> float:
        mbit = bw.get(host, link_mbit)
        return mbit * 1e6 / 8 * b / egress[host] if b > 0 else 0.0

    for r, wh in enumerate(worker_hosts):
        for s, sh in enumerate(server_hosts):
            worker_rates[r][s] = PUSH_HEADROOM * payload_fraction * rate(wh, flow[r][s])
            server_rates[s][r] = ANSWER_HEADROOM * rate(sh, flow[r][s])
    return worker_rates, server_rates


def host_link_bytes_per_s(hostname: str, link_mbit: float) -> float:
    """The rate a host's link sends at, bytes/s: its FASTPS_HOST_BANDWIDTHS entry, else
    ``link_mbit``; 0 when pacing is off (``link_mbit <= 0``). A worker's short bursts of
    pushes run at this rate (config.DEFAULT_PACING_BURST_BYTES)."""
    if link_mbit <= 0:
        return 0.0
    mbit = parse_bandwidths(config.host_bandwidths()).get(hostname, link_mbit)
    return mbit * 1e6 / 8


def stated_link_mbit() -> Optional[float]:
    """FASTPS_LINK_MBIT when it is a number (the same on every process, unlike ``auto``,
    which each process measures on its own interface), else None."""
    value = config.link_mbit()
    return value if value is not None and value > 0 else None


_warned_unlisted: set = set()


def membership_weights(membership: Any) -> List[float]:
    """server_weights for a job's membership, with FASTPS_HOST_BANDWIDTHS: what every
    process of the job computes the same way. Hosts the variable does not name run at a
    stated FASTPS_LINK_MBIT, else at the fastest listed rate (said once in a warning: listing
    only the slow host would otherwise make every host look equally slow). Under the rack
    hierarchy (workers on two or more racks): rack_server_weights, with FASTPS_RACK_UPLINKS."""
    worker_racks = [getattr(w, "rack", "") for w in membership.workers]
    if len(set(worker_racks)) > 1:
        return rack_server_weights(
            worker_racks,
            [getattr(s, "rack", "") for s in sorted(membership.servers, key=lambda s: s.id)],
            parse_rack_rates(config.rack_uplinks()),
        )
    bandwidths = parse_bandwidths(config.host_bandwidths())
    workers = [w.hostname for w in membership.workers]
    spots = [ServerSpot(s.id, s.hostname) for s in membership.servers]
    default = stated_link_mbit()
    if bandwidths:
        hosts = set(workers) | {s.hostname for s in spots}
        unlisted = tuple(sorted(hosts - set(bandwidths)))
        if unlisted and unlisted not in _warned_unlisted:
            _warned_unlisted.add(unlisted)
            assumed = default if default is not None else max(bandwidths.values())
            source = "FASTPS_LINK_MBIT" if default is not None else "the fastest listed"
            log.warning(
                "FASTPS_HOST_BANDWIDTHS does not name %s: taken as %.0f Mbit/s (%s); "
                "name every host to be exact",
                ", ".join(unlisted),
                assumed,
                source,
            )
    return server_weights(workers, spots, bandwidths, default)


def membership_pacing(
    membership: Any,
    link_mbit: float,
    local_reduce: bool,
    rack_routes: bool = True,
    payload_fraction: float = 1.0,
) -> tuple:
    """pacing_plan for a job's membership: workers by rank, servers by id. Under the rack
    hierarchy: rack_pacing_plan's worker and server rates, or unpaced for a worker that
    pushes flat although the job names racks (``rack_routes`` False: elastic servers).
    ``payload_fraction``: of this host's link (the workers' push caps, pacing_plan)."""
    workers = sorted(membership.workers, key=lambda w: w.rank)
    servers = sorted(membership.servers, key=lambda s: s.id)
    if len({getattr(w, "rack", "") for w in workers}) > 1:
        rack = membership_rack_pacing(membership, link_mbit, local_reduce)
        if rack is not None and rack_routes:
            return rack.worker_rates, rack.server_rates
        link_mbit = 0.0
    return pacing_plan(
        [w.hostname for w in workers],
        [s.hostname for s in servers],
        membership_weights(membership),
        link_mbit,
        parse_bandwidths(config.host_bandwidths()),
        local_reduce,
        payload_fraction,
    )


# ---------------------------------------------------------------------------------------
# Rack-level hierarchy (PHub §3.4; docs/guide/rack-hierarchy.md).
#
# With workers on r racks, a part owned by a server in rack A is summed in every other
# rack R first, by R's "relay" for that owner (one of R's servers), which pushes one copy
# up to the owner and fans the owner's one answer out. Per unit of model, the uplink of a
# rack that owns a share w of the model carries (1 - w) of relayed sums out and w*(r-1)
# of answers out (the same in): 1 + (r-2)*w. A host that runs one of the rack's h
# servers and one worker moves 2(h-1)/h as a worker and a server inside the rack plus its
# server's cut of the uplink traffic, (1 + (r-2)*w)/h. So with host links of rate B and
# rack uplinks of rate U_R, a round of M bytes needs at least
#
#   T_hier = M * max over racks R of max((2(h_R-1) + 1 + (r-2) w_R) / (h_R B),
#                                        (1 + (r-2) w_R) / U_R)
#
# For r = 2 the uplink term is M/U whatever the split; 2 racks x 4 hosts x 1 Gbit/s behind
# 1 Gbit/s uplinks (4:1) give max(1.75 M/B, M/U) = 1.75 M/B: the in-rack all-reduce term.
# The flat scheme pushes every worker's part across: the uplink carries h_R (1 - w_R) of
# pushes plus w_R (n - h_R) of answers, 4 M out for the same topology, 2.29x the bound.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RackPlan:
    """Who pushes where under the rack hierarchy; servers by position, workers by rank.

    ``relay_via[rank][s]``: the server position that worker ``rank`` pushes server s's
    parts to (s itself when s is in its rack or its rack has no server).
    ``owner_pushers[s]``: pushes server s waits for per part (its rack's pushers plus one
    per other rack with a relay, plus the pushers of racks without a server).
    ``rack_pushers[rank]``: pushes per part a relay in that worker's rack waits for.
    ``relay_rank[rack]``: the worker rank the rack's relays push as (its lowest rank).
    """

    racks: List[str]
    relay_via: List[List[int]]
    owner_pushers: List[int]
    rack_pushers: List[int]
    relay_rank: Dict[str, int]


def parse_rack_rates(text: Optional[str]) -> Dict[str, float]:
    """``FASTPS_RACK_UPLINKS="a=1000,b=250"`` (rack = Mbit/s) -> dict."""
    try:
        return parse_bandwidths(text)
    except FastPSError as exc:
        raise FastPSError(
            str(exc).replace("FASTPS_HOST_BANDWIDTHS", "FASTPS_RACK_UPLINKS")
        ) from None


def rack_shares(uplinks: Sequence[float]) -> List[float]:
    """Share of the model each rack's servers own, from the racks' uplink rates.

    A rack owning w sends 1 + (r-2) w per model byte over its uplink; equalising
    (1 + (r-2) w_R) / U_R over the racks gives w_R = (t U_R - 1) / (r-2) with
    t = (2r-2) / sum U. A rack whose uplink is too slow for any share owns none and the
    rest is solved again. With two racks every split costs the same uplink time: equal.
    """
    r = len(uplinks)
    if r == 0:
        return []
    if any(not u > 0 for u in uplinks):
        raise FastPSError(f"rack uplink rates must be > 0, got {list(uplinks)}")
    if r <= 2:
        return [1.0 / r] * r
    active = list(range(r))
    while True:
        k = len(active)
        total = sum(uplinks[i] for i in active)
        # Racks left out still send their whole sum up (1 per model byte); only the
        # owning racks' terms depend on the split, so solve among them.
        t = (k + r - 2) / total if k > 0 else 0.0
        shares = {i: (t * uplinks[i] - 1.0) / (r - 2) for i in active}
        low = [i for i, w in shares.items() if w <= 0]
        if not low or k == 1:
            out = [0.0] * r
            for i, w in shares.items():
                out[i] = max(w, 0.0)
            s = sum(out)
            return [w / s for w in out] if s > 0 else [1.0 / r] * r
        active = [i for i in active if i not in low]


def rack_plan(
    worker_racks: Sequence[str],
    worker_units: Sequence[str],
    server_racks: Sequence[str],
) -> Optional[RackPlan]:
    """The routes of the rack hierarchy, or None for a flat job (no process names a rack,
    or all workers share one rack).

    ``worker_units[rank]`` names what pushes a part once: the host when workers reduce
    locally first (shared memory), else the rank itself.
    """
    named = [r for r in [*worker_racks, *server_racks] if r]
    if not named:
        return None
    for rank, rack in enumerate(worker_racks):
        if not rack:
            raise FastPSError(
                f"worker {rank} names no rack (FASTPS_RACK) while others do: set it everywhere"
            )
    for pos, rack in enumerate(server_racks):
        if not rack:
            raise FastPSError(
                f"server {pos} names no rack (FASTPS_RACK) while others do: set it everywhere"
            )
    unit_rack: Dict[str, str] = {}
    for rank, (unit, rack) in enumerate(zip(worker_units, worker_racks)):
        if unit_rack.setdefault(unit, rack) != rack:
            raise FastPSError(
                f"worker {rank} on {unit!r} is in rack {rack!r} but another worker there is "
                f"in rack {unit_rack[unit]!r}: a host is in one rack"
            )
    racks = sorted(set(worker_racks))
    if len(racks) < 2:
        return None
    units_in = {rack: len({u for u, rr in unit_rack.items() if rr == rack}) for rack in racks}
    servers_in: Dict[str, List[int]] = {}
    for pos, rack in enumerate(server_racks):
        servers_in.setdefault(rack, []).append(pos)
    relays = [rack for rack in racks if servers_in.get(rack)]
    owner_pushers = []
    for owner_rack in server_racks:
        n = units_in.get(owner_rack, 0)
        for rack in racks:
            if rack != owner_rack:
                n += 1 if rack in relays else units_in[rack]
        owner_pushers.append(n)

    def via(rack: str, owner: int) -> int:
        owner_rack = server_racks[owner]
        here = servers_in.get(rack, [])
        if owner_rack == rack or not here:
            return owner
        # The owner's index among its rack's servers picks the relay, so relayed traffic
        # spreads over the rack's servers as evenly as ownership does.
        return here[servers_in[owner_rack].index(owner) % len(here)]

    relay_via = [[via(rack, s) for s in range(len(server_racks))] for rack in worker_racks]
    relay_rank = {
        rack: min(i for i, rr in enumerate(worker_racks) if rr == rack) for rack in relays
    }
    return RackPlan(
        racks=racks,
        relay_via=relay_via,
        owner_pushers=owner_pushers,
        rack_pushers=[units_in[rack] for rack in worker_racks],
        relay_rank=relay_rank,
    )


def rack_server_weights(
    worker_racks: Sequence[str],
    server_racks: Sequence[str],
    uplinks: Optional[Mapping[str, float]] = None,
) -> List[float]:
    """Share of bytes per server position: each rack's share (rack_shares, from its uplink
    rate; racks named in none get the fastest rate stated, else equal) split evenly over
    its servers. Racks without workers own nothing."""
    uplinks = dict(uplinks or {})
    owning = sorted({r for r in server_racks if r in set(worker_racks)})
    if not owning:
        raise FastPSError(
            f"no server is in a rack with workers (servers' racks {sorted(set(server_racks))}, "
            f"workers' {sorted(set(worker_racks))})"
        )
    default = max(uplinks.values(), default=1.0)
    shares = dict(zip(owning, rack_shares([uplinks.get(r, default) for r in owning])))
    count = {r: server_racks.count(r) for r in owning}
    return [shares[r] / count[r] if r in shares else 0.0 for r in server_racks]


def hierarchy_bound(
    hosts_per_rack: Sequence[int],
    host_mbit: float,
    uplink_mbit: Sequence[float],
    model_bytes: float,
    shares: Optional[Sequence[float]] = None,
) -> float:
    """Seconds per round of ``model_bytes`` under the hierarchy (formula above); racks
    with one server and one worker per host, owning ``shares`` (default rack_shares)."""
    r = len(hosts_per_rack)
    if shares is None:
        shares = rack_shares(uplink_mbit)
    b = host_mbit * 1e6 / 8
    worst = 0.0
    for h, u, w in zip(hosts_per_rack, uplink_mbit, shares):
        up = 1.0 + (r - 2) * w if r > 1 else 0.0
        worst = max(worst, (2 * (h - 1) + up) / (h * b), up / (u * 1e6 / 8))
    return model_bytes * worst


def flat_bound(
    hosts_per_rack: Sequence[int],
    host_mbit: float,
    uplink_mbit: Sequence[float],
    model_bytes: float,
) -> float:
    """Seconds per round without the hierarchy: every worker pushes to every server (one
    per host, equal shares), so a rack's uplink carries h (1 - w) of pushes and w (n - h)
    of answers each way."""
    n = sum(hosts_per_rack)
    b = host_mbit * 1e6 / 8
    worst = 2 * (n - 1) / (n * b) if n > 1 else 0.0
    for h, u in zip(hosts_per_rack, uplink_mbit):
        w = h / n
        worst = max(worst, (h * (1 - w) + w * (n - h)) / (u * 1e6 / 8))
    return model_bytes * worst


def membership_rack_plan(membership: Any, shm: bool) -> Optional[RackPlan]:
    """rack_plan for a job's membership: workers by rank, servers by position."""
    workers = sorted(membership.workers, key=lambda w: w.rank)
    servers = [s for s in sorted(membership.servers, key=lambda s: s.id) if s.addr]
    return rack_plan(
        [w.rack for w in workers],
        [w.hostname if shm else f"rank {w.rank}" for w in workers],
        [s.rack for s in servers],
    )


@dataclass(frozen=True)
class RackPacing:
    """Rate caps (bytes/s) of every flow under the rack hierarchy; 0: unpaced.

    ``worker_rates[rank][s]``: worker ``rank``'s pushes to server s (owned and relayed
    parts alike). ``server_rates[s][rank]``: server s's answers to that worker.
    ``relay_rates[v][g]``: relay v's rack sums up to owner g. ``relay_answer_rates[g][v]``:
    owner g's answers to relay v. Answers and relayed sums carry ANSWER_HEADROOM: both
    can only go once a sum is complete, so what fell behind must be able to catch up.
    """

    worker_rates: List[List[float]]
    server_rates: List[List[float]]
    relay_rates: List[List[float]]
    relay_answer_rates: List[List[float]]


def rack_pacing_plan(
    worker_hosts: Sequence[str],
    server_hosts: Sequence[str],
    weights: Sequence[float],
    plan: RackPlan,
    link_mbit: float,
    bandwidths: Optional[Mapping[str, float]] = None,
    local_reduce: bool = True,
) -> RackPacing:
    """pacing_plan for the routes of the rack hierarchy: each host's link is split among
    the flows leaving it in proportion to the bytes each carries per model byte.

    Worker r pushes ``weights[g] / L`` of every owner g to ``plan.relay_via[r][g]`` (L as
    in pacing_plan), which answers the same; a relay v sends ``weights[g]`` up to each
    owner g it relays for, and g answers v the same. Without this the host's link is
    shared per connection by TCP: the in-rack flows (each a quarter of the model on
    4-host racks) and the relay's flows (an eighth) would get equal rates.
    """
    nw, ns = len(worker_hosts), len(server_hosts)
    rates = RackPacing(
        worker_rates=[[0.0] * ns for _ in range(nw)],
        server_rates=[[0.0] * nw for _ in range(ns)],
        relay_rates=[[0.0] * ns for _ in range(ns)],
        relay_answer_rates=[[0.0] * ns for _ in range(ns)],
    )
    if link_mbit <= 0:
        return rates
    per_host: Dict[str, int] = {}
    for h in worker_hosts:
        per_host[h] = per_host.get(h, 0) + 1
    push = [[0.0] * ns for _ in range(nw)]  # worker r -> server v, per model byte
    relay = [[0.0] * ns for _ in range(ns)]  # relay v -> owner g, per model byte
    egress: Dict[str, float] = {}

    def add(host: str, b: float) -> None:
        egress[host] = egress.get(host, 0.0) + b

    for r, wh in enumerate(worker_hosts):
        for g in range(ns):
            v = plan.relay_via[r][g]
            if server_hosts[v] != wh:
                push[r][v] += weights[g] / (per_host[wh] if local_reduce else 1)
            if v != g:
                relay[v][g] = weights[g]  # the same for every worker of v's rack
    for r, wh in enumerate(worker_hosts):
        for v, b in enumerate(push[r]):
            add(wh, b)  # the push
            add(server_hosts[v], b)  # its answer
    for v in range(ns):
        for g, b in enumerate(relay[v]):
            add(server_hosts[v], b)  # the rack sum up
            add(server_hosts[g], b)  # the owner's answer down
    bw = dict(bandwidths or {})

    def rate(host: str, b: float) -> float:
        mbit = bw.get(host, link_mbit)
        return mbit * 1e6 / 8 * b / egress[host] if b > 0 else 0.0

    for r, wh in enumerate(worker_hosts):
        for v in range(ns):
            rates.worker_rates[r][v] = rate(wh, push[r][v])
            rates.server_rates[v][r] = ANSWER_HEADROOM * rate(server_hosts[v], push[r][v])
    for v in range(ns):
        for g in range(ns):
            rates.relay_rates[v][g] = ANSWER_HEADROOM * rate(server_hosts[v], relay[v][g])
            rates.relay_answer_rates[g][v] = ANSWER_HEADROOM * rate(server_hosts[g], relay[v][g])
    return rates


def membership_rack_pacing(
    membership: Any, link_mbit: float, local_reduce: bool
) -> Optional[RackPacing]:
    """rack_pacing_plan for a job's membership (workers by rank, servers by position), or
    None when the job is flat."""
    plan = membership_rack_plan(membership, local_reduce)
    if plan is None:
        return None
    workers = sorted(membership.workers, key=lambda w: w.rank)
    servers = [s for s in sorted(membership.servers, key=lambda s: s.id) if s.addr]
    return rack_pacing_plan(
        [w.hostname for w in workers],
        [s.hostname for s in servers],
        membership_weights(membership),
        plan,
        link_mbit,
        parse_bandwidths(config.host_bandwidths()),
        local_reduce,
    )
