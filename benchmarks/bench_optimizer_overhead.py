"""Python-side cost of DistributedOptimizer per iteration: garbage, submit time, stalls.

Two workers on loopback train the emulated model (benchmarks/emulator: ResNet-50's 161
tensors, shrunk by ``--scale`` so the transfer is short; ``--compute`` seconds of emulated
compute per iteration) and measure, from rank 0:

1. garbage census (collector disabled): tracked objects alive per tensor right after
   backward submitted every gradient (what makes generation-0 collections run and promotes
   objects towards generation 2) and objects left in reference cycles per iteration (only a
   collection frees those); with ``--trace``, where the objects alive after backward were
   allocated (tracemalloc);
2. timing over ``--iters`` iterations with the collector on: time spent in the gradient
   hooks (submitting) per iteration, iteration time, p50/p99/max, and every generation-2
   collection with its pause.

    python -m benchmarks.bench_optimizer_overhead                    # sync steps
    python -m benchmarks.bench_optimizer_overhead --cross-barrier
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
TAG = "OVERHEAD "


def _pct(values: List[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _short(path: str) -> str:
    return os.path.relpath(path, REPO) if path.startswith(str(REPO)) else os.path.basename(path)


def child(args: argparse.Namespace) -> None:
    import fastps.torch as hvd
    import torch

    from benchmarks.emulator import models as em
    from benchmarks.emulator.sleeper import EmulatedModel

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    spec = em.scaled(em.spec(args.model), args.scale)
    model = EmulatedModel(spec, args.compute, rank)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters(),
        cross_barrier=args.cross_barrier,
    )
    sync = opt._fastps
    tensors = len(sync.entries)
    hook_time = [0.0]
    real_on_grad = sync._on_grad

    def timed_on_grad(param: Any) -> None:  # the hook looks the method up on the instance
        t0 = time.perf_counter()
        real_on_grad(param)
        hook_time[0] += time.perf_counter() - t0

    sync._on_grad = timed_on_grad
    x = torch.zeros(1)

    def forward_backward() -> None:
        opt.zero_grad(set_to_none=False)
        model(x).sum().backward()

    for _ in range(args.warmup):
        forward_backward()
        opt.step()

    # 1. census, collector off
    gc.collect()
    gc.disable()
    alive: List[int] = []
    cyclic: List[int] = []
    trace: List[str] = []
    for i in range(args.census):
        opt.zero_grad(set_to_none=False)
        loss = model(x).sum()
        gc.collect()
        tracing = args.trace and i == args.census - 1
        if tracing:
            import tracemalloc

            tracemalloc.start(8)
            snap0 = tracemalloc.take_snapshot()
        c0 = gc.get_count()[0]
        loss.backward()
        c1 = gc.get_count()[0]
        if tracing:
            snap1 = tracemalloc.take_snapshot()
            tracemalloc.stop()
            stats = snap1.compare_to(snap0, "traceback")
            for st in sorted(stats, key=lambda s: -s.count_diff)[: args.trace_top]:
                frames = [f"{_short(f.filename)}:{f.lineno}" for f in st.traceback[-4:]]
                trace.append(f"{st.count_diff:+d} blocks: {' <- '.join(reversed(frames))}")
        del loss
        opt.step()
        opt.wait_for_updates()
        alive.append(c1 - c0)
        cyclic.append(gc.collect())
    gc.enable()

    # 2. timing, collector on
    pauses: Dict[int, List[float]] = {0: [], 1: [], 2: []}
    t_start = [0.0]

    def on_gc(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            t_start[0] = time.perf_counter()
        else:
            pauses[int(info["generation"])].append(time.perf_counter() - t_start[0])

    gc.callbacks.append(on_gc)
    iters: List[float] = []
    submits: List[float] = []
    hvd.barrier()
    for _ in range(args.iters):
        hook_time[0] = 0.0
        t0 = time.perf_counter()
        forward_backward()
        opt.step()
        iters.append(time.perf_counter() - t0)
        submits.append(hook_time[0])
    gc.callbacks.remove(on_gc)
    opt.wait_for_updates()
    if rank == 0:
        out = {
            "tensors": tensors,
            "cross_barrier": opt.cross_barrier,
            "alive_per_tensor": statistics.median(alive) / tensors,
            "cyclic_per_iter": statistics.median(cyclic),
            "submit_p50_ms": 1e3 * _pct(submits, 0.5),
            "submit_p99_ms": 1e3 * _pct(submits, 0.99),
            "submit_max_ms": 1e3 * max(submits),
            "iter_p50_ms": 1e3 * _pct(iters, 0.5),
            "iter_p99_ms": 1e3 * _pct(iters, 0.99),
            "iter_max_ms": 1e3 * max(iters),
            "gc_counts": {g: len(v) for g, v in pauses.items()},
            "gc2_max_ms": 1e3 * max(pauses[2], default=0.0),
            "gc_total_ms": 1e3 * sum(sum(v) for v in pauses.values()),
            "trace": trace,
        }
        print(TAG + json.dumps(out), flush=True)
    hvd.barrier()
    hvd.shutdown()


def parent(args: argparse.Namespace) -> int:
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        "2",
        "--num-servers",
        "1",
        sys.executable,
        "-m",
        "benchmarks.bench_optimizer_overhead",
        "--child",
        "--model",
        args.model,
        "--scale",
        str(args.scale),
        "--compute",
        str(args.compute),
        "--iters",
        str(args.iters),
        "--census",
        str(args.census),
        "--warmup",
        str(args.warmup),
        "--trace-top",
        str(args.trace_top),
    ]
    if args.cross_barrier:
        cmd.append("--cross-barrier")
    if args.trace:
        cmd.append("--trace")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in res.stdout.splitlines() if TAG in ln]
    if res.returncode != 0 or not lines:
        print(res.stdout[-4000:], res.stderr[-2000:])
        return 1
    r = json.loads(lines[-1].split(TAG, 1)[1])
    print(
        f"{args.model} (x{args.scale}) {r['tensors']} tensors, cross_barrier="
        f"{r['cross_barrier']}, {args.iters} iterations, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  objects alive per tensor after backward: {r['alive_per_tensor']:.1f}; "
        f"left in cycles per iteration: {r['cyclic_per_iter']}"
    )
    print(
        f"  submit (hooks) per iteration: p50 {r['submit_p50_ms']:.2f} ms, p99 "
        f"{r['submit_p99_ms']:.2f} ms, max {r['submit_max_ms']:.2f} ms"
    )
    print(
        f"  iteration: p50 {r['iter_p50_ms']:.2f} ms, p99 {r['iter_p99_ms']:.2f} ms, "
        f"max {r['iter_max_ms']:.2f} ms (p99/p50 {r['iter_p99_ms'] / r['iter_p50_ms']:.2f})"
    )
    print(
        f"  collections (gen 0/1/2): {r['gc_counts']}; gen-2 max pause "
        f"{r['gc2_max_ms']:.1f} ms; all collections {r['gc_total_ms']:.0f} ms"
    )
    for line in r["trace"]:
        print("  " + line)
    return 0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--compute", type=float, default=0.02, help="emulated s per iteration")
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--census", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cross-barrier", action="store_true")
    p.add_argument("--trace", action="store_true", help="where the live objects come from")
    p.add_argument("--trace-top", type=int, default=12)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
