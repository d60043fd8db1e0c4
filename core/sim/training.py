"""Training iterations on the simulated cluster: each worker's GPU runs the layers' forward
and backward passes (the emulator's per-layer times), backward hands each layer's gradients
to push_pull as it finishes them, and the next forward pass waits for the sums it needs:

- ``cross-barrier``: layer i's forward waits only for layer i's sums (P3 section 4,
  BytePS's cross-barrier; plugins/torch/cross_barrier.py);
- ``sync``: the optimizer's step waits for every sum before the next forward pass.

Priorities are the torch plugin's: a gradient's priority is 2T minus its position in the
forward order (plugins/torch/optimizer.py), so the first layer's sums go first; without
priorities every gradient has priority 0 and the order is the tensor ids' (name hashes).

``communicate`` is the communication benchmark instead (benchmarks/comm_rack.py): every
iteration starts all gradients at once and waits for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from .bound import byteps_bound, link_bound
from .cluster import Cluster, HostGroup, layout
from .events import EventLoop
from .network import Network
from .pushpull import CommOptions, PushPull
from .workload import Workload

MODES = ("cross-barrier", "sync")


@dataclass(frozen=True)
class TrainOptions:
    mode: str = "cross-barrier"
    priorities: bool = True
    submit_s: float = 0.0  # worker CPU per gradient handed to the core (serial, off the GPU)
    iterations: int = 5
    warmup: int = 2  # iterations left out of the average
    seed: int = 0
    jitter: float = 0.0  # relative standard deviation of every layer's time (seeded draws)
    # Host time per layer and pass on top of the GPU's (launch, wake-up). On the emulated rack
    # the layers are sleeps that wake late while 2 shared cores run every host's network
    # stack and the servers: fitted there (benchmarks/sim_calibration.py), ~0 on a real GPU
    # host.
    layer_overhead_s: float = 0.0

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.iterations <= self.warmup or self.warmup < 0:
            raise ValueError(
                f"need iterations > warmup >= 0, got {self.iterations} and {self.warmup}"
            )
        if self.submit_s < 0 or self.jitter < 0 or self.layer_overhead_s < 0:
            raise ValueError("submit_s, jitter and layer_overhead_s must be >= 0")


@dataclass
class Result:
    iteration_s: float  # steady-state seconds per iteration, slowest worker
    compute_s: float  # forward + backward of the slowest worker without communication
    bound_s: float  # communication lower bound over every link (bound.link_bound)
    eq6_s: float  # BytePS Eq. 6 at the goodput (equal links, one switch)
    starts: Dict[str, List[float]] = field(default_factory=dict)  # per worker group
    events: int = 0
    stalled_s: float = 0.0  # per iteration, forward passes waiting for sums (slowest worker)

    @property
    def ideal_s(self) -> float:
        return max(self.compute_s, self.bound_s)


def _period(starts: List[float], warmup: int) -> float:
    timed = starts[warmup:]
    return (timed[-1] - timed[0]) / (len(timed) - 1)


class _Worker:
    def __init__(self, sim: _Sim, group: HostGroup) -> None:
        self.sim, self.g = sim, group
        n = len(sim.work.layers)
        self.ready = [True] * n  # layer's sums of the previous iteration are in
        self.left = [0] * n
        self.waiting: Optional[int] = None
        self.iteration = 0
        self.starts: List[float] = []
        self.cpu_free = 0.0
        self.stalled = 0.0
        self._stall_from = 0.0

    def layer_time(self, seconds: float) -> float:
        t = seconds * self.g.compute_scale + self.sim.opts.layer_overhead_s
        if self.sim.opts.jitter > 0:
            t *= max(0.0, 1.0 + self.sim.opts.jitter * float(self.sim.rng.standard_normal()))
        return t

    def start_iteration(self) -> None:
        loop = self.sim.loop
        self.starts.append(loop.now)
        if self.iteration >= self.sim.opts.iterations:
            return
        self.forward(0)

    def forward(self, i: int) -> None:
        sim = self.sim
        need_all = sim.opts.mode == "sync" and i == 0
        blocked = (not all(self.ready)) if need_all else not self.ready[i]
        if blocked:
            self.waiting = i
            self._stall_from = sim.loop.now
            return
        sim.loop.after(self.layer_time(sim.work.layers[i].forward_s), self.forward_done, i)

    def forward_done(self, i: int) -> None:
        if i + 1 < len(self.sim.work.layers):
            self.forward(i + 1)
        else:
            self.backward(len(self.sim.work.layers) - 1)

    def backward(self, i: int) -> None:
        self.sim.loop.after(
            self.layer_time(self.sim.work.layers[i].backward_s), self.backward_done, i
        )

    def backward_done(self, i: int) -> None:
        sim = self.sim
        layer = sim.work.layers[i]
        self.ready[i] = False
        self.left[i] = len(layer.tensors)
        if not layer.tensors:
            self.ready[i] = True
        for name, nbytes in layer.tensors:
            self.cpu_free = max(sim.loop.now, self.cpu_free) + sim.opts.submit_s
            prio = sim.priority[name]
            sim.loop.at(
                self.cpu_free,
                sim.pp.submit,
                self.g,
                name,
                nbytes,
                prio,
                lambda i=i: self.tensor_done(i),
            )
        if i > 0:
            self.backward(i - 1)
        else:
            self.iteration += 1
            self.start_iteration()

    def tensor_done(self, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0:
            self.ready[i] = True
            if self.waiting is not None:
                w = self.waiting
                need_all = self.sim.opts.mode == "sync" and w == 0
                if all(self.ready) if need_all else self.ready[w]:
                    self.waiting = None
                    if self.iteration > self.sim.opts.warmup:
                        self.stalled += self.sim.loop.now - self._stall_from
                    self.forward(w)


class _Sim:
    def __init__(
        self, cluster: Cluster, work: Workload, comm: CommOptions, opts: TrainOptions
    ) -> None:
        opts.check()
        self.loop = EventLoop()
        self.net = Network(self.loop)
        self.lay = layout(cluster)
        self.work = work
        self.opts = opts
        self.rng = np.random.default_rng(opts.seed)
        self.pp = PushPull(self.loop, self.net, self.lay, comm)
        names = [name for layer in work.layers for name, _ in layer.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"model {work.name!r} has duplicate gradient names")
        total = len(names)
        self.priority = {
            name: (2 * total - pos if opts.priorities else 0) for pos, name in enumerate(names)
        }

    def result(self, starts: Dict[str, List[float]], period: float, stalled: float = 0.0) -> Result:
        wire = self.work.nbytes * self.pp.opts.compression
        scale = max(g.compute_scale for g in self.lay.worker_groups)
        return Result(
            period,
            self.work.compute_s * scale,
            link_bound(self.lay, wire),
            byteps_bound(self.lay, wire),
            starts,
            self.loop.events_run,
            stalled,
        )


def train(
    cluster: Cluster,
    work: Workload,
    comm: Optional[CommOptions] = None,
    opts: Optional[TrainOptions] = None,
) -> Result:
    opts = opts or TrainOptions()
    sim = _Sim(cluster, work, comm or CommOptions(), opts)
    workers = [_Worker(sim, g) for g in sim.lay.worker_groups]
    for w in workers:
        w.start_iteration()
    sim.loop.run()
    for w in workers:
        if len(w.starts) != opts.iterations + 1:
            raise RuntimeError(
                f"worker {w.g.hosts[0]} finished {len(w.starts) - 1} of "
                f"{opts.iterations} iterations: the model deadlocked"
            )
    period = max(_period(w.starts, opts.warmup) for w in workers)
    stalled = max(w.stalled for w in workers) / (opts.iterations - opts.warmup)
    return sim.result({w.g.hosts[0]: w.starts for w in workers}, period, stalled)


def communicate(
    cluster: Cluster,
    work: Workload,
    comm: Optional[CommOptions] = None,
    opts: Optional[TrainOptions] = None,
) -> Result:
    """benchmarks/comm_rack.py: all gradients start at once (backward order, priority -i
    for the i-th tensor in forward order); an iteration ends when every worker has every
    sum, and the next starts then (the benchmark's barrier)."""
    opts = opts or TrainOptions()
    sim = _Sim(cluster, work, comm or CommOptions(), opts)
    tensors = [(name, nb) for layer in work.layers for name, nb in layer.tensors]
    groups = sim.lay.worker_groups
    starts: List[float] = []
    left = [0]

    def one_done() -> None:
        left[0] -= 1
        if left[0] == 0:
            begin()

    def begin() -> None:
        starts.append(sim.loop.now)
        if len(starts) > opts.iterations:
            return
        left[0] = len(tensors) * len(groups)
        for g in groups:
            cpu = sim.loop.now
            for i in reversed(range(len(tensors))):
                name, nb = tensors[i]
                cpu += opts.submit_s
                sim.loop.at(cpu, sim.pp.submit, g, name, nb, -i if opts.priorities else 0, one_done)

    begin()
    sim.loop.run()
    if len(starts) != opts.iterations + 1:
        raise RuntimeError(
            f"communication finished {len(starts) - 1} of {opts.iterations} "
            "iterations: the model deadlocked"
        )
    return sim.result({"all": starts}, _period(starts, opts.warmup))
