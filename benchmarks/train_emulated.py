"""GPU-profile training emulator: per-iteration time of fastps and DDP-Gloo against the ideal.

Models with the real parameter tensors of ResNet-50, VGG-16 and BERT-base whose layers sleep
for a V100's compute time (benchmarks/emulator: each layer's share of the FLOPs of a published
per-iteration time, x10 for a 10 -> 1 Gbit/s link) and produce deterministic gradients through
real autograd, so every system hooks them as it would a real model while the CPU stays free
for the network stacks and servers. Per model and compute-to-communication ratio, one run
measures:

- compute alone: one process, no communication (the measured compute time C, including the
  optimizer's update at a V100's speed and the emulator's overhead);
- fastps with cross-barrier updates (``cross_barrier=True``), without, and with
  cross-barrier updates but every gradient at the same priority (what P3's order buys),
  at each k;
- torch DDP with the Gloo backend (25 MiB buckets, the default);
- ``--systems ddp-fastps`` (not in the default set): the same DDP on the fastps backend
  (``dist.init_process_group("fastps")``), at each k: the workers get torchrun's
  variables, the first rank on each emulated host starts that host's server, the k CPU
  hosts each run ``python -m fastps.server --join <w0>:<port>``.

and prints per-iteration time, the ideal max(C, communication bound at that k) — BytePS
Eq. 6 with the measured link goodput for fastps and DDP-fastps, the ring all-reduce bound
(= k=0) for DDP-Gloo — the fraction of the ideal and the speedup over DDP-Gloo.
``--ratios``: compute = ratio x the communication bound at k=0 (``ref``: the V100 time
x10). On ``--network loopback`` nothing limits the links, so the ideal is C.
``--timeline-pairs P`` runs each fastps system P times with the timeline off and P times on
(``FASTPS_TIMELINE``, merged after each run), in the order off-on, on-off, ..., for the
timeline's cost (docs/results/timeline-overhead.md).

One set of processes (rack namespaces' workers, servers and scheduler) makes every run of
a model that it can: compute alone at every ratio, fastps at one k for every ratio and
fastps system, DDP at every ratio; each run builds a new model and optimizer and warms up as
a fresh process would. ``--fresh-processes`` starts a set per run instead.

    python -m benchmarks.train_emulated --network loopback --models resnet50 --ratios 1
    python -m benchmarks.train_emulated --models resnet50 --ratios 1 -k 0 2   # rack, root
    python -m benchmarks.train_emulated --ratios 1 --systems fastps-cb --timeline-pairs 3

``--stalls``: the flatness check: 1,000 timed iterations by default (``--steps``),
each split into zero_grad / forward / backward / step; prints p50, p99 and the maximum of
each phase and of the iteration, the slowest iterations with the phase that took the time
and every garbage collection of generation 2, whether p99 <= 1.2 x p50, and what the
iterations at or above the p99 spent against the median ones (COUNTERS). ``--scale``
shrinks every tensor (same count, same Python-side work per tensor, fewer bytes) so a
1,000-iteration run takes minutes:

    python -m benchmarks.train_emulated --network loopback --stalls --models resnet50 \
        --scale 0.01 --ratios 4 --systems fastps-cb fastps ddp

``--repeats N`` makes the whole table N times, pass after pass, and then prints each cell's
median fraction of the ideal, its range and how many runs reached 0.9
(``benchmarks/emulated_repeats.py``): on a shared machine a cell is judged by its median.

``--linkstats DIR`` (rack) samples every host link's byte counters every 5 ms while each set
of processes runs (``benchmarks/rack/linkstat.py``, one CSV per set): which link idled when,
which worker pushed last. ``python -m benchmarks.rack.linkstat --show FILE`` prints one.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402
from benchmarks.cpu_account import CpuSampler, thread_cpu  # noqa: E402
from benchmarks.cpu_account import delta as cpu_delta  # noqa: E402
from benchmarks.emulated_repeats import format_medians  # noqa: E402
from benchmarks.emulator import models as em  # noqa: E402
from benchmarks.emulator.schedule_bound import link_work  # noqa: E402
from benchmarks.rack import linkstat  # noqa: E402

FIELDS = [
    "model",
    "embedding_grad",
    "ratio",
    "system",
    "network",
    "n",
    "k",
    "repeat",
    "rate_mbit",
    "goodput_mbit",
    "compute_nominal_s",
    "compute_s",
    "bound_s",
    "ideal_s",
    "iter_s",
    "iter_p50_s",
    "iter_p99_s",
    "frac_ideal",
    "speedup_vs_ddp",
    "deferred_frac",
    "stall_s",
    "update_s",
    "gc2",
    "stalls",
    "cpu",
    "load",
    "status",
]
LR = 0.01
SYSTEMS = ("fastps-cb", "fastps", "fastps-cb-noprio", "ddp", "ddp-fastps")
DEFAULT_SYSTEMS = ("fastps-cb", "fastps", "fastps-cb-noprio", "ddp")
LABELS = {
    "fastps-cb": "fastps cross-barrier",
    "fastps": "fastps sync step",
    "fastps-cb-noprio": "fastps cb, priority off",
    "ddp": "DDP-Gloo",
    "ddp-fastps": "DDP-fastps",
}


def _family(system: str) -> str:
    """The set of processes a system runs in: fastps (every DistributedOptimizer system),
    ddp (Gloo) or ddp-fastps (DDP on the fastps backend)."""
    return "fastps" if system.startswith("fastps") else system


def _has_k(system: str) -> bool:
    """Whether a system runs at each k (its servers), or once (DDP-Gloo's ring)."""
    return system != "ddp"


# ============================================================================ children


class _GcWatch:
    """Counts and times the garbage collections of the measured iterations."""

    def __init__(self) -> None:
        self.pauses: Dict[int, List[float]] = {0: [], 1: [], 2: []}
        self.total_s = 0.0  # every collection's pause, for the per-iteration counters
        self.gen2_at: List[float] = []  # perf_counter at each generation-2 collection
        self._t0 = 0.0
        self.on = False

    def __call__(self, phase: str, info: Dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            pause = time.perf_counter() - self._t0
            self.pauses[int(info["generation"])].append(pause)
            self.total_s += pause
            if int(info["generation"]) == 2:
                self.gen2_at.append(self._t0)


# --stalls: what each iteration spent besides the phases (differences of running totals)
COUNTERS = (
    "blocked_ms",  # cross-barrier: waiting for sums before applying updates
    "update_ms",  # cross-barrier: the optimizer's deferred updates
    "applies",  # cross-barrier: optimizer calls for deferred updates
    "gc_ms",  # every garbage collection's pause
    "vcsw",  # voluntary context switches of the training thread (blocking waits, sleeps)
    "ivcsw",  # involuntary ones (preempted: another thread or process took the core)
)


def _counting_applies(cb: Any) -> List[int]:
    """Counts the cross-barrier's optimizer calls for deferred updates (--stalls only)."""
    count = [0]
    apply = cb._apply

    def counted(batch: List[Any], waiter: str = "") -> None:
        if batch:
            count[0] += 1
        apply(batch, waiter)

    cb._apply = counted
    return count


def _counters(cb: Any, applies: List[int], watch: _GcWatch) -> Tuple[float, ...]:
    import resource

    use = resource.getrusage(resource.RUSAGE_THREAD)
    return (
        1e3 * cb.waited_s if cb is not None else 0.0,
        1e3 * cb.update_s if cb is not None else 0.0,
        float(applies[0]),
        1e3 * watch.total_s,
        float(use.ru_nvcsw),
        float(use.ru_nivcsw),
    )


def _train(
    args: argparse.Namespace,
    rank: int,
    world: int,
    model: Any,
    opt: Any,
    barrier: Any,
    finish: Any,
    cb: Any = None,
) -> Dict[str, Any]:
    import torch

    from benchmarks.emulator.sleeper import CLOCK

    x = torch.zeros(1)
    phases: List[List[float]] = [[], [], [], []]  # zero_grad, forward, backward, step
    counts: List[Tuple[float, ...]] = []  # --stalls: _counters before each timed iteration
    backward_end: List[float] = []  # --stalls: when each iteration's backward pass ended
    applies = _counting_applies(cb) if args.stalls and cb is not None else [0]
    watch = _GcWatch()
    clock = time.perf_counter
    # The emulated GPU runs the optimizer's updates (sleeper._Clock): tell it where the
    # host spends time on them. Cross-barrier counts its own; a synchronous step() is all
    # update once its gradients are in (fastps's waits for them first, timed apart).
    if cb is not None:
        CLOCK.count_updates(lambda: cb.update_s)
    else:
        CLOCK.count_updates()
    sums_first = getattr(opt, "skip_synchronize", None) if cb is None else None

    def step() -> None:
        t0 = clock()
        opt.zero_grad(set_to_none=False)
        t1 = clock()
        loss = model(x).sum()
        t2 = clock()
        loss.backward()
        t3 = clock()
        if sums_first is not None:
            opt.synchronize()
            u = clock()
            with sums_first():
                opt.step()
        else:
            u = clock()
            opt.step()
        t4 = clock()
        if cb is None:
            CLOCK.stepped_s += t4 - u
        if args.stalls:
            for ph, d in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                ph.append(d)
            backward_end.append(t3)  # perf_counter is CLOCK_MONOTONIC: one clock for all ranks

    for _ in range(args.warmup):
        step()
    for ph in phases:
        ph.clear()
    backward_end.clear()
    gc.callbacks.append(watch)
    barrier()
    marks: List[float] = []
    cpu0, wall0 = (thread_cpu(), time.time()) if args.cpu else ({}, 0.0)
    cpu: Dict[str, float] = {}
    window: List[float] = []
    watch.on = True
    for _ in range(args.steps + 1):
        if args.stalls:
            counts.append(_counters(cb, applies, watch))
        marks.append(time.perf_counter())
        step()
    watch.on = False
    gc.callbacks.remove(watch)
    if args.cpu:  # this process's CPU per timed iteration, per thread name
        used = cpu_delta(thread_cpu(), cpu0)
        cpu = {k: v / (args.steps + 1) for k, v in used.items()}
        window = [wall0, time.time()]
    finish()  # cross-barrier: apply the last step's updates before reading the weights
    spec = model.spec
    expected = em_expected(spec, world, args.warmup + args.steps + 1)
    got = getattr(model, "module", model).probes()
    # float32 rounds each of the updates (lr is not a binary fraction): allow that, not more
    steps = args.warmup + args.steps + 1
    worst = max(abs(a - b) - 2.0**-23 * steps * abs(a) for a, b in zip(expected, got))
    if worst > 1e-6:
        raise SystemExit(
            f"rank {rank}: parameters differ from the expected average update by {worst:.3g}"
        )
    diffs = [b - a for a, b in zip(marks, marks[1:])]
    out = {
        "iter_s": (marks[-1] - marks[0]) / args.steps,
        "diffs": diffs,
        "gc": {str(g): v for g, v in watch.pauses.items()},
        "gc2_at": watch.gen2_at,
    }
    if args.stalls:
        out["phases"] = [ph[: len(diffs)] for ph in phases]
        out["counters"] = [[b - a for a, b in zip(u, v)] for u, v in zip(counts, counts[1:])]
        out["backward_end"] = backward_end[: len(diffs)]
    if args.cpu:
        out["cpu"] = cpu
        out["cpu_window"] = window
    return out


def em_expected(spec: Any, world: int, steps: int) -> List[float]:
    from benchmarks.emulator.sleeper import expected_update

    return expected_update(spec, world, LR, steps)


def _model(args: argparse.Namespace, rank: int, iteration_s: float) -> Tuple[Any, Any]:
    import torch

    from benchmarks.emulator.sleeper import EmulatedModel

    torch.set_num_threads(1)
    spec = _spec(args)
    model = EmulatedModel(spec, iteration_s, rank, args.sparse_embedding and em.has_table(spec))
    return model, torch.optim.SGD


def _spec(args: argparse.Namespace) -> em.ModelSpec:
    spec = em.spec(args.model)
    return spec if args.scale == 1.0 else em.scaled(spec, args.scale)


def _plan(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The runs this process makes, in order: ``{"key", "system", "iteration_s"}`` each
    (one per launch with ``--fresh-processes``; else every ratio and system of a model
    that shares this set of processes)."""
    plan = json.loads(args.plan)
    if not isinstance(plan, list) or not plan:
        raise SystemExit(f"--plan wants a non-empty JSON list, got {args.plan!r}")
    return plan


def _between_runs() -> None:
    """What a fresh process would not carry into the next run: the last run's model and
    optimizer are garbage (collected here, outside any timed loop), and fastps's one-time
    heap freeze (plugins/torch/heap.py) happens again after the next run's first step, so
    each run's collections walk what a fresh process's would."""
    gc.unfreeze()
    gc.collect()
    heap = sys.modules.get("fastps.torch.heap")  # only the fastps child loads it
    if heap is not None:
        heap._done = False  # type: ignore[attr-defined]


def _emit(runs: Dict[str, Dict[str, Any]], rank: int) -> None:
    """Every finished run so far (rewritten after each: a failure keeps what finished)."""
    rc.emit_result({"runs": runs}, rank)


def child_single(args: argparse.Namespace) -> None:
    runs: Dict[str, Dict[str, Any]] = {}
    for cfg in _plan(args):
        model, sgd = _model(args, 0, cfg["iteration_s"])
        opt = sgd(model.parameters(), lr=LR)
        runs[cfg["key"]] = _train(args, 0, 1, model, opt, lambda: None, lambda: None)
        _emit(runs, 0)
        del model, opt
        _between_runs()


def child_fastps(args: argparse.Namespace) -> None:
    import fastps.torch as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    runs: Dict[str, Dict[str, Any]] = {}
    for cfg in _plan(args):
        model, sgd = _model(args, rank, cfg["iteration_s"])
        opt = hvd.DistributedOptimizer(
            sgd(model.parameters(), lr=LR),
            named_parameters=model.named_parameters(),
            cross_barrier=cfg["system"] != "fastps",
        )
        if cfg["system"] == "fastps-cb-noprio":
            # What P3's priorities buy: every gradient gets the same priority, so the core
            # sends them in its fixed name order instead of forward order.
            opt._fastps._learned_priority = lambda e: 0
        cb = opt._fastps.cross
        res = _train(args, rank, world, model, opt, hvd.barrier, opt.wait_for_updates, cb)
        res["cross_barrier"] = cb is not None
        if cb is not None:  # updates that waited past step(), of all updates; time blocked
            res["deferred_frac"] = cb.deferred / max(1, cb.steps * len(opt._fastps.entries))
            res["stall_s"] = cb.waited_s / max(1, cb.steps)
            res["update_s"] = cb.update_s / max(1, cb.steps)
        runs[cfg["key"]] = res
        _emit(runs, rank)
        hvd.barrier()  # every rank is done with this run's gradients
        del model, opt, cb
        _between_runs()
    hvd.barrier()
    hvd.shutdown()


def _init_fastps_backend(timeout_s: float) -> Tuple[int, int]:
    """DDP-fastps's peer: joins the job through torch's store at MASTER_ADDR:MASTER_PORT
    (env://) with the fastps backend; rank 0 runs the scheduler, the first rank on each
    host (FASTPS_HOSTNAME) starts its server. Returns (rank, world size)."""
    import datetime

    import fastps.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    dist.init_process_group("fastps", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def child_ddp(args: argparse.Namespace, backend: str = "gloo") -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "gloo":
        rank, world = rc.init_gloo_from_env(args.op_timeout)
    else:
        rank, world = _init_fastps_backend(args.op_timeout)
    runs: Dict[str, Dict[str, Any]] = {}
    for cfg in _plan(args):
        model, sgd = _model(args, rank, cfg["iteration_s"])
        ddp = DDP(model)
        ddp.spec = model.spec
        opt = sgd(ddp.parameters(), lr=LR)
        runs[cfg["key"]] = _train(args, rank, world, ddp, opt, dist.barrier, lambda: None)
        _emit(runs, rank)
        dist.barrier()
        del model, ddp, opt
        _between_runs()
    dist.destroy_process_group()


def child_ddp_fastps(args: argparse.Namespace) -> None:
    child_ddp(args, backend="fastps")


CHILDREN = {
    "single": child_single,
    "fastps": child_fastps,
    "ddp": child_ddp,
    "ddp-fastps": child_ddp_fastps,
}


# ============================================================================ orchestrator


def _summary(res: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """The slowest worker's time; percentiles over every worker's iterations."""
    diffs = sorted(d for r in res.values() for d in r["diffs"])

    def pct(q: float) -> float:
        return diffs[min(len(diffs) - 1, int(q * (len(diffs) - 1) + 0.5))]

    gc2 = [p for r in res.values() for p in r["gc"].get("2", [])]
    out = {
        "iter_s": max(r["iter_s"] for r in res.values()),
        "iter_p50_s": pct(0.5),
        "iter_p99_s": pct(0.99),
        "gc2": f"{len(gc2)} (max {1e3 * max(gc2):.0f} ms)" if gc2 else "0",
    }
    if all("phases" in r for r in res.values()):
        out["stall_report"] = _stall_report(res)
        p50, p99 = out["iter_p50_s"], out["iter_p99_s"]
        out["stalls"] = f"p99/p50 {p99 / p50:.3f} ({'OK' if p99 <= 1.2 * p50 else 'over'} 1.2)"
    cpu_all = next((r["cpu_all"] for r in res.values() if "cpu_all" in r), None)
    if cpu_all is not None:
        out["cpu"], out["cpu_report"] = _cpu_report(cpu_all)
    fracs = [r["deferred_frac"] for r in res.values() if "deferred_frac" in r]
    if fracs:
        out["deferred_frac"] = statistics.mean(fracs)
        out["stall_s"] = statistics.mean(r["stall_s"] for r in res.values())
        out["update_s"] = statistics.mean(r["update_s"] for r in res.values())
    return out


PHASES = ("zero_grad", "forward", "backward", "step")


def _stall_report(res: Dict[int, Dict[str, Any]]) -> str:
    """Per phase p50 / p99 / max over every worker's iterations, the five slowest
    iterations (which phase took the time; a generation-2 collection inside), and the
    spacing of gen-2 collections (a periodic stall shows as a fixed spacing)."""

    def pct(xs: List[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]

    lines = []
    for i, name in enumerate(PHASES):
        xs = [d for r in res.values() for d in r["phases"][i]]
        if xs:
            lines.append(
                f"    {name:9s} p50 {1e3 * pct(xs, 0.5):8.2f} ms  p99 {1e3 * pct(xs, 0.99):8.2f} ms"
                f"  max {1e3 * max(xs):8.2f} ms"
            )
    slow = sorted(
        ((d, rank, i) for rank, r in res.items() for i, d in enumerate(r["diffs"])), reverse=True
    )[:5]
    for d, rank, i in slow:
        ph = [res[rank]["phases"][j][i] for j in range(len(PHASES))]
        worst = max(range(len(PHASES)), key=ph.__getitem__)
        lines.append(
            f"    slow: rank {rank} iteration {i}: {1e3 * d:.1f} ms, {PHASES[worst]} "
            f"{1e3 * ph[worst]:.1f} ms"
        )
    lines.extend(_tail_report(res))
    for rank, r in sorted(res.items()):
        at = r.get("gc2_at", [])
        if at:
            gaps = [f"{b - a:.1f}" for a, b in zip(at, at[1:])]
            lines.append(f"    rank {rank}: {len(at)} gen-2 collections, spaced {gaps[:8]} s")
    return "\n".join(lines)


def _tail_report(res: Dict[int, Dict[str, Any]]) -> List[str]:
    """Where the tail comes from: the mean of every phase and counter (COUNTERS, and
    ``peer_late_ms``: how much later the slowest rank's backward pass ended) over the
    iterations at or above the p99 of all workers' iterations, against those between the
    40th and 60th percentiles (the median's)."""
    ends = [r.get("backward_end", []) for r in res.values()]
    m = min(len(e) for e in ends)
    last = [max(e[i] for e in ends) for i in range(m)]  # the slowest rank's backward end

    def late(r: Dict[str, Any], i: int) -> float:
        """How long after this rank's backward the slowest rank's ended: the part of the
        next forward's wait that no communication schedule could save."""
        e = r.get("backward_end", [])
        return 1e3 * (last[i] - e[i]) if i < min(m, len(e)) else 0.0

    its = [
        (d, [ph[i] for ph in r["phases"]], [*r["counters"][i], late(r, i)])
        for r in res.values()
        if "counters" in r
        for i, d in enumerate(r["diffs"])
        if i < len(r["counters"])
    ]
    if len(its) < 100:
        return []
    its.sort(key=lambda t: t[0])
    m = len(its)
    groups = {"median": its[int(0.4 * m) : int(0.6 * m)], "p99+": its[int(0.99 * m) :]}
    names = [f"{p} ms" for p in PHASES] + list(COUNTERS) + ["peer_late_ms"]
    lines = [f"    tail vs median, per iteration ({len(groups['p99+'])} iterations >= p99):"]
    means: Dict[str, List[float]] = {}
    for label, rows in groups.items():
        cols = [[1e3 * x for x in t[1]] + list(t[2]) for t in rows]
        means[label] = [statistics.mean(c[j] for c in cols) for j in range(len(names))]
    for j, name in enumerate(names):
        lines.append(
            f"      {name:12s} median {means['median'][j]:8.2f}   p99+ {means['p99+'][j]:8.2f}"
        )
    return lines


def _proc_label(rack: Any, proc: Any) -> str:
    """``w0/emu29703-s0`` -> ``s0`` (the role within the run), else the rack's name."""
    name = str(rack._proc_names.get(proc.pid, f"pid{proc.pid}"))
    tail = name.rsplit("-", 1)[-1]
    return tail if re.fullmatch(r"[swc]\d+|sched", tail) else name


def _attach_cpu(res: Dict[int, Dict[str, Any]], sampler: Optional[CpuSampler]) -> None:
    """Per process, CPU seconds per timed iteration: the workers' own readings and, from
    the sampler, every other process's (servers, scheduler) over the window in which all
    workers ran their timed iterations. Stored as res[0]["cpu_all"]."""
    out: Dict[str, Dict[str, float]] = {f"w{r}": dict(v.get("cpu", {})) for r, v in res.items()}
    if sampler is not None and all("cpu_window" in v for v in res.values()):
        t0 = max(v["cpu_window"][0] for v in res.values())
        t1 = min(v["cpu_window"][1] for v in res.values())
        iter_s = statistics.mean(v["iter_s"] for v in res.values())
        span, used = sampler.window(t0, t1)
        if span > 0 and iter_s > 0:
            iters = span / iter_s
            for label, threads in used.items():
                if not label.startswith("w"):
                    out[label] = {k: v / iters for k, v in threads.items()}
    res[min(res)]["cpu_all"] = out


def _cpu_report(cpu: Dict[str, Dict[str, float]]) -> Tuple[str, str]:
    """(summary for the CSV, lines to print): ms of CPU per iteration per process and its
    threads, the heaviest first."""
    lines = []
    totals = {label: sum(t.values()) for label, t in cpu.items()}
    for label in sorted(cpu):
        threads = sorted(cpu[label].items(), key=lambda kv: -kv[1])
        parts = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in threads if v >= 5e-5)
        lines.append(f"    cpu {label:6s} {1e3 * totals[label]:7.2f} ms/iter  [{parts}]")
    workers = sum(v for k, v in totals.items() if k.startswith("w"))
    servers = sum(v for k, v in totals.items() if k.startswith("s") and k != "sched")
    summary = (
        f"workers {1e3 * workers:.1f} ms/iter, servers {1e3 * servers:.1f} ms/iter, "
        f"all {1e3 * sum(totals.values()):.1f} ms/iter"
    )
    lines.insert(0, f"    cpu: {summary}")
    return summary, "\n".join(lines)


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sampler: Optional[CpuSampler] = None
        self.port = args.base_port
        self.rows: List[Dict[str, Any]] = []

    def argv(self, child: str, model: str, plan: List[Dict[str, Any]]) -> List[str]:
        a = self.args
        return [
            sys.executable,
            "-m",
            "benchmarks.train_emulated",
            "--child",
            child,
            "--model",
            model,
            "--plan",
            json.dumps(plan),
            "--steps",
            str(a.steps),
            "--warmup",
            str(a.warmup),
            "--op-timeout",
            str(int(a.run_timeout)),
            *(["--sparse-embedding"] if a.sparse_embedding else []),
            *(["--stalls"] if a.stalls else []),
            *(["--cpu"] if a.cpu else []),
            "--scale",
            repr(a.scale),
        ]

    # -- launching, per network

    def _timeline_order(self, system: str) -> List[bool]:
        """Timeline off (False) / on (True) runs of one system: one run without
        ``--timeline-pairs``; else that many pairs, off-on then on-off alternately, so a
        change in the machine's load hits both alike."""
        pairs = self.args.timeline_pairs
        if not pairs or not system.startswith("fastps"):
            return [False]
        return [on != (i % 2 == 1) for i in range(pairs) for on in (False, True)]

    def runs(
        self, rack: Any, family: str, model: str, k: int, plan: List[Dict[str, Any]]
    ) -> Dict[str, Tuple[Optional[Dict[int, Dict[str, Any]]], str]]:
        """Every run of ``plan`` (one family: single, fastps or ddp, at one k): key ->
        (rank -> result, or None and why not). One set of processes makes them all, one
        after the other, unless ``--fresh-processes`` (or a timeline, which records from
        a process's start to its exit) asks for a set per run."""
        fresh = self.args.fresh_processes or any(c.get("timeline") for c in plan)
        if fresh and len(plan) > 1:
            out: Dict[str, Tuple[Optional[Dict[int, Dict[str, Any]]], str]] = {}
            for cfg in plan:
                out.update(self.runs(rack, family, model, k, [cfg]))
            return out
        if plan[0].get("timeline"):
            return self._with_timeline(rack, family, model, k, plan)
        return self._launch(rack, family, model, k, plan, {})

    def _with_timeline(
        self, rack: Any, family: str, model: str, k: int, plan: List[Dict[str, Any]]
    ) -> Dict[str, Tuple[Optional[Dict[int, Dict[str, Any]]], str]]:
        # Every worker and server records from start to exit; the shares are merged
        # after the job (as fastpsrun does), outside the timed iterations.
        from fastps.timeline.merge import merge_files
        from fastps.timeline.recorder import clear_parts

        trace = os.path.join(tempfile.gettempdir(), f"emu-timeline-{os.getpid()}.json")
        clear_parts(trace)
        try:
            return self._launch(rack, family, model, k, plan, {"FASTPS_TIMELINE": trace})
        finally:
            info = merge_files(trace)
            if info is not None:
                size = os.path.getsize(trace) / 1e6
                print(f"  timeline: {info['processes']} processes, {size:.1f} MB", flush=True)
                if self.args.keep_timeline is None:
                    os.remove(trace)
                else:  # for `python -m fastps.timeline summarize`
                    self.args.keep_timeline.mkdir(parents=True, exist_ok=True)
                    runs = len(list(self.args.keep_timeline.glob("*.json")))
                    kept = self.args.keep_timeline / f"{model}-k{k}-{runs}.json"
                    shutil.move(trace, kept)
                    print(f"  timeline kept: {kept}", flush=True)

    def _launch(
        self,
        rack: Any,
        family: str,
        model: str,
        k: int,
        plan: List[Dict[str, Any]],
        extra: Dict[str, str],
    ) -> Dict[str, Tuple[Optional[Dict[int, Dict[str, Any]]], str]]:
        a = self.args
        self.port += 3
        n = 1 if family == "single" else a.workers
        env = dict(rc.QUIET_THREADS)
        if family in ("fastps", "ddp-fastps"):
            env.update(a.fastps_env)
        env.update(extra)
        wire = [{key: c[key] for key in ("key", "system", "iteration_s")} for c in plan]
        argv = self.argv(family, model, wire)
        timeout = a.run_timeout * len(plan)
        self.sampler = None
        with tempfile.TemporaryDirectory(prefix="emu-") as tmp:
            env["RACK_RESULT_DIR"] = tmp
            if rack is None:
                ok, err = self._local(family, n, argv, env, timeout)
            else:
                ok, err = self._rack(rack, family, n, k, argv, env, timeout, f"{model}-k{k}")
            got = rc.read_results(Path(tmp))
        out: Dict[str, Tuple[Optional[Dict[int, Dict[str, Any]]], str]] = {}
        for cfg in plan:
            res = {r: v["runs"][cfg["key"]] for r, v in got.items() if cfg["key"] in v["runs"]}
            if len(res) != n:
                why = f"failed ({len(res)} of {n} results): {_first_error(err)}"
                out[cfg["key"]] = (None, why)
                continue
            if a.cpu:
                _attach_cpu(res, self.sampler)
            out[cfg["key"]] = (res, "")
        self.sampler = None
        return out

    def _local(
        self, family: str, n: int, argv: List[str], env: Dict[str, str], timeout: float
    ) -> Tuple[bool, str]:
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        procs: List[subprocess.Popen] = []
        if family == "single":
            procs.append(
                subprocess.Popen(
                    argv, env=full, cwd=rc.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        elif family == "fastps":
            cmd = [
                sys.executable,
                "-m",
                "fastps.launcher",
                "-np",
                str(n),
                "--num-servers",
                str(n),
                *argv,
            ]
            procs.append(
                subprocess.Popen(
                    cmd, env=full, cwd=rc.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        else:
            if family == "ddp-fastps":  # one host: its first rank starts n servers, as above
                full.setdefault("FASTPS_SERVERS_PER_HOST", str(n))
            for r in range(n):
                e = {
                    **full,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(self.port),
                    "RANK": str(r),
                    "WORLD_SIZE": str(n),
                    "LOCAL_RANK": str(r),
                }
                procs.append(
                    subprocess.Popen(
                        argv, env=e, cwd=rc.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                    )
                )
        deadline = time.monotonic() + timeout
        out = []
        ok = True
        for p in procs:
            try:
                text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
                ok = False
            out.append(text.decode(errors="replace"))
            ok = ok and p.returncode == 0
        return ok, "\n".join(out)[-4000:]

    def _rack(
        self,
        rack: Any,
        family: str,
        n: int,
        k: int,
        argv: List[str],
        env: Dict[str, str],
        timeout: float,
        tag: str = "",
    ) -> Tuple[bool, str]:
        if family == "single":
            launch = rc.Launch(
                [rack.spawn(rack.workers[0], argv, env=env, cwd=str(rc.REPO), label="emu-single")]
            )
        elif family == "fastps":
            # per-op and barrier timeouts as for one run; only the set's wall limit grows
            launch = rc.start_fastps(
                rack,
                n,
                k,
                argv,
                self.port,
                env,
                timeout_s=self.args.run_timeout,
                label=f"emu{self.port}",
            )
        elif family == "ddp-fastps":
            launch = rc.start_torch_fastps(
                rack,
                n,
                k,
                argv,
                self.port,
                env,
                timeout_s=self.args.run_timeout,
                label=f"ddpfps{self.port}",
            )
        else:
            launch = rc.start_gloo(rack, n, argv, self.port, env, label=f"ddp{self.port}")
        with contextlib.ExitStack() as stack:
            if self.args.linkstats and family != "single":
                # every host link's counters over the whole set of processes
                out = self.args.linkstats / f"{family}-{tag}-{self.port}.csv"
                stack.enter_context(linkstat.sampling(rack.switch_ns, out, timeout))
                print(f"  link samples: {out}", flush=True)
            if not self.args.cpu:
                return rc.wait_all(rack, launch, timeout)
            # every process of the launch, sampled from outside (the servers report nothing);
            # each run's window is cut out of the samples afterwards (_attach_cpu)
            labels = {_proc_label(rack, p): p.pid for p in launch.procs}
            self.sampler = stack.enter_context(CpuSampler(labels))
            return rc.wait_all(rack, launch, timeout)

    # -- one model at every ratio

    def measure(self, rack: Any, model: str, goodput_mbit: float, repeat: int = 1) -> None:
        """Compute alone, then each fastps system at each k, then DDP, at every ratio:
        one launch per family and k (every ratio and fastps system in it), rows printed
        as their launch ends and kept in the order ratio, system, k. ``repeat`` numbers
        this pass over the table (``--repeats``); each pass has its own compute alone and
        DDP, so its fractions and speedups stand on their own."""
        a = self.args
        spec = em.spec(model)
        if a.scale != 1.0:
            spec = em.scaled(spec, a.scale)
        model_bytes = 4.0 * spec.numel
        nominal = a.rate * rc.GOODPUT_FACTOR * 1e6 / 8
        bound0_nominal = rc.fastps_bound_s(a.workers, 0, model_bytes, nominal)
        network = "loopback" if rack is None else f"rack {a.rate:g} Mbit/s"
        sparse = a.sparse_embedding and em.has_table(spec)
        good = goodput_mbit * 1e6 / 8
        rows_used = em.expected_rows() if sparse else 0.0
        bases: Dict[str, Dict[str, Any]] = {}
        for ratio in a.ratios:
            if ratio == "ref":
                iteration_s = em.reference_iteration_s(spec) * em.REFERENCE_LINK_MBIT / a.rate
            else:
                iteration_s = float(ratio) * bound0_nominal
            bases[ratio] = {
                "model": model,
                "embedding_grad": "sparse" if sparse else "",
                "ratio": ratio,
                "network": network,
                "n": a.workers,
                "repeat": repeat,
                "rate_mbit": a.rate if rack is not None else "",
                "goodput_mbit": goodput_mbit if rack is not None else "",
                "compute_nominal_s": iteration_s,
            }
        # compute alone, every ratio
        single = self.runs(
            rack,
            "single",
            model,
            0,
            [
                {"key": f"single/{r}", "system": "single", "iteration_s": b["compute_nominal_s"]}
                for r, b in bases.items()
            ],
        )
        computes: Dict[str, float] = {}
        ordered: Dict[Tuple[str, int, int, int], Dict[str, Any]] = {}
        for ratio in a.ratios:
            res, err = single[f"single/{ratio}"]
            if res is None:
                row = {**bases[ratio], "system": "compute alone", "status": err}
            else:
                computes[ratio] = _summary(res)["iter_s"]
                row = {
                    **bases[ratio],
                    "system": "compute alone",
                    "k": "",
                    "compute_s": computes[ratio],
                    "iter_s": computes[ratio],
                    **_summary(res),
                    "load": rc.load_text(),
                    "status": "ok",
                }
            ordered[(ratio, -1, 0, 0)] = row
            self._add(row)
        self._write(ordered)
        ratios = [r for r in a.ratios if r in computes]  # no ideal without compute alone
        fastps_systems = [s for s in a.systems if s.startswith("fastps")]
        groups: List[Tuple[str, int, List[str]]] = [
            ("fastps", k, fastps_systems) for k in (a.cpu_hosts if fastps_systems else [])
        ]
        if "ddp" in a.systems:
            groups.append(("ddp", 0, ["ddp"]))
        if "ddp-fastps" in a.systems:
            groups.extend(("ddp-fastps", k, ["ddp-fastps"]) for k in a.cpu_hosts)
        for family, k, systems in groups:
            plan: List[Dict[str, Any]] = []
            for ratio in ratios:
                for system in systems:
                    for ti, timeline in enumerate(self._timeline_order(system)):
                        plan.append(
                            {
                                "key": f"{system}/{ratio}/{ti}",
                                "system": system,
                                "iteration_s": bases[ratio]["compute_nominal_s"],
                                "timeline": timeline,
                                "ratio": ratio,
                                "order": (ratio, a.systems.index(system), k, ti),
                            }
                        )
            if not plan:
                continue
            done = self.runs(rack, family, model, k, plan)
            load = rc.load_text()  # 1-minute average: mostly this launch
            for cfg in plan:
                system, ratio = cfg["system"], cfg["ratio"]
                compute = computes[ratio]
                if rack is None:
                    bound = 0.0
                else:  # dense bytes by the bound of the topology, a sparse table allgathered
                    bound = sum(
                        link_work(spec, a.workers, k, good, rows_used, ring=system == "ddp")
                    )
                ideal = max(compute, bound)
                row = {
                    **bases[ratio],
                    "system": LABELS[system] + (" + timeline" if cfg["timeline"] else ""),
                    "k": k,
                    "compute_s": compute,
                    "bound_s": bound,
                    "ideal_s": ideal,
                    "load": load,
                }
                res, err = done[cfg["key"]]
                if res is None:
                    row["status"] = err
                else:
                    row.update(_summary(res))
                    row["frac_ideal"] = ideal / row["iter_s"]
                    row["status"] = "ok"
                ordered[cfg["order"]] = row
                self._add(row)
            self._write(ordered)
        for ratio in ratios:
            ddp = next(
                (r for o, r in ordered.items() if o[0] == ratio and r["system"] == LABELS["ddp"]),
                None,
            )
            if ddp is not None and ddp.get("status") == "ok":
                for o, row in ordered.items():
                    if o[0] == ratio and o[1] >= 0 and row.get("status") == "ok":
                        row["speedup_vs_ddp"] = ddp["iter_s"] / row["iter_s"]
        self.rows.extend(self._in_order(ordered))
        if a.out:
            rc.write_csv(a.out, self.rows, FIELDS, self.meta)

    def _in_order(self, ordered: Dict[Tuple[str, int, int, int], Dict[str, Any]]) -> List[Any]:
        """The table's order: per ratio compute alone, then each system at each k."""
        position = {r: i for i, r in enumerate(self.args.ratios)}
        return [ordered[o] for o in sorted(ordered, key=lambda o: (position[o[0]], *o[1:]))]

    def _write(self, ordered: Dict[Tuple[str, int, int, int], Dict[str, Any]]) -> None:
        """The CSV so far, rewritten after every launch: a run cut short keeps what it
        finished."""
        if self.args.out:
            rc.write_csv(self.args.out, self.rows + self._in_order(ordered), FIELDS, self.meta)

    def _add(self, row: Dict[str, Any]) -> None:
        """Prints a row as its run ends (measure keeps the rows in the table's order)."""
        if row.get("status") != "ok":
            print(
                f"  {row['model']:8s} ratio={row['ratio']:>4s} {row['system']:22s} "
                f"{row.get('status')}",
                flush=True,
            )
            return
        extra = ""
        if "frac_ideal" in row:
            extra = (
                f" ideal {row['ideal_s']:.3f} s (bound {row['bound_s']:.3f} s) -> "
                f"{row['frac_ideal']:.3f} of ideal"
            )
        k = f"k={row['k']}" if row.get("k") != "" else ""
        if self.args.repeats > 1:
            extra += f" (pass {row['repeat']} of {self.args.repeats})"
        if "stall_s" in row:
            extra += (
                f"; deferred {100 * row['deferred_frac']:.0f}% of updates, forward "
                f"blocked {row['stall_s']:.3f} s/iter, updates {row['update_s']:.3f} s/iter"
            )
        print(
            f"  {row['model']:8s} ratio={row['ratio']:>4s} {row['system']:22s} {k:4s} "
            f"{row['iter_s']:.3f} s/iter (p50 {row['iter_p50_s']:.3f}, p99 "
            f"{row['iter_p99_s']:.3f}; gen-2 gc {row['gc2']}){extra} "
            f"[load {row.get('load', '')}]",
            flush=True,
        )
        if "stall_report" in row:
            print(f"    {row['stalls']}\n{row.pop('stall_report')}", flush=True)
        if "cpu_report" in row:
            print(row.pop("cpu_report"), flush=True)


def _first_error(err: str) -> str:
    for line in err.splitlines():
        low = line.lower()
        if "error" in low or "exception" in low or "abort" in low:
            return line.strip()[:300]
    return err.strip().splitlines()[-1][:300] if err.strip() else ""


def _print_table(rows: Sequence[Dict[str, Any]]) -> None:
    passes = any(r.get("repeat", 1) != 1 for r in rows)  # --repeats: say which pass
    print(
        f"\n{'model':8s} {'ratio':>5s} {'system':22s} {'k':>2s} {'s/iter':>7s} "
        f"{'ideal':>7s} {'frac':>6s} {'vs DDP':>7s} {'p99/p50':>7s}  load"
        + ("  pass" if passes else "")
    )
    for r in rows:
        tail = f"  {r.get('repeat', '')}" if passes else ""
        if r.get("status") != "ok":
            print(f"{r['model']:8s} {r['ratio']:>5s} {r['system']:22s} {r.get('status')}{tail}")
            continue
        frac = f"{r['frac_ideal']:6.3f}" if "frac_ideal" in r else f"{'-':>6s}"
        sp = f"{r['speedup_vs_ddp']:7.2f}" if "speedup_vs_ddp" in r else f"{'-':>7s}"
        ideal = f"{r['ideal_s']:7.3f}" if "ideal_s" in r else f"{'-':>7s}"
        print(
            f"{r['model']:8s} {r['ratio']:>5s} {r['system']:22s} {str(r.get('k', '')):>2s} "
            f"{r['iter_s']:7.3f} {ideal} {frac} {sp} "
            f"{r['iter_p99_s'] / r['iter_p50_s']:7.2f}  {r.get('load', '')}{tail}"
        )


# --estimate: seconds a set of processes spends outside its timed iterations on the rack
# (namespaces' processes, servers, init, the barrier, exit): 2026-11-23 22:31-22:42Z, 8
# ResNet-50 runs at load ~20, a set of processes each, took 660 s, of which 296 s were
# iterations.
RUN_OVERHEAD_S = 45.0
# and what each further run in the same processes adds (a new model and optimizer, the
# parameter check and barriers, a full collection between runs): an allowance, not measured
# on its own (2 ResNet-50 ratios x 3 fastps systems x k=0,1 plus DDP on the rack at x0.1,
# 16 runs in 4 sets, took about 4 min at load 18, iterations and rack set-up included)
RUN_SWITCH_S = 3.0
# and how far below a perfect scheduler's period the runs were (fraction of the ideal
# measured 0.65-0.88, docs/results/emulator.md): the estimate divides the period by this.
ESTIMATE_EFFICIENCY = 0.75


def estimate(args: argparse.Namespace) -> float:
    """Predicted wall time of the run ``args`` describes, without running it: every
    (model, ratio, system, k) run costs its warm-up and timed iterations at a perfect
    scheduler's period (schedule_bound) / ESTIMATE_EFFICIENCY, plus RUN_OVERHEAD_S per set
    of processes started (one per model, family and k; one per run with
    ``--fresh-processes`` or a timeline) and RUN_SWITCH_S per further run in a set; all of
    it ``--repeats`` times."""
    from benchmarks.emulator.schedule_bound import period

    good = args.rate * rc.GOODPUT_FACTOR * 1e6 / 8
    iterations = args.warmup + args.steps + 1
    fresh = args.fresh_processes or args.timeline_pairs > 0
    total = 0.0
    runs = launches = 0
    for model in args.models:
        spec = em.spec(model)
        rows = em.expected_rows() if args.sparse_embedding and em.has_table(spec) else 0.0
        b0 = rc.fastps_bound_s(args.workers, 0, 4.0 * spec.numel, good)
        per_set: Dict[Tuple[str, int], int] = {}  # runs per set of processes
        for ratio in args.ratios:
            if ratio == "ref":
                c = em.reference_iteration_s(spec) * em.REFERENCE_LINK_MBIT / args.rate
            else:
                c = float(ratio) * b0
            model_s = iterations * c  # compute alone
            per_set[("single", 0)] = per_set.get(("single", 0), 0) + 1
            for system in args.systems:
                for k in args.cpu_hosts if _has_k(system) else [0]:
                    work = link_work(spec, args.workers, k, good, rows, ring=system == "ddp")
                    cb = system in ("fastps-cb", "fastps-cb-noprio")
                    t = period(spec, c, sum(work), cb, system != "fastps-cb-noprio", work)
                    pairs = max(1, 2 * args.timeline_pairs) if system.startswith("fastps") else 1
                    model_s += pairs * iterations * t / ESTIMATE_EFFICIENCY
                    family = (_family(system), k)
                    per_set[family] = per_set.get(family, 0) + pairs
            print(
                f"  estimate: {model} ratio {ratio}: {model_s / 60:.0f} min of iterations"
                + (f" per pass, {args.repeats} passes" if args.repeats > 1 else ""),
                flush=True,
            )
            total += model_s * args.repeats
        n_runs = sum(per_set.values()) * args.repeats
        n_sets = n_runs if fresh else len(per_set) * args.repeats
        start_s = n_sets * RUN_OVERHEAD_S + (n_runs - n_sets) * RUN_SWITCH_S
        print(
            f"  estimate: {model}: {n_runs} runs in {n_sets} sets of processes, "
            f"{start_s / 60:.0f} min of start-up and switching",
            flush=True,
        )
        total += start_s
        runs += n_runs
        launches += n_sets
    print(
        f"train_emulated: {runs} runs in {launches} sets of processes, about "
        f"{total / 3600:.1f} h ({total / 60:.0f} min)",
        flush=True,
    )
    return total


def orchestrate(args: argparse.Namespace) -> int:
    if args.estimate:
        estimate(args)
        return 0
    runner = Runner(args)
    runner.meta = rc.provenance()
    runner.meta["compute"] = (
        "emulated (benchmarks/emulator): per-layer sleeps; "
        "V100 reference x10 (docs/results/emulator.md)"
    )
    t0 = time.monotonic()
    if args.network == "loopback":
        for model in args.models:
            for repeat in range(1, args.repeats + 1):
                runner.measure(None, model, 0.0, repeat)
    else:
        from benchmarks.rack import Rack, is_supported

        ok, why = is_supported()
        if not ok:
            print(f"train_emulated: emulated rack not supported here: {why}", file=sys.stderr)
            return 2
        with Rack(
            n_workers=args.workers,
            n_cpu_hosts=max(args.cpu_hosts),
            rate_mbit=args.rate,
            prefix=args.prefix,
        ) as rack:
            link = rack.measure_throughput("w0", "w1", seconds=args.measure_seconds)
            print(
                f"train_emulated: rack n={args.workers} k<={max(args.cpu_hosts)} at "
                f"{args.rate:g} Mbit/s; measured goodput {link:.1f} Mbit/s",
                flush=True,
            )
            runner.meta["goodput"] = f"{link:.1f} Mbit/s"
            for model in args.models:
                for repeat in range(1, args.repeats + 1):
                    runner.measure(rack, model, link, repeat)
    runner.meta["duration"] = f"{time.monotonic() - t0:.0f} s"
    runner.meta["load_at_end"] = rc.load_text()
    if args.out:
        rc.write_csv(args.out, runner.rows, FIELDS, runner.meta)
    _print_table(runner.rows)
    if args.repeats > 1:
        print(f"\nmedians over {args.repeats} passes (fraction of the ideal; vs DDP per pass)")
        print(format_medians(runner.rows))
    if args.json:
        print("JSON " + json.dumps(runner.rows))
    return 1 if any(r.get("status") != "ok" for r in runner.rows) else 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--network", choices=["rack", "loopback"], default="rack")
    p.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(em.MODELS))
    p.add_argument(
        "--ratios",
        nargs="+",
        default=["1"],
        help="compute / communication bound at k=0 (e.g. 0.5 1 2), or ref",
    )
    p.add_argument(
        "--systems",
        nargs="+",
        default=list(DEFAULT_SYSTEMS),
        choices=SYSTEMS,
        help=f"default: {' '.join(DEFAULT_SYSTEMS)}; ddp-fastps: DDP on the fastps backend",
    )
    p.add_argument("--workers", "-n", type=int, default=4)
    p.add_argument("--cpu-hosts", "-k", nargs="+", type=int, default=[0])
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per host link (rack)")
    p.add_argument("--steps", type=int, default=None, help="timed iterations (10; --stalls: 1000)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fastps-env", nargs="*", default=[])
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="passes over the whole table, one after the other; prints each cell's median "
        "fraction of the ideal, its range and how many runs reached 0.9",
    )
    p.add_argument(
        "--estimate", action="store_true", help="print the runs and their expected time; run none"
    )
    p.add_argument(
        "--stalls",
        action="store_true",
        help="flatness check: per-phase p50/p99/max, slowest iterations (default 1000 steps)",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="CPU time per timed iteration of every process and thread (/proc; the rack "
        "samples servers from outside)",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink every tensor to this fraction of its elements (same tensor count)",
    )
    p.add_argument(
        "--sparse-embedding",
        action="store_true",
        help="BERT's word embedding gives a sparse gradient of the rows a batch uses",
    )
    p.add_argument("--run-timeout", type=float, default=400.0)
    p.add_argument("--measure-seconds", type=float, default=3.0)
    p.add_argument(
        "--timeline-pairs",
        type=int,
        default=0,
        help="run each fastps system this many times with the timeline off and on, interleaved",
    )
    p.add_argument(
        "--keep-timeline",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --timeline-pairs: keep each merged trace in DIR (MODEL-kK-N.json)",
    )
    p.add_argument(
        "--linkstats",
        type=Path,
        metavar="DIR",
        help="rack: sample every host link every 5 ms while each set of processes runs, "
        "one CSV per set in DIR (show one: python -m benchmarks.rack.linkstat --show FILE)",
    )
    p.add_argument(
        "--fresh-processes",
        action="store_true",
        help="a new set of workers and servers for every run (default: one per model, "
        "system family and k, making every ratio and fastps system in turn)",
    )
    p.add_argument("--prefix", default="fpse")
    p.add_argument("--base-port", type=int, default=29700)
    p.add_argument("--out", type=Path, default=None, help="CSV to write")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--model", default="resnet50", help=argparse.SUPPRESS)
    p.add_argument("--plan", default="[]", help=argparse.SUPPRESS)
    p.add_argument("--op-timeout", type=int, default=400, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 1000 if args.stalls else 10
    if not 0 < args.scale <= 1:
        p.error(f"--scale must be in (0, 1], got {args.scale}")
    if args.sparse_embedding and args.scale != 1.0:
        p.error("--sparse-embedding needs the real table (--scale 1)")
    if args.linkstats is not None and args.network != "rack":
        p.error("--linkstats samples the rack's links: it needs --network rack")
    if args.keep_timeline is not None and not args.timeline_pairs:
        p.error("--keep-timeline keeps the traces of --timeline-pairs runs: give --timeline-pairs")
    if args.child:
        return args
    for r in args.ratios:
        if r != "ref":
            try:
                if float(r) <= 0:
                    raise ValueError
            except ValueError:
                p.error(f"--ratios wants positive numbers or ref, got {r!r}")
    if args.workers < 2:
        p.error("--workers must be >= 2")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    env: Dict[str, str] = {}
    for item in args.fastps_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("FASTPS_"):
            p.error(f"--fastps-env wants FASTPS_NAME=value, got {item}")
        env[key] = value
    args.fastps_env = env
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child](args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
