"""The published trends, replayed in the simulator, and the plots of docs/design/simulator.md.

- BytePS section 7.4 (Fig. 15/16): speedup over all-reduce as the number of GPUs grows from
  8 to 256, with k = 0 and with k = n CPU machines. Published (text of section 7.4): at 256
  GPUs 1.09-1.53x without CPU machines and 1.10-1.84x with them, growing with scale;
  scaling efficiency at 256 GPUs ResNet-50 97.5% (all-reduce 88%), the others >= 91.6%
  except UGATIT (74%).
- BytePS Fig. 12/13: more CPU machines, faster (up to 20% over k = 0 end to end).
- Oversubscribed racks: the cross-rack term of the bound grows with the oversubscription;
  all-reduce's ring crosses each uplink once per direction and suffers less.
- P3 (section 5.3): priorities + slicing + overlapping the next forward pass against the
  layer-wise synchronous baseline, 4 machines, as the bandwidth falls: ResNet-50 +26% at
  4 Gbit/s, VGG-19 +66% at 15 Gbit/s, the gain vanishing at high and at very low bandwidth.

    python -m fastps.sim.scaling --out docs/sim-results
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import workload
from .allreduce import train_allreduce
from .cluster import Cluster
from .pushpull import CommOptions
from .training import TrainOptions, train

# BytePS's testbed (section 7): 8 V100 per machine, one 100 GbE RoCE NIC, ~90 Gbit/s
# point-to-point goodput (Fig. 12), RDMA one-way latency a few microseconds.
BYTEPS_GPUS_PER_MACHINE = 8
BYTEPS_GOODPUT_GBIT = 90.0
BYTEPS_LATENCY_S = 5e-6
# Section 7.4 in numbers: speedup over all-reduce at 256 GPUs (min, max over six models).
BYTEPS_256_SPEEDUP = {"k=0": (1.09, 1.53), "k=n": (1.10, 1.84)}
BYTEPS_256_EFFICIENCY = {"ResNet-50 BytePS": 0.975, "ResNet-50 all-reduce": 0.88}
# P3 section 5.3, 4 machines: largest gain over the baseline and the bandwidth it was at.
P3_PEAK = {"resnet50": (1.26, 4.0), "vgg16": (1.66, 15.0)}  # VGG-19 in the paper

FAST = TrainOptions(iterations=3, warmup=1)


def _cluster(
    n: int, k: int, gbit: float, latency: float, racks: int = 1, oversub: float = 1.0
) -> Cluster:
    return Cluster(
        workers=n,
        cpu_machines=k,
        link_mbit=gbit * 1000.0,
        goodput=1.0,
        latency_s=latency,
        explicit=False,
        racks=racks,
        oversubscription=oversub,
    )


def byteps_scaling(
    models: Sequence[str],
    machines: Sequence[int],
    gbit: float,
    latency: float,
    batch_factor: Dict[str, float],
) -> List[Tuple]:
    """(model, machines, k, fastps s, all-reduce s, compute s) per point."""
    rows = []
    for m in models:
        w = workload.load(m)
        w = w.with_compute(w.compute_s * batch_factor.get(m, 1.0))
        for n in machines:
            ar = train_allreduce(_cluster(n, 0, gbit, latency), w).iteration_s
            for k in (0, n):
                fp = train(_cluster(n, k, gbit, latency), w, None, FAST).iteration_s
                rows.append((m, n, k, fp, ar, w.compute_s))
    return rows


def oversubscription(
    model: str, n: int, racks: int, ratios: Sequence[float], gbit: float, latency: float, k: int
) -> List[Tuple]:
    w = workload.load(model)
    rows = []
    for r in ratios:
        cl = _cluster(n, k, gbit, latency, racks=racks, oversub=r)
        fp = train(cl, w, None, FAST)
        ar = train_allreduce(cl, w).iteration_s
        rows.append((r, fp.iteration_s, ar, fp.bound_s))
    return rows


def p3_gains(model: str, gbits: Sequence[float], n: int = 4) -> List[Tuple]:
    """(Gbit/s, baseline s, P3 s): baseline = whole-layer parts, no priorities, synchronous
    step (MXNet's KVStore); P3 = 256 KiB slices, priorities, cross-barrier."""
    w = workload.load(model)
    rows = []
    for g in gbits:
        cl = _cluster(n, 0, g, 50e-6)
        base = train(
            cl,
            w,
            CommOptions(partition_bytes=256 << 20, window_bytes=0),
            TrainOptions(mode="sync", priorities=False, iterations=3, warmup=1),
        )
        p3 = train(cl, w, None, FAST)
        rows.append((g, base.iteration_s, p3.iteration_s))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The docs' plots: --out docs/sim-results in a checkout; elsewhere ./sim-results.
    p.add_argument("--out", type=Path, default=Path("sim-results"), help="folder for the plots")
    p.add_argument("--models", nargs="+", default=["resnet50", "vgg16", "bert-base"])
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # BytePS's batches per GPU (section 7.4) against the emulator's reference batches.
    batch = {"resnet50": 256 / 128, "vgg16": 96 / 64, "bert-base": 1.0}
    # (title, GPUs per machine, machines, goodput Gbit/s, latency, batch factors)
    settings = [
        (
            "BytePS testbed: 100 GbE, 8 V100/machine",
            BYTEPS_GPUS_PER_MACHINE,
            [1, 2, 4, 8, 16, 32, 64, 128],
            BYTEPS_GOODPUT_GBIT,
            BYTEPS_LATENCY_S,
            batch,
        ),
        (
            "25 Gbit/s TCP, 1 V100/machine",
            1,
            [8, 16, 32, 64, 128, 256, 512, 1024],
            25.0 * 0.956,
            30e-6,
            {},
        ),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    print("## BytePS scaling (speedup of fastps over ring all-reduce)")
    for ax, (title, per, machines, gbit, lat, bf) in zip(axes, settings):
        rows = byteps_scaling(args.models, machines, gbit, lat, bf)
        print(
            f"\n{title}\n| model | GPUs | k | fastps s | all-reduce s | speedup | "
            "efficiency fastps / all-reduce |\n|---|---:|---:|---:|---:|---:|---|"
        )
        for m in args.models:
            for k_label, pick in (("k=0", lambda n, k: k == 0), ("k=n", lambda n, k: k == n)):
                pts = [(n, ar / fp) for (mm, n, k, fp, ar, c) in rows if mm == m and pick(n, k)]
                gpus = [per * n for n, _ in pts]
                ax.plot(
                    gpus,
                    [s for _, s in pts],
                    marker="o" if k_label == "k=0" else "s",
                    linestyle="-" if k_label == "k=0" else "--",
                    label=f"{m} {k_label}",
                )
            for mm, n, k, fp, ar, c in rows:
                if mm == m and n > 1:
                    print(
                        f"| {m} | {per * n} | {k} | {fp:.4f} | {ar:.4f} | {ar / fp:.3f} | "
                        f"{c / fp:.3f} / {c / ar:.3f} |"
                    )
        for k_label, (lo, hi) in BYTEPS_256_SPEEDUP.items():
            ax.errorbar(
                [256 if k_label == "k=0" else 280],
                [(lo + hi) / 2],
                yerr=[[(hi - lo) / 2], [(hi - lo) / 2]],
                fmt="k*" if k_label == "k=0" else "kD",
                capsize=4,
                label=f"BytePS published, 256 GPUs, {k_label}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"GPUs ({per} per machine)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup over ring all-reduce")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "byteps-scaling.png", dpi=110)

    print(
        "\n## Oversubscribed racks (ResNet-50 at its V100 time, 64 workers in 4 racks, "
        "10 Gbit/s hosts)"
    )
    print("| oversubscription | fastps k=0 s | fastps k=16 s | all-reduce s | bound k=0 s |")
    print("|---:|---:|---:|---:|---:|")
    ratios = [1, 2, 4, 8]
    o0 = oversubscription("resnet50", 64, 4, ratios, 10 * 0.956, 30e-6, 0)
    o16 = oversubscription("resnet50", 64, 4, ratios, 10 * 0.956, 30e-6, 16)
    for (r, f0, ar, b0), (_, f16, _, _) in zip(o0, o16):
        print(f"| {r:g}:1 | {f0:.3f} | {f16:.3f} | {ar:.3f} | {b0:.3f} |")

    print(
        "\n## P3: priorities + slicing + cross-barrier against the layer-wise sync baseline"
        " (4 machines)"
    )
    fig2, ax2 = plt.subplots(figsize=(6, 4))
    for m in ("resnet50", "vgg16"):
        gb = [1, 2, 4, 6, 8, 10, 15, 20, 30]
        rows = p3_gains(m, gb)
        print(f"\n{m}\n| Gbit/s | baseline s | P3 s | gain |\n|---:|---:|---:|---:|")
        for g, b, q in rows:
            print(f"| {g:g} | {b:.3f} | {q:.3f} | {b / q - 1:+.0%} |")
        ax2.plot(gb, [b / q for _, b, q in rows], marker="o", label=f"{m} (simulated)")
        peak, at = P3_PEAK[m]
        ax2.plot(
            [at],
            [peak],
            "k*" if m == "resnet50" else "kD",
            markersize=9,
            label=f"P3 published peak ({'ResNet-50' if m == 'resnet50' else 'VGG-19'})",
        )
    ax2.set_xlabel("link Gbit/s")
    ax2.set_ylabel("throughput gain over baseline")
    ax2.set_xscale("log")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig2.tight_layout()
    fig2.savefig(args.out / "p3-priorities.png", dpi=110)
    print(f"\nplots in {args.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
