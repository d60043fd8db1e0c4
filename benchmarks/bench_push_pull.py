"""push_pull of a gradient set on loopback: fastps against torch.distributed Gloo all_reduce.

Both systems move the same bytes (default 64 MiB as 16 tensors of 4 MiB, float32) with the
same number of worker processes, in the same run. Prints a table of median iteration
times, goodput and the fastps/Gloo speed ratio.

    python benchmarks/bench_push_pull.py --workers 2 4 --servers 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

HERE = os.path.abspath(__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tensors(total_mb: int, tensor_mb: int, seed: int):  # type: ignore[no-untyped-def]
    import numpy as np

    n = max(1, total_mb // tensor_mb)
    elems = tensor_mb * (1 << 20) // 4
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(elems, dtype=np.float32) for _ in range(n)]


def child_fastps(args: argparse.Namespace) -> None:
    import fastps

    fastps.init()
    ts = _tensors(args.total_mb, args.tensor_mb, fastps.rank())
    times: List[float] = []
    for it in range(args.warmup + args.iters):
        fastps.barrier()
        t0 = time.perf_counter()
        hs = [
            fastps.push_pull_async(t, average=False, name=f"g{i}", priority=-i, out=t)
            for i, t in enumerate(ts)
        ]
        for h in hs:
            h.synchronize()
        if it >= args.warmup:
            times.append(time.perf_counter() - t0)
    if fastps.rank() == 0:
        print("RESULT " + json.dumps({"median_s": statistics.median(times), "times": times}))
    fastps.shutdown()


def child_gloo(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, _ = rc.init_gloo_from_env(args.timeout)
    ts = [torch.from_numpy(a) for a in _tensors(args.total_mb, args.tensor_mb, rank)]
    times: List[float] = []
    for it in range(args.warmup + args.iters):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
        if it >= args.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print("RESULT " + json.dumps({"median_s": statistics.median(times), "times": times}))
    dist.destroy_process_group()


def _result(out: str) -> Dict[str, float]:
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"no result in output:\n{out[-3000:]}")


def _child_args(args: argparse.Namespace, system: str) -> List[str]:
    return [
        sys.executable,
        HERE,
        "--child",
        system,
        "--total-mb",
        str(args.total_mb),
        "--tensor-mb",
        str(args.tensor_mb),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
    ]


def run_fastps(args: argparse.Namespace, workers: int, servers: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(workers),
        "--num-servers",
        str(servers),
        *_child_args(args, "fastps"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(
            f"fastps run failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
        )
    return float(_result(p.stdout)["median_s"])


def run_gloo(args: argparse.Namespace, workers: int) -> float:
    port = str(_free_port())
    procs = []
    for r in range(workers):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            RANK=str(r),
            WORLD_SIZE=str(workers),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                _child_args(args, "gloo"),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = []
    deadline = time.time() + args.timeout
    for p in procs:
        out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        outs.append(out)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"gloo run failed:\n{out[-3000:]}")
    return float(_result(outs[0])["median_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", choices=["fastps", "gloo"])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--total-mb", type=int, default=64)
    ap.add_argument("--tensor-mb", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="whole runs per system; medians")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.child == "fastps":
        return child_fastps(args)
    if args.child == "gloo":
        return child_gloo(args)

    mb = args.total_mb
    rows = []
    print(
        f"push_pull of {mb} MiB as {max(1, mb // args.tensor_mb)} x {args.tensor_mb} MiB "
        f"float32 on loopback, {os.cpu_count()} CPUs; medians of {args.repeats} runs x "
        f"{args.iters} iterations"
    )
    print(f"{'workers':>7} {'system':<22} {'time ms':>9} {'GB/s':>7} {'vs gloo':>8}")
    for n in args.workers:
        gloo = statistics.median(run_gloo(args, n) for _ in range(args.repeats))
        rows.append({"workers": n, "system": "gloo all_reduce", "seconds": gloo, "ratio": 1.0})
        print(
            f"{n:>7} {'gloo all_reduce':<22} {gloo * 1e3:>9.1f} {mb / 1024 / gloo:>7.2f} "
            f"{1.0:>8.2f}"
        )
        for k in args.servers:
            t = statistics.median(run_fastps(args, n, k) for _ in range(args.repeats))
            label = f"fastps {k} server{'s' if k > 1 else ''}"
            rows.append({"workers": n, "system": label, "seconds": t, "ratio": gloo / t})
            print(
                f"{n:>7} {label:<22} {t * 1e3:>9.1f} {mb / 1024 / t:>7.2f} {gloo / t:>8.2f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
