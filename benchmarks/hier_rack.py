"""Rack-level hierarchy on an emulated two-level topology: hierarchical vs flat vs the bound.

``--racks`` racks of ``--hosts`` worker hosts each (benchmarks/rack, ``racks=``): every
host link shaped to ``--rate`` Mbit/s, every rack's switch joined to a core switch by an
uplink shaped to ``--uplink`` Mbit/s (4 hosts x rate behind an uplink of rate: 4:1
oversubscribed). One worker and one server on every host; the scheduler on w0. Each
worker sums a model's float32 gradient set (benchmarks/rack_common.py shapes, scaled by
``--scale``) with one ``grouped_push_pull_async`` per iteration, and every result is
checked (each worker fills rank + 1; every element must come back n(n+1)/2).

- hier: every process has FASTPS_RACK (from the rack), so parts are summed in their rack
  first and one copy per rack crosses the uplink (docs/guide/rack-hierarchy.md);
- flat: FASTPS_RACK is empty, every worker pushes to every owner across the uplinks.

The bounds are core/control/placement.py's hierarchy_bound and flat_bound with the links' goodput
(0.956 x the shaped rate, docs/design/rack.md). Prints a table; needs root. ``--linkstats DIR``
samples every host link and uplink (benchmarks/rack/linkstat.py, 20 ms) and prints each
link's bytes per timed iteration and how busy it was.

    python -m benchmarks.hier_rack --racks 2 --hosts 4 --rate 100 --uplink 100 \\
        --model resnet50 --scale 0.25 --iters 3 --warmup 1
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

# One TCP stream's goodput over an HTB-shaped link, as a fraction of the rate (docs/design/rack.md).
GOODPUT = 0.956


def child(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np

    sizes = rc.gradient_sizes(args.model, args.scale)
    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    want = n * (n + 1) / 2
    grads = [np.empty(count, dtype=np.float32) for _, count in sizes]
    order = list(reversed(range(len(grads))))  # backward order: last layer first
    times: List[float] = []
    spans: List[List[float]] = []  # wall-clock [start, end] of each timed iteration
    bad = 0
    for it in range(args.warmup + args.iters):
        for g in grads:
            g.fill(rank + 1)
        fastps.barrier()
        w0 = time.time()
        t0 = time.perf_counter()
        handles = fastps.grouped_push_pull_async(
            [grads[i] for i in order],
            average=False,
            names=[sizes[i][0] for i in order],
            priorities=[-i for i in order],
            outs=[grads[i] for i in order],
        )
        for h in handles:
            h.synchronize()
        dt = time.perf_counter() - t0
        bad += sum(int(not np.all(g == want)) for g in grads)
        if it >= args.warmup:
            times.append(dt)
            spans.append([w0, w0 + dt])
    rc.emit_result({"times": times, "spans": spans, "bad": bad, "rank": rank, "n": n}, rank)
    fastps.barrier()
    fastps.shutdown()


def start_linkstats(rack: Any, args: argparse.Namespace, mode: str) -> List[Tuple[Any, Path]]:
    """With --linkstats DIR: one sampler per rack switch (benchmarks/rack/linkstat.py),
    which sees that rack's host links and its uplink."""
    if not args.linkstats:
        return []
    args.linkstats.mkdir(parents=True, exist_ok=True)
    samplers = []
    for k in range(args.racks):
        out = args.linkstats / f"{mode}-r{k}.csv"
        cmd = ["ip", "netns", "exec", f"{rack.prefix}-s{k}", sys.executable, "-m"]
        cmd += ["benchmarks.rack.linkstat", "--out", str(out), "--interval-ms", "20"]
        cmd += ["--seconds", str(args.timeout)]
        samplers.append((subprocess.Popen(cmd, cwd=str(rc.REPO)), out))
    return samplers


