"""What starting a gradient set costs: one push_pull_async per tensor against one group.

Every worker holds a model's gradient tensors (shapes from benchmarks/rack_common.py, scaled
down so the transfer itself is short) and starts them all, last layer first, either with one
``push_pull_async`` per tensor or with one ``grouped_push_pull_async``; prints the median
time of the submission alone and of the whole synchronisation, per mode, from rank 0.

    python benchmarks/bench_submit.py                    # 2 workers, ResNet-50 (161 tensors)
    python benchmarks/bench_submit.py --workers 4 --model vgg16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np

    sys.path.insert(0, REPO)
    from benchmarks import rack_common as rc

    sizes = rc.gradient_sizes(args.model, args.scale)
    fastps.init()
    grads = [np.ones(count, dtype=np.float32) for _, count in sizes]
    order = list(reversed(range(len(grads))))
    rows: Dict[str, Dict[str, List[float]]] = {}
    for mode in ("each", "group") * args.repeats:
        submit: List[float] = []
        total: List[float] = []
        for it in range(args.warmup + args.iters):
            fastps.barrier()
            t0 = time.perf_counter()
            if mode == "each":
                handles = [
                    fastps.push_pull_async(
                        grads[i], average=False, name=sizes[i][0], priority=-i, out=grads[i]
                    )
                    for i in order
                ]
            else:
                handles = fastps.grouped_push_pull_async(
                    [grads[i] for i in order],
                    average=False,
                    names=[sizes[i][0] for i in order],
                    priorities=[-i for i in order],
                    outs=[grads[i] for i in order],
                )
            t1 = time.perf_counter()
            for h in handles:
                h.synchronize()
            if it >= args.warmup:
                submit.append(t1 - t0)
                total.append(time.perf_counter() - t0)
        row = rows.setdefault(mode, {"submit": [], "total": []})
        row["submit"] += submit
        row["total"] += total
    if fastps.rank() == 0:
        print(
            "RESULT "
            + json.dumps(
                {m: {k: statistics.median(v) for k, v in r.items()} for m, r in rows.items()}
            ),
            flush=True,
        )
    fastps.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument(
        "--scale",
        type=float,
        default=0.05,
        help="fraction of every tensor to move (keeps the tensor count)",
    )
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="alternations of the two modes")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(args.workers),
        "--num-servers",
        str(args.servers),
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--model",
        args.model,
        "--scale",
        str(args.scale),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    line = next((x for x in p.stdout.splitlines() if "RESULT " in x), None)
    if p.returncode != 0 or line is None:
        print(p.stdout[-3000:] + p.stderr[-3000:], file=sys.stderr)
        return 1
    res = json.loads(line.split("RESULT ", 1)[1])
    print(
        f"{args.model} x{args.scale:g}, {args.workers} workers, {args.servers} server(s), "
        f"medians of {args.iters * args.repeats} iterations (rank 0)"
    )
    print(f"{'start':>6} {'submit ms':>10} {'total ms':>9}")
    for mode in ("each", "group"):
        print(f"{mode:>6} {1e3 * res[mode]['submit']:10.2f} {1e3 * res[mode]['total']:9.2f}")
    print(f"submission: group / each = {res['group']['submit'] / res['each']['submit']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
