"""push_pull on the simulated cluster: workers cut tensors into parts with the real
partitioner, push them in the order the real push scheduler admits, servers sum what
arrives and answer every worker once all pushes of a part are in.

What is the real code and what is modelled:
- parts: ``fastps._core.partition`` (csrc/worker/partitioner.cc) with the placement's
  weights and the tensor ids of the real names (``fastps._core.tensor_id``);
- push order, credit and window: ``fastps._core.PushScheduler`` (csrc/worker/push_scheduler),
  told when a part's bytes left the connection (``written``) and when it was answered;
- connections: one per (worker, server) each way, sending parts one after the other, capped
  at the pacing rate (``cluster.group_pacing``) and fair-shared on every link they cross;
- servers: a FIFO engine per server that adds each arriving push at the measured kernel
  speed (three streams: read two buffers, write one) plus a fixed per-message cost.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Callable, Deque, Dict, List, Optional, Set, Tuple

from .. import _core, config
from ..control import placement
from .cluster import HostGroup, Layout, group_pacing
from .events import EventLoop
from .network import Link, Network

# Summation kernel, float32 AVX-512, GB/s over three streams (docs/performance.md section 1).
KERNEL_GBPS = 22.5


@dataclass(frozen=True)
class CommOptions:
    partition_bytes: int = config.NETWORK_PARTITION_BYTES  # parts across a network
    credit_bytes: Optional[int] = None  # None: the partition size (fastps.config)
    window_bytes: int = config.DEFAULT_WINDOW_BYTES
    paced: bool = True  # FASTPS_LINK_MBIT set (the default reads it from the link)
    kernel_gbps: float = KERNEL_GBPS
    message_s: float = 20e-6  # server CPU per arriving push beyond the add (framing, syscalls)
    compression: float = 1.0  # bytes on the wire per gradient byte (0.5: fp16, ~1/32: 1-bit)
    # Answers' pacing over their share, as the real servers (placement.ANSWER_HEADROOM):
    # the headroom only takes a link's spare room (fastps.sim.network, "Headroom").
    answer_headroom: float = placement.ANSWER_HEADROOM
    # Servers nudge a part's last pusher once every other copy is in, and a pusher that
    # pushes another part there while this one has been half in for nudge_overdue_s
    # (FASTPS_NUDGE; the real engine's rule and scheduler's boost). Modelled one latency
    # after that push, ahead of any answer.
    nudge: bool = True
    nudge_overdue_s: float = config.DEFAULT_NUDGE_OVERDUE
    # ... which moves a part ahead only once it has waited this long in the worker's queue
    # (FASTPS_NUDGE_MIN_WAIT).
    nudge_min_wait_s: float = config.DEFAULT_NUDGE_MIN_WAIT

    def check(self) -> None:
        if self.partition_bytes <= 0:
            raise ValueError(f"partition_bytes must be > 0, got {self.partition_bytes}")
        if self.window_bytes < 0:
            raise ValueError(f"window_bytes must be >= 0, got {self.window_bytes}")
        if not 0 < self.compression <= 1:
            raise ValueError(f"compression must be in (0, 1], got {self.compression}")
        if not self.nudge_overdue_s >= 0:
            raise ValueError(f"nudge_overdue_s must be >= 0, got {self.nudge_overdue_s}")
        if not self.nudge_min_wait_s >= 0:
            raise ValueError(f"nudge_min_wait_s must be >= 0, got {self.nudge_min_wait_s}")
        if not self.answer_headroom >= 1:
            raise ValueError(f"answer_headroom must be >= 1, got {self.answer_headroom}")
        if not self.kernel_gbps > 0:
            raise ValueError(f"kernel speed must be > 0 GB/s, got {self.kernel_gbps}")


class _Connection:
    """Parts leave one after the other; each is delivered ``latency`` after its last byte."""

    def __init__(
        self,
        loop: EventLoop,
        net: Network,
        links: List[Tuple[Link, float]],
        cap: float,
        latency: float,
        base: Optional[float] = None,
    ) -> None:
        self.loop, self.net, self.links, self.cap, self.latency = loop, net, links, cap, latency
        self.base = base
        self.queue: Deque[Tuple[float, Callable[[], None], Callable[[], None]]] = deque()
        self.busy = False

    def send(
        self, nbytes: float, on_written: Callable[[], None], on_arrived: Callable[[], None]
    ) -> None:
        self.queue.append((nbytes, on_written, on_arrived))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.queue:
            self.busy = False
            return
        self.busy = True
        nbytes, on_written, on_arrived = self.queue.popleft()

        def sent() -> None:
            on_written()
            if self.latency > 0:
                self.loop.after(self.latency, on_arrived)
            else:
                on_arrived()
            self._next()

        if not self.links:  # same host: shared memory, no link
            self.loop.after(0.0, sent)
        else:
            self.net.send(self.links, nbytes, 0.0, sent, self.cap, self.base)


class _Engine:
    """A server's summing: FIFO work on ``threads`` equal threads (0, as in
    ``FASTPS_ENGINE_THREADS=0``: one, the receiving thread)."""

    def __init__(self, loop: EventLoop, threads: int) -> None:
        self.loop = loop
        self.free_at = [0.0] * max(1, threads)
        self.busy_s = 0.0

    def run(self, seconds: float, then: Callable[[], None]) -> None:
        i = min(range(len(self.free_at)), key=self.free_at.__getitem__)
        start = max(self.loop.now, self.free_at[i])
        self.free_at[i] = start + seconds
        self.busy_s += seconds
        self.loop.at(start + seconds, then)


class PushPull:
    """Every worker group's push_pull of named tensors; ``submit`` calls back per tensor."""

    def __init__(
        self,
        loop: EventLoop,
        net: Network,
        lay: Layout,
        opts: CommOptions,
        engine_threads: int = config.DEFAULT_ENGINE_THREADS,
    ) -> None:
        opts.check()
        self.loop, self.net, self.lay, self.opts = loop, net, lay, opts
        c = lay.cluster
        up: Dict[int, Link] = {}
        down: Dict[int, Link] = {}
        for g in lay.groups:
            up[g.index] = net.link(f"{g.hosts[0]}+{g.count - 1}.up", lay.bytes_per_s(g.mbit))
            down[g.index] = net.link(f"{g.hosts[0]}+{g.count - 1}.down", lay.bytes_per_s(g.mbit))
        rack_up = [
            net.link(f"rack{r}.up", lay.bytes_per_s(m)) for r, m in enumerate(lay.rack_uplink_mbit)
        ]
        rack_down = [
            net.link(f"rack{r}.down", lay.bytes_per_s(m))
            for r, m in enumerate(lay.rack_uplink_mbit)
        ]
        self.shares = list(lay.server_share)
        push_cap, answer_cap = group_pacing(lay, opts.paced, opts.answer_headroom)
        self.push_conn: Dict[Tuple[int, int], _Connection] = {}
        self.answer_conn: Dict[Tuple[int, int], _Connection] = {}
        for a in lay.worker_groups:
            for s in lay.groups:
                f = lay.remote_fraction(a, s)
                copies = a.count * f
                push_links: List[Tuple[Link, float]] = []
                answer_links: List[Tuple[Link, float]] = []
                if f > 0:
                    push_links = [(up[a.index], f), (down[s.index], copies / s.count)]
                    answer_links = [(up[s.index], copies / s.count), (down[a.index], f)]
                    if a.rack != s.rack:
                        push_links += [(rack_up[a.rack], copies), (rack_down[s.rack], copies)]
                        answer_links += [(rack_up[s.rack], copies), (rack_down[a.rack], copies)]
                lat = c.latency_s if f > 0 else 0.0
                key = (a.index, s.index)
                self.push_conn[key] = _Connection(loop, net, push_links, push_cap[key], lat)
                cap = answer_cap[key]
                base = cap / opts.answer_headroom if math.isfinite(cap) else None
                self.answer_conn[key] = _Connection(loop, net, answer_links, cap, lat, base)
        # The real scheduler per worker group. Its window is window_bytes x share x servers;
        # a group of m servers stands for m windows, so scale by real/simulated servers.
        credit = opts.credit_bytes or opts.partition_bytes
        window = int(opts.window_bytes * lay.num_servers / len(lay.groups))
        self.sched = {
            a.index: _core.PushScheduler(credit, window, self.shares, opts.nudge_min_wait_s)
            for a in lay.worker_groups
        }
        self.engines = {s.index: _Engine(loop, engine_threads) for s in lay.groups}
        self._parts: Dict[Tuple[str, int], List[Tuple[int, int, int]]] = {}
        self._ids: Dict[str, int] = {}
        self._arrived: Dict[Tuple[int, int, int], int] = {}  # (server, tensor, part) -> groups
        self._pushers: Dict[Tuple[int, int, int], Set[int]] = {}  # ... which ones (nudges)
        # (server, worker group) -> parts half in without its copy: (since, key, prio)
        self._awaited: Dict[Tuple[int, int], Deque[Tuple[float, Tuple[int, int, int], int]]] = {}
        # As the real servers: nudges where every pusher is one worker, 3 or more of them.
        groups = lay.worker_groups
        self._nudges = opts.nudge and len(groups) >= 3 and all(g.count == 1 for g in groups)
        self._left: Dict[Tuple[int, int], int] = {}  # (worker group, tensor) -> parts left
        self._done: Dict[Tuple[int, int], Callable[[], None]] = {}
        self._tag: Dict[Tuple[int, int], Tuple[int, int, int, int]] = {}

    # ------------------------------------------------------------------ parts
    def tensor_id(self, name: str) -> int:
        tid = self._ids.get(name)
        if tid is None:
            tid = self._ids[name] = _core.tensor_id(name)
        return tid

    def parts(self, name: str, nbytes: int, elem_size: int = 4) -> List[Tuple[int, int, int]]:
        """(index, bytes on the wire, server group) of each part: the real partitioner."""
        key = (name, nbytes)
        got = self._parts.get(key)
        if got is None:
            spans = _core.partition(
                self.opts.partition_bytes, self.shares, self.tensor_id(name), nbytes, elem_size
            )
            got = [(i, ln, s) for i, _, ln, s in spans]
            self._parts[key] = got
        return got

    # ------------------------------------------------------------------ worker side
    def submit(
        self, group: HostGroup, name: str, nbytes: int, priority: int, on_done: Callable[[], None]
    ) -> None:
        tid = self.tensor_id(name)
        key = (group.index, tid)
        if key in self._left:
            raise RuntimeError(
                f"tensor {name!r} submitted again by {group.hosts[0]} "
                "before its previous round finished"
            )
        parts = self.parts(name, nbytes)
        if not parts:
            self.loop.after(0.0, on_done)
            return
        self._left[key] = len(parts)
        self._done[key] = on_done
        tickets = []
        for idx, ln, s in parts:
            tickets.append((priority, tid, idx, s, ln, 0))
        self.sched[group.index].enqueue(tickets, self.loop.now)
        self._pump(group)

    def _pump(self, group: HostGroup) -> None:
        sched = self.sched[group.index]
        for prio, tid, idx, s, ln, _ in sched.take_admissible():
            wire = ln * self.opts.compression
            self.push_conn[(group.index, s)].send(
                wire,
                partial(self._written, group, s, ln),
                partial(self._arrive, group, s, tid, idx, ln, prio),
            )

    def _written(self, group: HostGroup, server: int, ln: int) -> None:
        self.sched[group.index].written(server, ln)
        self._pump(group)

    # ------------------------------------------------------------------ server side
    def _arrive(self, group: HostGroup, s: int, tid: int, idx: int, ln: int, prio: int) -> None:
        srv = self.lay.groups[s]
        per_member = group.count / srv.count  # pushes each member of the group sums
        add_s = 3.0 * ln / (self.opts.kernel_gbps * 1e9) + self.opts.message_s
        self.engines[s].run(
            per_member * add_s, lambda: self._summed(s, tid, idx, ln, prio, group.index)
        )

    def _summed(self, s: int, tid: int, idx: int, ln: int, prio: int, pusher: int = -1) -> None:
        key = (s, tid, idx)
        got = self._arrived.get(key, 0) + 1
        groups = self.lay.worker_groups
        if self._nudges:
            pushed = self._pushers.setdefault(key, set())
            pushed.add(pusher)
            lat = self.lay.cluster.latency_s
            self._nudge_overdue(s, pusher)
            if got == len(groups) - 1:
                last = next(g for g in groups if g.index not in pushed)
                self.loop.after(lat, self._nudge, last, s, tid, idx, prio)
            elif got == (len(groups) + 1) // 2:
                for g in groups:
                    if g.index not in pushed:
                        q = self._awaited.setdefault((s, g.index), deque())
                        q.append((self.loop.now, key, prio))
        if got < len(groups):
            self._arrived[key] = got
            return
        self._arrived.pop(key, None)
        self._pushers.pop(key, None)
        wire = ln * self.opts.compression
        for a in self.lay.worker_groups:
            self.answer_conn[(a.index, s)].send(
                wire, _noop, partial(self._answered, a, s, tid, idx, prio)
            )

    def _nudge_overdue(self, s: int, pusher: int) -> None:
        q = self._awaited.get((s, pusher))
        while q:
            since, key, prio = q[0]
            pushed = self._pushers.get(key)
            if pushed is not None and pusher not in pushed:
                if self.loop.now - since < self.opts.nudge_overdue_s:
                    return
                group = next(g for g in self.lay.worker_groups if g.index == pusher)
                self.loop.after(
                    self.lay.cluster.latency_s, self._nudge, group, s, key[1], key[2], prio
                )
            q.popleft()

    def _nudge(self, group: HostGroup, s: int, tid: int, idx: int, prio: int) -> None:
        if self.sched[group.index].boost(prio, tid, idx, s, 0, self.loop.now):
            self._pump(group)

    def _answered(self, group: HostGroup, s: int, tid: int, idx: int, prio: int) -> None:
        self.sched[group.index].answered(prio, tid, idx, s)
        key = (group.index, tid)
        self._left[key] -= 1
        if self._left[key] == 0:
            del self._left[key]
            self._done.pop(key)()
        self._pump(group)


def _noop() -> None:
    return None
