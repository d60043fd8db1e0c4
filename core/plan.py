"""Plan a fastps job before buying it: predicted seconds per iteration for every number of
CPU machines in a range, the communication bound, and the recommended CPU machines, part
size and compression, from the simulator (fastps.sim).

    python -m fastps.plan --model resnet50 --workers 64 --link 25G --cpu-machines 0..32
    python -m fastps.plan --model my_model.json --workers 16 --link 10G --gpu-time 0.4 \\
        --cpu-machines 0..16 --racks 4 --oversubscription 3 --plot plan.png

A recommendation is the cheapest choice within ``--tolerance`` (default 3%) of the best
predicted time: fewer CPU machines, then the default part size, then no compression.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

from .errors import FastPSError
from .sim import workload
from .sim.allreduce import train_allreduce
from .sim.cluster import RACK_GOODPUT, Cluster
from .sim.pushpull import CommOptions
from .sim.training import TrainOptions, train

# Bytes on the wire per gradient byte: float32, fp16 casts, 8-bit quantisation.
COMPRESSIONS = {"none": 1.0, "fp16": 0.5, "int8": 0.25}
PART_SIZES = (64 << 10, 256 << 10, 1 << 20)
DEFAULT_PART = 256 << 10


def parse_rate(text: str) -> float:
    """'25G', '100Gbit', '800M', '10000' (Mbit/s) -> Mbit/s."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([gGmM]?)(?:bit|b|bps|bit/s)?\s*", text)
    if not m:
        raise FastPSError(f"--link {text!r}: expected a rate like 25G, 800M or 10000 (Mbit/s)")
    value = float(m.group(1))
    mbit = value * 1000.0 if m.group(2).lower() == "g" else value
    if not mbit > 0:
        raise FastPSError(f"--link {text!r}: the rate must be > 0")
    return mbit


def parse_range(text: str, limit: int = 4096) -> List[int]:
    """'0..32' -> 0..32; '0,2,8' -> those; '4' -> [4]."""
    try:
        if ".." in text:
            a, b = (int(x) for x in text.split("..", 1))
            values = list(range(a, b + 1))
        else:
            values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FastPSError(f"--cpu-machines {text!r}: expected A..B or a list like 0,2,8") from None
    if not values or min(values) < 0 or max(values) > limit:
        raise FastPSError(f"--cpu-machines {text!r}: need values in 0..{limit}")
    return sorted(set(values))


def sample_k(values: List[int], most: int = 8) -> List[int]:
    """At most ``most`` values of a long range: both ends and powers of two between (the
    time changes smoothly and mostly at small k)."""
    if len(values) <= most:
        return values
    lo, hi = values[0], values[-1]
    picked = {lo, hi}
    p = 1
    while p < hi and len(picked) < most:
        if p > lo:
            picked.add(p)
        p *= 2
    return sorted(v for v in picked if v in set(values))


def _predict(cl: Cluster, w: workload.Workload, comm: CommOptions, opts: TrainOptions) -> float:
    return train(cl, w, comm, opts).iteration_s


