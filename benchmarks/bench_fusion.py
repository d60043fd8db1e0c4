"""Tensor fusion (FASTPS_FUSION_THRESHOLD, csrc/worker/fusion.h): time per iteration with
and without it.

Every worker holds a model's float32 gradient tensors and sums them over all workers as a
training step's backward pass hands them over: one ``push_pull_async`` per tensor, last
layer first, priority = forward order, then waits for all. One iteration = from a barrier
to the last sum. Modes alternate (without, with, without, with, ...) so a change in the
machine's load hits both; the table shows the median per mode over all repetitions, the
ratio with/without, and the load average (1 min) at the start and end of the run. Every
result is checked (each worker sends rank + 1: every element must come back n(n+1)/2).

Models: ``resnet50`` (161 tensors, 102 MB, shapes in benchmarks/rack_common.py) and
``many1000`` (1,000 tensors of 256 to 16,384 elements, 17 MB: biases, norms and small
projections, as in a deep transformer).

    python benchmarks/bench_fusion.py                              # loopback, both models
    python benchmarks/bench_fusion.py --rack --rate 10000          # emulated rack (root)
    python benchmarks/bench_fusion.py --models many1000 --workers 4 --servers 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import rack_common as rc  # noqa: E402

MANY_SIZES = (256, 1024, 4096, 16384, 768, 3072)


def model_sizes(model: str, scale: float) -> List[Tuple[str, int]]:
    if model == "many1000":
        return [
            (f"block{j // 10}.t{j % 10}", max(1, int(MANY_SIZES[j % len(MANY_SIZES)] * scale)))
            for j in range(1000)
        ]
    return rc.gradient_sizes(model, scale)


def child(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np
    from fastps.worker import api

    sizes = model_sizes(args.model, args.scale)
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    want = n * (n + 1) / 2
    grads = [np.empty(count, dtype=np.float32) for _, count in sizes]
    order = list(reversed(range(len(grads))))  # backward order: last layer first
    rows = [(sizes[i][0], grads[i].nbytes, "float32", -i) for i in range(len(grads))]
    times: Dict[str, List[float]] = {"without": [], "with": []}
    buckets = 0
    bad = 0
    for _ in range(args.repeats):
        for mode in ("without", "with"):
            got = api.set_fusion_plan("bench", rows if mode == "with" else [])
            if mode == "with":
                buckets = got
            for it in range(args.warmup + args.iters):
                for g in grads:
                    g.fill(rank + 1)
                fastps.barrier()
                t0 = time.perf_counter()
                handles = [
                    fastps.push_pull_async(
                        grads[i], average=False, name=sizes[i][0], priority=-i, out=grads[i]
                    )
                    for i in order
                ]
                for h in handles:
                    h.synchronize()
                dt = time.perf_counter() - t0
                bad += sum(int(g[0] != want or g[-1] != want) for g in grads)
                if it >= args.warmup:
                    times[mode].append(dt)
    rc.emit_result({"times": times, "bad": bad, "buckets": buckets, "rank": rank}, rank)
    fastps.barrier()
    fastps.shutdown()


def _child_argv(args: argparse.Namespace, model: str) -> List[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--model",
        model,
        "--scale",
        str(args.scale),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
    ]


def run_loopback(args: argparse.Namespace, model: str) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-fusion-") as tmp:
        env = dict(
            os.environ,
            RACK_RESULT_DIR=tmp,
            FASTPS_FUSION_THRESHOLD=args.threshold,
            **rc.QUIET_THREADS,
        )
        cmd = [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(args.workers),
            "--num-servers",
            str(args.servers),
            *_child_argv(args, model),
        ]
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout, cwd=str(REPO), env=env
        )
        res = rc.read_results(Path(tmp))
        if p.returncode != 0 or 0 not in res:
            raise RuntimeError(p.stdout[-3000:] + p.stderr[-3000:])
        return res[0]


def run_rack(args: argparse.Namespace, model: str, rack: Any, port: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-fusion-") as tmp:
        env = {"RACK_RESULT_DIR": tmp, "FASTPS_FUSION_THRESHOLD": args.threshold}
        launch = rc.start_fastps(
            rack,
            args.workers,
            args.cpu_hosts,
            _child_argv(args, model),
            port,
            env,
            timeout_s=args.timeout,
            label=f"fus{port}",
        )
        ok, err = rc.wait_all(rack, launch, args.timeout)
        res = rc.read_results(Path(tmp))
        if not ok or 0 not in res:
            raise RuntimeError(err)
        return res[0]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="resnet50", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=["resnet50", "many1000"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2, help="loopback: servers")
    ap.add_argument("--cpu-hosts", type=int, default=1, help="rack: CPU-only server hosts")
    ap.add_argument("--rack", action="store_true", help="on the emulated rack (root)")
    ap.add_argument("--rate", type=float, default=10000, help="rack link rate, Mbit/s")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of every tensor")
    ap.add_argument("--threshold", default="256K", help="FASTPS_FUSION_THRESHOLD when on")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="alternations of the two modes")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    load0 = os.getloadavg()[0]
    results: List[Tuple[str, Dict[str, Any]]] = []
    if args.rack:
        from benchmarks.rack import Rack

        with Rack(
            n_workers=args.workers, n_cpu_hosts=args.cpu_hosts, rate_mbit=args.rate, prefix="fus"
        ) as rack:
            for i, model in enumerate(args.models):
                results.append((model, run_rack(args, model, rack, 29500 + i)))
        where = (
            f"emulated rack: {args.workers} worker hosts + {args.cpu_hosts} CPU host(s), "
            f"{args.rate:g} Mbit/s links, servers on every host"
        )
    else:
        for model in args.models:
            results.append((model, run_loopback(args, model)))
        shm = os.environ.get("FASTPS_SHM", "1") != "0"
        where = f"loopback: {args.workers} workers, {args.servers} servers, one host, " + (
            "shared memory and local reduce" if shm else "FASTPS_SHM=0: every part over TCP"
        )
    load1 = os.getloadavg()[0]
    print(
        f"{where}; FASTPS_FUSION_THRESHOLD={args.threshold}; medians of "
        f"{args.iters * args.repeats} iterations per mode (rank 0); load average (1 min) "
        f"{load0:.1f} at start, {load1:.1f} at end, {os.cpu_count()} CPUs"
    )
    print(
        f"{'model':>9} {'tensors':>7} {'MB':>6} {'buckets':>7} {'without ms':>10} "
        f"{'with ms':>8} {'with/without':>12}"
    )
    for model, res in results:
        if res["bad"]:
            print(f"{model}: {res['bad']} WRONG SUMS", file=sys.stderr)
            return 1
        sizes = model_sizes(model, args.scale)
        mb = 4 * sum(c for _, c in sizes) / 1e6
        without = statistics.median(res["times"]["without"])
        with_ = statistics.median(res["times"]["with"])
        print(
            f"{model:>9} {len(sizes):7d} {mb:6.1f} {res['buckets']:7d} {1e3 * without:10.1f} "
            f"{1e3 * with_:8.1f} {with_ / without:12.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
