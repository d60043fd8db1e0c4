"""fastps vs PyTorch DDP (Gloo) on the synthetic benchmark, in the same run.

For each model (``vgg``: large fully connected layers; ``resnet``: ResNet-20-like) and each
repeat, runs ``examples/torch/synthetic_benchmark.py`` under ``fastpsrun -np N`` and then
under DDP with Gloo (N processes spawned by the script), same model, batch size and
iteration counts, alternating so that both see the same background load. Prints a table
with the median total samples/second of each system, their ratio, and the ratio of
the best runs (less sensitive to other load on the machine).

    python benchmarks/bench_torch_synthetic.py              # 3 repeats, about 3-4 minutes
    python benchmarks/bench_torch_synthetic.py --quick      # 1 repeat, few iterations
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "torch" / "synthetic_benchmark.py"
RESULT = re.compile(
    r"RESULT system=(\S+) model=(\S+) batch_size=(\d+) workers=(\d+) "
    r"per_worker=([0-9.]+) total=([0-9.]+)"
)


def run_once(system: str, model: str, args: argparse.Namespace) -> Optional[float]:
    """One benchmark run; returns total samples/second, or None if it failed."""
    common = [
        "--model",
        model,
        "--batch-size",
        str(args.batch_size),
        "--num-warmup-batches",
        str(args.num_warmup),
        "--num-batches-per-iter",
        str(args.num_batches_per_iter),
        "--num-iters",
        str(args.num_iters),
    ]
    if system == "fastps":
        cmd = [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(args.np),
            "--num-servers",
            str(args.num_servers),
            sys.executable,
            str(SCRIPT),
            *common,
        ]
    else:
        cmd = [sys.executable, str(SCRIPT), "--ddp", "--ddp-np", str(args.np), *common]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FASTPS_")
        and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONUNBUFFERED"] = "1"
    try:
        res = subprocess.run(
            cmd,
            env=env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=args.run_timeout,
        )
    except subprocess.TimeoutExpired:
        print(f"  {system} {model}: timed out after {args.run_timeout}s", flush=True)
        return None
    found = RESULT.search(res.stdout)
    if not found:
        print(
            f"  {system} {model}: failed (exit {res.returncode})\n{res.stdout[-2000:]}", flush=True
        )
        return None
    if res.returncode != 0:  # e.g. a crash while tearing down, after the measurement
        print(
            f"  {system} {model}: exit {res.returncode} after reporting its result:\n"
            f"{res.stdout[-600:]}",
            flush=True,
        )
    return float(found.group(6))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["vgg", "resnet"])
    p.add_argument("--np", type=int, default=2, help="workers per system")
    p.add_argument("--num-servers", type=int, default=1, help="fastps servers")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-warmup", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--run-timeout", type=float, default=150.0)
    p.add_argument("--quick", action="store_true", help="1 repeat, fewer iterations")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.num_warmup, args.num_batches_per_iter, args.num_iters = 1, 1, 2, 2

    started = time.time()
    results: Dict[str, Dict[str, List[float]]] = {}
    for model in args.models:
        results[model] = {"fastps": [], "ddp-gloo": []}
        for rep in range(args.repeats):
            # Alternate which system goes first, so drifting load hits both alike.
            order = ["fastps", "ddp-gloo"] if rep % 2 == 0 else ["ddp-gloo", "fastps"]
            for system in order:
                total = run_once(system, model, args)
                if total is not None:
                    results[model][system].append(total)
                    print(
                        f"  {model:6s} {system:8s} repeat {rep + 1}: {total:8.1f} samples/s",
                        flush=True,
                    )

    print()
    print(
        f"workers: {args.np} (one process each), fastps servers: {args.num_servers}, "
        f"batch {args.batch_size}/worker, {args.num_iters} x {args.num_batches_per_iter} "
        f"timed batches after {args.num_warmup} warmup, median of {args.repeats}"
    )
    print()
    print(
        "| model | fastps samples/s (median) | DDP-Gloo samples/s (median) | fastps / DDP "
        "(median) | fastps / DDP (best) | fastps runs | DDP runs |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    status = 0
    for model, per in results.items():
        f, d = per["fastps"], per["ddp-gloo"]
        if not f or not d:
            status = 1
        fm = statistics.median(f) if f else float("nan")
        dm = statistics.median(d) if d else float("nan")
        ratio = fm / dm if f and d else float("nan")
        best = max(f) / max(d) if f and d else float("nan")
        print(
            f"| {model} | {fm:.1f} | {dm:.1f} | {ratio:.2f} | {best:.2f} | "
            f"{', '.join(f'{v:.0f}' for v in f)} | {', '.join(f'{v:.0f}' for v in d)} |"
        )
    print()
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"total time {time.time() - started:.0f}s; load average at the end: {load} "
        f"on {os.cpu_count()} cores"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