def stop_linkstats(samplers: List[Tuple[Any, Path]]) -> None:
    for proc, _ in samplers:
        proc.terminate()
    for proc, _ in samplers:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def counters_at(path: Path) -> Dict[str, List[Tuple[float, int, int]]]:
    """{device: [(t, switch rx, switch tx)]} of one sampler's file."""
    import csv

    out: Dict[str, List[Tuple[float, int, int]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            out.setdefault(row["host"], []).append(
                (float(row["t"]), int(row["rx_bytes"]), int(row["tx_bytes"]))
            )
    return out


def link_report(
    files: List[Path],
    spans: List[Tuple[float, float]],
    model_bytes: float,
    args: argparse.Namespace,
) -> None:
    """Bytes each link moved per timed iteration (in model sizes M) and how busy it was
    (bytes over goodput x iteration time). A host's veth in its rack switch: switch rx is
    the host's egress; the rack's `uplink` port: switch tx leaves the rack."""
    print(f"# links per iteration (M = {model_bytes / 1e6:.2f} MB): out/in in M, busy out/in")
    for k, path in enumerate(files):
        for dev, pts in sorted(counters_at(path).items()):
            rate = args.uplink if dev == "uplink" else args.rate
            cells = []
            for t0, t1 in spans:
                before = [p for p in pts if p[0] <= t0]
                after = [p for p in pts if p[0] >= t1]
                if not before or not after:
                    continue
                a, b = before[-1], after[0]
                rx, tx = b[1] - a[1], b[2] - a[2]
                out_b, in_b = (tx, rx) if dev == "uplink" else (rx, tx)
                cap = GOODPUT * rate * 1e6 / 8 * (b[0] - a[0])
                cells.append(
                    f"{out_b / model_bytes:.3f}/{in_b / model_bytes:.3f} M "
                    f"{out_b / cap:.2f}/{in_b / cap:.2f}"
                )
            name = f"r{k}-uplink" if dev == "uplink" else dev
            print(f"#   {name:<10} " + " | ".join(cells), flush=True)


def run_mode(rack: Any, args: argparse.Namespace, mode: str, port: int) -> Dict[str, Any]:
    n = args.racks * args.hosts
    samplers = start_linkstats(rack, args, mode)
    with tempfile.TemporaryDirectory(prefix="hier-rack-") as out:
        env = {"RACK_RESULT_DIR": out, "OMP_WAIT_POLICY": "PASSIVE", **args.env}
        if mode == "flat":
            env["FASTPS_RACK"] = ""
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--model",
            args.model,
            "--scale",
            str(args.scale),
            "--iters",
            str(args.iters),
            "--warmup",
            str(args.warmup),
        ]
        launch = rc.start_fastps(rack, n, 0, argv, port, extra_env=env, label=mode)
        try:
            ok, err = rc.wait_all(rack, launch, args.timeout)
        finally:
            stop_linkstats(samplers)
        if not ok:
            raise SystemExit(f"{mode} run failed: {err}")
        results = rc.read_results(Path(out))
    if len(results) != n:
        raise SystemExit(f"{mode}: {len(results)} of {n} workers reported")
    bad = sum(r["bad"] for r in results.values())
    if bad:
        raise SystemExit(f"{mode}: {bad} tensors summed wrong")
    # Per iteration the slowest worker; the median over iterations.
    per_iter = [max(r["times"][i] for r in results.values()) for i in range(args.iters)]
    if samplers:
        spans = [
            (
                min(r["spans"][i][0] for r in results.values()),
                max(r["spans"][i][1] for r in results.values()),
            )
            for i in range(args.iters)
        ]
        model_bytes = 4 * sum(c for _, c in rc.gradient_sizes(args.model, args.scale))
        link_report([path for _, path in samplers], spans, model_bytes, args)
    return {"mode": mode, "seconds": statistics.median(per_iter), "iters": per_iter}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--hosts", type=int, default=4, help="worker hosts per rack")
    p.add_argument("--rate", type=float, default=100.0, help="host link, Mbit/s")
    p.add_argument("--uplink", type=float, default=100.0, help="rack uplink, Mbit/s")
    p.add_argument("--model", default="resnet50", choices=["resnet50", "vgg16"])
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--modes", nargs="+", default=["hier", "flat"], choices=["hier", "flat"])
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--port", "--base-port", type=int, default=29650, help="scheduler port (+1 per scheme)"
    )
    p.add_argument("--prefix", default="fpsh", help="namespace prefix of the emulated racks")
    p.add_argument(
        "--linkstats",
        type=Path,
        default=None,
        help="DIR: sample every link (20 ms) and print bytes and busy fraction per iteration",
    )
    p.add_argument(
        "--env", nargs="*", default=[], help="KEY=VALUE for every process of both schemes"
    )
    args = p.parse_args(argv)
    args.env = dict(item.split("=", 1) for item in args.env)
    if args.child:
        child(args)
        return 0
    from fastps.control import placement

    from benchmarks.rack import Rack

    model_bytes = 4 * sum(c for _, c in rc.gradient_sizes(args.model, args.scale))
    n = args.racks * args.hosts
    hosts = [args.hosts] * args.racks
    uplinks = [GOODPUT * args.uplink] * args.racks
    hier_bound = placement.hierarchy_bound(hosts, GOODPUT * args.rate, uplinks, model_bytes)
    flat_bound = placement.flat_bound(hosts, GOODPUT * args.rate, uplinks, model_bytes)
    print(
        f"# {args.racks} racks x {args.hosts} hosts at {args.rate:g} Mbit/s, uplinks "
        f"{args.uplink:g} Mbit/s ({args.hosts * args.rate / args.uplink:g}:1); {args.model} "
        f"x{args.scale:g} = {model_bytes / 1e6:.1f} MB; env {args.env}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows = []
    with Rack(
        n_workers=n,
        n_cpu_hosts=0,
        rate_mbit=args.rate,
        prefix=args.prefix,
        racks=args.racks,
        uplink_mbit=args.uplink,
    ) as rack:
        for i, mode in enumerate(args.modes):
            rows.append(run_mode(rack, args, mode, args.port + i))
            print(f"# {mode}: {rows[-1]['iters']}", flush=True)
    by_mode = {r["mode"]: r["seconds"] for r in rows}
    print(f"{'scheme':<8} {'s/iter':>8} {'MB/s':>8} {'bound s':>8} {'of bound':>9}")
    for r in rows:
        print(
            f"{r['mode']:<8} {r['seconds']:8.2f} {model_bytes / 1e6 / r['seconds']:8.2f} "
            f"{hier_bound:8.2f} {hier_bound / r['seconds']:9.3f}"
        )
    print(f"{'bound':<8} {hier_bound:8.2f} {model_bytes / 1e6 / hier_bound:8.2f}")
    print(f"{'flat bnd':<8} {flat_bound:8.2f} {model_bytes / 1e6 / flat_bound:8.2f}")
    if "hier" in by_mode and "flat" in by_mode:
        print(f"hier speed-up over flat: {by_mode['flat'] / by_mode['hier']:.2f}x")
    print(f"# load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
