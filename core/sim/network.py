"""Links as fluid pipes shared max-min fairly among the flows on them, with per-flow caps.

A flow moves ``size`` bytes of one part. It loads every link it crosses with a coefficient:
1 for a plain host-to-host transfer; in a simulation where one flow stands for a group of
identical hosts (``fastps.sim.cluster``) the coefficient is how many of the group's copies
a link carries per byte of the part. Rates follow progressive filling: every unfrozen flow's
rate rises together until a link is full (its flows freeze) or a flow reaches its cap (the
pacing rate, ``SO_MAX_PACING_RATE`` in the real code). That is TCP's long-run share per
connection on a shared bottleneck, and exactly a paced flow's rate when the caps fit.

**Headroom.** A flow may have a ``base`` below its cap (the servers' answers: paced at 1.5x
their share, ``placement.ANSWER_HEADROOM``): the links are first shared with every flow
limited to its base, and only the capacity left over goes to the headroom above it. On the
emulated rack the headroom shortens answers when a link is otherwise idle (1 MiB parts,
where each worker-server pair runs stop-and-wait, reach 0.6-0.7 of the bound only with it)
and costs the pushes nothing when every link is busy (256 KiB parts reach 0.94-0.99 of the
bound; a share that let answers take more than their base costs the pushes 10-25% there):
docs/design/simulator.md, "Answer headroom".

A flow takes the links as soon as it is sent and is delivered ``latency`` seconds after its
last byte left (the trip through the switch): back-to-back parts on one connection keep
the pipe full. Rates change only when a flow starts or ends, so the model is exact between
events.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .events import EventLoop

_EPS = 1e-12


class Link:
    __slots__ = ("name", "capacity")

    def __init__(self, name: str, capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"link {name!r}: capacity must be > 0 bytes/s, got {capacity!r}")
        self.name = name
        self.capacity = float(capacity)


class Flow:
    __slots__ = ("links", "left", "cap", "base", "rate", "on_done", "size", "latency")

    def __init__(
        self,
        links: Tuple[Tuple[Link, float], ...],
        size: float,
        cap: float,
        on_done: Callable[[], Any],
        latency: float = 0.0,
        base: Optional[float] = None,
    ) -> None:
        self.links = links
        self.size = size
        self.left = size
        self.cap = cap
        self.base = cap if base is None else min(base, cap)
        self.rate = 0.0
        self.on_done = on_done
        self.latency = latency


class Network:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self.links: Dict[str, Link] = {}
        self._active: List[Flow] = []
        self._last = 0.0
        self._generation = 0
        self._reshare_due = False
        # Capacity left on each link by the current rates (links without flows: absent),
        # and when the next flow is planned to finish.
        self._room: Dict[Link, float] = {}
        self._next_at = math.inf

    def link(self, name: str, capacity: float) -> Link:
        if name in self.links:
            raise ValueError(f"link {name!r} defined twice")
        lk = Link(name, capacity)
        self.links[name] = lk
        return lk

    def send(
        self,
        links: List[Tuple[Link, float]],
        size: float,
        latency: float,
        on_done: Callable[[], Any],
        cap: float = math.inf,
        base: Optional[float] = None,
    ) -> None:
        """Moves ``size`` bytes across ``links`` (with their coefficients); ``on_done`` runs
        when the last byte arrived. ``cap``: the flow's own rate limit (bytes/s); ``base``
        (default: the cap): the rate it competes for first, the rest only from spare room."""
        if size < 0:
            raise ValueError(f"flow size must be >= 0, got {size}")
        if not cap > 0:
            raise ValueError(f"flow cap must be > 0, got {cap}")
        if base is not None and not base > 0:
            raise ValueError(f"flow base rate must be > 0, got {base}")
        used = tuple((lk, c) for lk, c in links if c > 0)
        if size == 0 or not used:
            self.loop.after(latency, on_done)
            return
        self._advance()
        f = Flow(used, float(size), float(cap), on_done, latency, base)
        self._active.append(f)
        if self._reshare_due or not self._fits(f):
            self._mark()
            return
        # Its cap fits in the room every link has left: nobody else's rate changes (a link
        # with room bottlenecks no flow), so the flow just takes its cap.
        f.rate = f.cap
        room = self._room
        for lk, c in used:
            room[lk] = room.get(lk, lk.capacity) - c * f.cap
        t = self.loop.now + f.left / f.rate
        if t < self._next_at:
            self._plan_finish(t)

    def _fits(self, f: Flow) -> bool:
        if f.cap == math.inf:
            return False
        room = self._room
        return all(room.get(lk, lk.capacity) - c * f.cap > 1e-9 * lk.capacity for lk, c in f.links)

    def _frees_nothing(self, f: Flow) -> bool:
        """Whether ``f`` crosses only links with room left: then no other flow is limited
        by any of them, and its end changes no rate."""
        room = self._room
        return all(room.get(lk, lk.capacity) > 1e-9 * lk.capacity for lk, _ in f.links)

    def _plan_finish(self, when: float) -> None:
        self._generation += 1
        self._next_at = when
        self.loop.at(when, self._finish, self._generation)

    def _mark(self) -> None:
        # Many flows start and end at one instant: share once, after all of them.
        self._generation += 1
        if not self._reshare_due:
            self._reshare_due = True
            self.loop.after(0.0, self._reshare_now)

    def _reshare_now(self) -> None:
        self._reshare_due = False
        self._advance()
        self._reshare()

    # --------------------------------------------------------------------- fluid core
    def _advance(self) -> None:
        dt = self.loop.now - self._last
        if dt > 0:
            for f in self._active:
                f.left -= f.rate * dt
        self._last = self.loop.now

    def _finish(self, generation: int) -> None:
        if generation != self._generation:
            return  # rates changed since this completion was planned
        self._advance()
        done = [f for f in self._active if f.left <= _EPS * max(1.0, f.size)]
        if not done:  # rounding: the nearest flow is a hair short; finish it now
            done = [min(self._active, key=lambda f: f.left / f.rate if f.rate > 0 else math.inf)]
        ids = {id(f) for f in done}
        self._active = [f for f in self._active if id(f) not in ids]
        self._next_at = math.inf
        if not self._reshare_due and all(self._frees_nothing(f) for f in done):
            room = self._room
            for f in done:
                for lk, c in f.links:
                    room[lk] += c * f.rate
            soonest = min((f.left / f.rate for f in self._active if f.rate > 0), default=math.inf)
            if soonest < math.inf:
                self._plan_finish(self.loop.now + max(soonest, 0.0))
        else:
            self._mark()
        for f in done:
            if f.latency > 0:
                self.loop.after(f.latency, f.on_done)
            else:
                f.on_done()

    def _reshare(self) -> None:
        """Max-min fair rates with caps, in two rounds: every flow up to its base, then the
        room left to the flows with headroom above their base, up to their caps."""
        self._generation += 1
        flows = self._active
        if not flows:
            self._room = {}
            self._next_at = math.inf
            return
        room: Dict[Link, float] = {}
        for f in flows:
            f.rate = 0.0
            for lk, _ in f.links:
                room[lk] = lk.capacity
        _allot(flows, {id(f): f.base for f in flows}, room)
        # Room only shrinks in the second round: a flow with a full link gets nothing more.
        extra = {
            id(f): f.cap - f.base
            for f in flows
            if f.cap > f.base and all(room[lk] > 1e-9 * lk.capacity for lk, _ in f.links)
        }
        if extra:
            _allot([f for f in flows if id(f) in extra], extra, room)
        self._room = room
        soonest = min((f.left / f.rate for f in flows if f.rate > 0), default=math.inf)
        if math.isinf(soonest):
            raise RuntimeError("network stalled: active flows with zero rate")
        self._plan_finish(self.loop.now + max(soonest, 0.0))


def _allot(flows: List[Flow], want: Dict[int, float], room: Dict[Link, float]) -> None:
    """Adds to each flow's rate its max-min fair share of ``room`` (capacity left per link),
    at most ``want[id(flow)]``, and takes it from ``room`` (progressive filling).

    A link whose flows' wants all fit can never fill before they get them, so a flow
    crossing only such links simply gets its want (the common case when pacing fits the
    links); the filling runs on the other flows, over the overloaded links only."""
    demand: Dict[Link, float] = {}
    for f in flows:
        x = want[id(f)]
        for lk, c in f.links:
            demand[lk] = demand.get(lk, 0.0) + c * x
    over = {lk for lk, d in demand.items() if d > room[lk] * (1.0 + 1e-9)}
    rest: List[Flow] = []
    for f in flows:
        if over and any(lk in over for lk, _ in f.links):
            rest.append(f)
            continue
        x = want[id(f)]
        f.rate += x
        for lk, c in f.links:
            room[lk] -= c * x
    if not rest:
        return
    # Water-filling over the overloaded links: the tightest link's fair level (room over
    # the coefficients of its unfrozen flows) never falls when a flow is frozen at or below
    # it, so flows that want less than that level get what they want (smallest first),
    # and otherwise every unfrozen flow on the tightest link is frozen at its level.
    load: Dict[Link, float] = {lk: 0.0 for lk in over}
    on: Dict[Link, List[Flow]] = {lk: [] for lk in over}
    for f in rest:
        for lk, c in f.links:
            if lk in load:
                load[lk] += c
                on[lk].append(f)
    order = sorted(rest, key=lambda f: want[id(f)])
    frozen: Dict[int, float] = {}

    def freeze(f: Flow, x: float) -> None:
        frozen[id(f)] = x
        f.rate += x
        for lk, c in f.links:
            room[lk] -= c * x
            if lk in load:
                load[lk] -= c

    i = 0
    while len(frozen) < len(order):
        tightest, level = None, math.inf
        for lk, ld in load.items():
            if ld > _EPS:
                lv = room[lk] / ld
                if lv < level:
                    tightest, level = lk, lv
        while i < len(order) and id(order[i]) in frozen:
            i += 1
        if want[id(order[i])] <= level:
            while i < len(order) and want[id(order[i])] <= level:
                if id(order[i]) not in frozen:
                    freeze(order[i], want[id(order[i])])
                i += 1
            continue
        if tightest is None:  # cannot happen: every flow left crosses an overloaded link
            raise RuntimeError("network sharing: a flow wants more than any link limits")
        level = max(level, 0.0)
        for f in on[tightest]:
            if id(f) not in frozen:
                freeze(f, level)


def fair_rates(
    capacities: Dict[str, float],
    flows: Sequence[Tuple[Any, ...]],
) -> List[float]:
    """The rates the network gives ``flows`` ((link -> coefficient), cap[, base]) on links
    of ``capacities``: the same sharing, for tests and quick what-ifs."""
    loop = EventLoop()
    net = Network(loop)
    lks = {name: net.link(name, c) for name, c in capacities.items()}
    out = []
    for coefs, cap, *base in flows:
        f = Flow(
            tuple((lks[n], c) for n, c in coefs.items()),
            1.0,
            cap or math.inf,
            lambda: None,
            base=base[0] if base else None,
        )
        net._active.append(f)
        out.append(f)
    net._reshare()
    return [f.rate for f in out]
