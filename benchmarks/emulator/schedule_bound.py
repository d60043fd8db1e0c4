"""The best per-iteration time any communication scheduler can reach for an emulated model.

The ideal max(compute C, communication bound B) ignores the data dependencies: a layer's
gradient exists only once backward has reached it, and the next forward pass of a layer
needs that layer's sum. This computes the steady-state iteration time of a perfect system
under exactly those dependencies, so a measured fraction of the ideal can be split into
what the model's shape allows and what the implementation loses:

- the network is one fluid link that moves the model's bytes in B seconds per iteration
  (the bound of the topology: BytePS Eq. 6), preemptive: at every instant it carries the
  most urgent gradient that is ready (``priority``: forward order, P3) or the oldest
  (``fifo``: submission order, no priorities); no latency, no per-part cost;
- compute is the emulator's per-layer forward/backward times (``models.layer_times``);
- ``cross-barrier``: the forward pass of layer i waits only for layer i's sum;
  ``sync``: it waits for every sum (the optimizer's step is a barrier);
- ``DDP``: sync, and a gradient leaves only with its bucket (torch DDP's default: 1 MiB
  first, then 25 MiB, filled in backward order), once every gradient in it exists; buckets
  go in the order they fill. The same for DDP on Gloo (the ring all-reduce bound) and on
  fastps (BytePS Eq. 6 at k): their ratio is the most a perfect DDP-fastps can gain over a
  perfect DDP-Gloo; a measured DDP-Gloo over the perfect DDP-fastps is the ceiling of the
  measured ratio.

Each iteration's sums are all in before its next backward pass starts, so every iteration
is alike and the period is exact (no warm-up).

``--sparse-embedding``: BERT's word embedding sends a sparse gradient (``nn.Embedding(
sparse=True)``): the rows one batch touches (``models.expected_rows``: ~1,792 of 30,522 for
32 x 128 Zipf-distributed tokens), allgathered as indices and values. Its link time is what
a worker's downlink must receive, (n - 1) x rows x (4 x 768 + 8) bytes, at any k; the dense
tensors keep their share of the bound of the dense bytes. The ideal is then max(C, the new
bound); the table also gives the fraction of the dense ideal.

    python -m benchmarks.emulator.schedule_bound --models resnet50 vgg16 bert -k 0 2
    python -m benchmarks.emulator.schedule_bound --models bert --sparse-embedding
    python -m benchmarks.emulator.schedule_bound --models resnet50 --ratios 1 -k 0 2 --ddp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from benchmarks.emulator import models as em  # noqa: E402


def _finish_times(
    ready: Sequence[float], work: Sequence[float], order: Sequence[int]
) -> List[float]:
    """When each job's work is done on one preemptive server: job j arrives at ready[j]
    and needs work[j] seconds; among the arrived jobs the one earliest in ``order`` runs."""
    rank = {j: r for r, j in enumerate(order)}
    arrivals = sorted(range(len(ready)), key=lambda j: (ready[j], rank[j]))
    left = list(work)
    done = [0.0] * len(ready)
    waiting: List[int] = []  # arrived, unfinished, kept sorted by rank
    t = 0.0
    a = 0
    while a < len(arrivals) or waiting:
        if not waiting:
            t = max(t, ready[arrivals[a]])
        while a < len(arrivals) and ready[arrivals[a]] <= t:
            waiting.append(arrivals[a])
            a += 1
        waiting.sort(key=rank.__getitem__)
        j = waiting[0]
        nxt = ready[arrivals[a]] if a < len(arrivals) else float("inf")
        if t + left[j] <= nxt:
            t += left[j]
            left[j] = 0.0
            done[j] = t
            waiting.pop(0)
        else:
            left[j] -= nxt - t
            t = nxt
    return done


def link_work(
    model: em.ModelSpec,
    n: int,
    k: int,
    goodput_bytes_s: float,
    sparse_rows: float = 0.0,
    ring: bool = False,
) -> List[float]:
    """Seconds of the link each layer's gradient needs: the dense tensors share the bound
    of the dense bytes (BytePS Eq. 6, or the ring all-reduce bound with ``ring``); with
    ``sparse_rows`` the word embedding is a sparse gradient allgathered over n workers."""
    from benchmarks import rack_common as rc

    dense: List[float] = []
    sparse: List[float] = []
    for layer in model.layers:
        d = s = 0.0
        for pname, shape in layer.params:
            numel = float(np.prod(shape))
            if sparse_rows and pname == em.SPARSE_PARAM:
                s += (n - 1) * em.sparse_bytes(sparse_rows, shape[1]) / goodput_bytes_s
            else:
                d += numel
        dense.append(d)
        sparse.append(s)
    nbytes = 4.0 * sum(dense)
    if ring:
        b = rc.allreduce_bound_s(n, nbytes, goodput_bytes_s)
    else:
        b = rc.fastps_bound_s(n, k, nbytes, goodput_bytes_s)
    total = sum(dense)
    return [b * d / total + s for d, s in zip(dense, sparse)]


def _gradients_ready(times: Sequence[Tuple[float, float]]) -> List[float]:
    """When each layer's gradient exists: backward starts at 0 and runs from the last
    layer to the first (``times``: per-layer forward and backward seconds)."""
    ready = [0.0] * len(times)
    t = 0.0
    for i in range(len(times) - 1, -1, -1):
        t += times[i][1]
        ready[i] = t
    return ready


def period(
    model: em.ModelSpec,
    compute_s: float,
    bound_s: float,
    cross_barrier: bool,
    priority: bool,
    work: Optional[Sequence[float]] = None,
) -> float:
    """Steady-state seconds per iteration of a perfect system (see the module doc); the
    link moves the model in ``bound_s`` split by bytes, or layer i in ``work[i]``."""
    times = em.layer_times(model, compute_s)
    if work is None:
        sizes = [layer.numel for layer in model.layers]
        total = float(sum(sizes))
        work = [bound_s * s / total for s in sizes]
    n = len(model.layers)
    ready = _gradients_ready(times)
    backward_end = ready[0]
    order = list(range(n)) if priority else sorted(range(n), key=lambda i: ready[i])
    done = _finish_times(ready, work, order)
    t = backward_end if cross_barrier else max(backward_end, max(done))
    for i in range(n):
        if cross_barrier:
            t = max(t, done[i])
        t += times[i][0]
    return t  # the next backward starts here


DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 << 20  # DDP's bucket_cap_mb default


def ddp_buckets(
    model: em.ModelSpec,
    first_bytes: int = DDP_FIRST_BUCKET_BYTES,
    cap_bytes: int = DDP_BUCKET_BYTES,
) -> List[List[int]]:
    """The layers of each DDP bucket, in the order the buckets fill (backward order): a
    bucket closes once it holds its cap, the first one at ``first_bytes``. float32."""
    buckets: List[List[int]] = []
    cur: List[int] = []
    size = 0
    cap = first_bytes
    for i in range(len(model.layers) - 1, -1, -1):
        cur.append(i)
        size += 4 * model.layers[i].numel
        if size >= cap:
            buckets.append(cur)
            cur, size, cap = [], 0, cap_bytes
    if cur:
        buckets.append(cur)
    return buckets


def ddp_period(
    model: em.ModelSpec,
    compute_s: float,
    work: Sequence[float],
    buckets: Sequence[Sequence[int]],
) -> float:
    """Steady-state seconds per iteration of a perfect DDP: a bucket is sent once its last
    gradient exists (the lowest layer in it), buckets in order, and the next forward pass
    waits for every sum."""
    times = em.layer_times(model, compute_s)
    ready_layer = _gradients_ready(times)
    ready = [max(ready_layer[i] for i in b) for b in buckets]
    bwork = [sum(work[i] for i in b) for b in buckets]
    done = _finish_times(ready, bwork, list(range(len(buckets))))
    return max(ready_layer[0], max(done)) + sum(f for f, _ in times)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from benchmarks import rack_common as rc

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "vgg16", "bert"])
    p.add_argument("--ratios", nargs="+", type=float, default=[0.5, 1.0, 2.0])
    p.add_argument("-k", "--cpu-hosts", nargs="+", type=int, default=[0, 1, 2, 4])
    p.add_argument("-n", "--workers", type=int, default=4)
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per host link")
    p.add_argument(
        "--sparse-embedding",
        action="store_true",
        help="BERT's word embedding sends a sparse gradient (the rows a batch uses)",
    )
    p.add_argument(
        "--ddp",
        action="store_true",
        help="also a perfect torch DDP (25 MiB buckets) on Gloo and on fastps at each k",
    )
    args = p.parse_args(argv)
    if args.ddp:
        return _print_ddp(args)
    good = args.rate * rc.GOODPUT_FACTOR * 1e6 / 8
    rows = em.expected_rows() if args.sparse_embedding else 0.0
    if rows:
        print(f"sparse word embedding: {rows:.0f} rows per worker and batch (Zipf, s = 1)")
    print(
        f"{'model':8s} {'ratio':>5s} {'k':>2s} {'C s':>7s} {'B s':>7s} "
        f"{'cb+prio':>8s} {'cb fifo':>8s} {'sync':>8s}   (fraction of max(C, B))"
        + ("   cb+prio of the dense ideal" if rows else "")
    )
    for name in args.models:
        model = em.spec(name)
        nbytes = 4.0 * model.numel
        b0 = rc.fastps_bound_s(args.workers, 0, nbytes, good)
        for ratio in args.ratios:
            c = ratio * b0  # the ratio is to the dense bound, as in train_emulated
            for k in args.cpu_hosts:
                work = link_work(model, args.workers, k, good, rows)
                b = sum(work)
                ideal = max(c, b)
                periods = [
                    period(model, c, b, cb, prio, work)
                    for cb, prio in ((True, True), (True, False), (False, True))
                ]
                fr = [ideal / t for t in periods]
                dense_ideal = max(c, rc.fastps_bound_s(args.workers, k, nbytes, good))
                print(
                    f"{name:8s} {ratio:5g} {k:2d} {c:7.3f} {b:7.3f} "
                    f"{fr[0]:8.3f} {fr[1]:8.3f} {fr[2]:8.3f}"
                    + (f"   {dense_ideal / periods[0]:8.3f}" if rows else "")
                )
    return 0


def _print_ddp(args: argparse.Namespace) -> int:
    from benchmarks import rack_common as rc

    good = args.rate * rc.GOODPUT_FACTOR * 1e6 / 8
    print(
        f"{'model':8s} {'ratio':>5s} {'k':>2s} {'C s':>7s} {'buckets':>7s} "
        f"{'DDP-Gloo s':>10s} {'DDP-fastps s':>12s} {'fastps/Gloo':>11s}"
    )
    for name in args.models:
        model = em.spec(name)
        buckets = ddp_buckets(model)
        b0 = rc.fastps_bound_s(args.workers, 0, 4.0 * model.numel, good)
        for ratio in args.ratios:
            c = ratio * b0
            gloo = ddp_period(model, c, link_work(model, args.workers, 0, good, ring=True), buckets)
            for k in args.cpu_hosts:
                fps = ddp_period(model, c, link_work(model, args.workers, k, good), buckets)
                print(
                    f"{name:8s} {ratio:5g} {k:2d} {c:7.3f} {len(buckets):7d} "
                    f"{gloo:10.3f} {fps:12.3f} {gloo / fps:11.3f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