def plan(args: argparse.Namespace) -> int:
    t0, c0 = time.time(), time.process_time()
    w = workload.load(args.model, args.gpu_time)
    mbit = parse_rate(args.link)
    ks = parse_range(args.cpu_machines)
    if args.workers < 1:
        raise FastPSError(f"--workers must be >= 1, got {args.workers}")
    base = Cluster(
        workers=args.workers,
        cpu_machines=0,
        link_mbit=mbit,
        goodput=args.goodput,
        latency_s=args.latency_us * 1e-6,
        racks=args.racks,
        oversubscription=args.oversubscription,
        explicit=False,
    )
    base.check()
    # One warm-up iteration reaches the steady state (cross-barrier overlaps one iteration
    # with the next); two measured ones average out where a part falls.
    opts = TrainOptions(mode=args.mode, iterations=3, warmup=1)
    comm = CommOptions(partition_bytes=DEFAULT_PART)
    print(
        f"model {w.name}: {w.nbytes / 1e6:.1f} MB of gradients in {w.tensors} tensors, "
        f"compute {w.compute_s:.3f} s/iteration; {args.workers} workers, "
        f"{mbit / 1000:g} Gbit/s links"
        + (f", {args.racks} racks at {args.oversubscription:g}:1" if args.racks > 1 else "")
    )
    rows: List[Tuple[int, float, float]] = []
    for k in sample_k(ks):
        cl = replace(base, cpu_machines=k)
        r = train(cl, w, comm, opts)
        rows.append((k, r.iteration_s, r.bound_s))
    ar = train_allreduce(base, w).iteration_s
    print(f"\n{'k':>5} {'predicted s/iter':>17} {'comm bound s':>13} {'vs all-reduce':>14}")
    for k, t, b in rows:
        print(f"{k:5d} {t:17.4f} {b:13.4f} {ar / t:13.2f}x")
    print(f"ring all-reduce (DDP/Horovod, 25 MB buckets): {ar:.4f} s/iteration")
    best = min(t for _, t, _ in rows)
    k_rec, t_rec, b_rec = next(r for r in rows if r[1] <= best * (1 + args.tolerance))
    cl = replace(base, cpu_machines=k_rec)
    # No iteration is faster than the compute, nor than the communication bound of its
    # bytes: when the pick is within the tolerance of max(compute, bound), no part size can
    # be better by more, and none is simulated; within it of the compute, no compression.
    gpu_bound = t_rec <= w.compute_s * (1 + args.tolerance)
    at_bound = t_rec <= max(w.compute_s, b_rec) * (1 + args.tolerance)
    parts = []
    for pb in PART_SIZES:
        if pb == DEFAULT_PART:
            parts.append((pb, t_rec))
        elif not at_bound:
            parts.append((pb, _predict(cl, w, replace(comm, partition_bytes=pb), opts)))
    best_p = min(t for _, t in parts)
    part_rec = (
        DEFAULT_PART
        if t_rec <= best_p * (1 + args.tolerance)
        else min(parts, key=lambda x: x[1])[0]
    )
    comp = []
    for name, ratio in COMPRESSIONS.items():
        if ratio == 1.0:
            comp.append((name, t_rec))
        elif not gpu_bound:
            t = _predict(cl, w, replace(comm, compression=ratio, partition_bytes=part_rec), opts)
            comp.append((name, t))
    best_c = min(t for _, t in comp)
    comp_rec = next(name for name, t in comp if t <= best_c * (1 + args.tolerance))
    print(
        f"\nrecommended: k = {k_rec} CPU machines ({t_rec:.4f} s/iteration, bound "
        f"{b_rec:.4f} s, compute {w.compute_s:.4f} s)"
    )
    skipped = " (others not simulated: {} within the tolerance)"
    print(
        "  part size: "
        + ", ".join(f"{pb >> 10} KiB {t:.4f} s" for pb, t in parts)
        + f" -> {part_rec >> 10} KiB"
        + (skipped.format("max(compute, bound)") if at_bound else "")
    )
    print(
        "  compression: "
        + ", ".join(f"{n} {t:.4f} s" for n, t in comp)
        + f" -> {comp_rec}"
        + (skipped.format("compute") if gpu_bound else "")
        + ("" if comp_rec == "none" else " (lossy: check convergence)")
    )
    if w.compute_s >= t_rec * 0.97:
        print("  the GPUs set the pace: more CPU machines or compression buy nothing here")
    if ar < t_rec * (1 - args.tolerance):
        why = (
            ": every part crosses the oversubscribed uplinks once per remote worker, the ring once"
            if args.racks > 1
            else ""
        )
        print(f"  a ring all-reduce is predicted faster ({ar:.4f} s){why}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([k for k, _, _ in rows], [t for _, t, _ in rows], "o-", label="fastps (sim)")
        ax.plot(
            [k for k, _, _ in rows],
            [max(b, w.compute_s) for _, _, b in rows],
            "--",
            label="max(compute, bound)",
        )
        ax.axhline(ar, color="gray", linestyle=":", label="ring all-reduce (sim)")
        ax.set_xlabel("CPU machines k")
        ax.set_ylabel("seconds per iteration")
        ax.set_title(f"{w.name}, {args.workers} workers, {mbit / 1000:g} Gbit/s")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    print(f"({time.time() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU)")
    return 0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fastps.plan", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="resnet50, vgg16, bert-base or a JSON file (fastps/sim/workload.py)",
    )
    p.add_argument("--workers", type=int, required=True, help="worker machines")
    p.add_argument("--link", default="25G", help="per-host link rate, e.g. 25G, 800M")
    p.add_argument(
        "--gpu-time",
        type=float,
        default=None,
        help="forward + backward seconds per iteration on one worker "
        "(default: the model's V100 FP32 time)",
    )
    p.add_argument("--cpu-machines", default="0..8", help="range A..B or list of k to try")
    p.add_argument("--mode", choices=["cross-barrier", "sync"], default="cross-barrier")
    p.add_argument("--racks", type=int, default=1)
    p.add_argument("--oversubscription", type=float, default=1.0)
    p.add_argument("--latency-us", type=float, default=30.0, help="one-way message latency")
    p.add_argument(
        "--goodput",
        type=float,
        default=RACK_GOODPUT,
        help="TCP goodput as a fraction of the link rate",
    )
    p.add_argument("--tolerance", type=float, default=0.03)
    p.add_argument("--plot", default=None, help="write the time-vs-k plot here (PNG)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return plan(parse_args(argv))
    except FastPSError as e:
        print(f"fastps.plan: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
