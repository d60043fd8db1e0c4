"""Bytes on the wire and time of each collective: fastps against its minimum and against
Gloo (torch.distributed) in the same processes, in the same run.

For allreduce, allgather, broadcast, alltoall and reducescatter at each worker count and
size, every worker measures the bytes its data-plane sockets sent and received during the
op (the core's counters, ``data_path_stats()``: frame headers included, nothing computed
from a formula) and the op's wall time; the same processes then time Gloo's op on the same
tensor. Prints, per op, the worst worker's bytes against the parameter-server minimum
(docs/design/architecture.md, "Bytes on the wire"), all workers' bytes against the peer-to-peer
minimum (what a worker-to-worker design such as Gloo's ring must move at least), and the
fastps/Gloo time ratio; medians of
``--reps`` repetitions. Shared memory is off by default (``--shm`` turns it on), so every
byte crosses TCP as it would between machines.

    python benchmarks/bench_collectives_bytes.py --workers 2 4 --sizes 1M 16M --reps 5

``size`` is each worker's input: the tensor of allreduce, broadcast, alltoall and
reducescatter, the block each worker contributes to allgather.
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
from typing import Any, Callable, Dict, List, Tuple

HERE = os.path.abspath(__file__)
OPS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
ROOT = 0


def minimum(op: str, n: int, size: int, rank: int) -> Tuple[int, int]:
    """(sent, received) bytes of this rank in a parameter-server design that moves each
    byte the fewest times: inputs up once, each worker's result down once."""
    if op == "allreduce":
        return size, size
    if op == "allgather":
        return size, (n - 1) * size
    if op == "broadcast":
        return (size, 0) if rank == ROOT else (0, size)
    if op == "alltoall":
        return (n - 1) * size // n, (n - 1) * size // n
    if op == "reducescatter":
        return size, size // n
    raise ValueError(op)


def p2p_minimum(op: str, n: int, size: int, rank: int) -> Tuple[int, int]:
    """The same with worker-to-worker links (bandwidth-optimal ring / direct algorithms)."""
    if op == "allreduce":
        return 2 * (n - 1) * size // n, 2 * (n - 1) * size // n
    if op == "allgather":
        return (n - 1) * size, (n - 1) * size  # ring: forward every block but one
    if op == "broadcast":
        return (size, 0) if rank == ROOT else (size if rank != n - 1 else 0, size)  # chain
    if op == "alltoall":
        return (n - 1) * size // n, (n - 1) * size // n
    if op == "reducescatter":
        return (n - 1) * size // n, (n - 1) * size // n
    raise ValueError(op)


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np
    import torch
    import torch.distributed as dist
    from fastps.collectives import ops as C
    from fastps.worker import api

    fastps.init()
    C.start_session()
    rank, n = fastps.rank(), fastps.size()
    port = C.broadcast_object(_free_port() if rank == 0 else None, ROOT)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)

    def fastps_op(op: str, a: Any) -> Callable[[], Any]:
        if op == "allreduce":
            return lambda: C.allreduce_async(a, "float32", op=C.ReduceOp.SUM).synchronize()
        if op == "allgather":
            return lambda: C.allgather_async(a, "float32").synchronize()
        if op == "broadcast":
            return lambda: C.broadcast_async(a, "float32", ROOT).synchronize()
        if op == "alltoall":
            return lambda: C.alltoall_async(a, "float32").synchronize()
        return lambda: C.reducescatter_async(a, "float32", op=C.ReduceOp.SUM).synchronize()

    def gloo_op(op: str, a: Any) -> Callable[[], Any]:
        t = torch.from_numpy(a.copy())
        if op == "allreduce":
            return lambda: dist.all_reduce(t)
        if op == "allgather":
            outs = [torch.empty_like(t) for _ in range(n)]
            return lambda: dist.all_gather(outs, t)
        if op == "broadcast":
            return lambda: dist.broadcast(t, ROOT)
        if op == "alltoall":
            out = torch.empty_like(t)
            return lambda: dist.all_to_all_single(out, t)
        out = torch.empty(t.numel() // n, dtype=t.dtype)
        return lambda: dist.reduce_scatter_tensor(out, t)

    def counters() -> Tuple[int, int]:
        # Read until they stop moving: a writer thread adds its last bytes after its write
        # returned, which can be just after the op completed.
        now = (-1, -1)
        for _ in range(100):
            s = api.data_path_stats()
            read = (int(s["socket_bytes_sent"]), int(s["socket_bytes_received"]))
            if read == now:
                break
            now = read
            time.sleep(0.01)
        return now

    rows: List[Dict[str, Any]] = []
    for size in args.sizes:
        a = np.full(size // 4, rank + 1, np.float32)
        for op in args.ops:
            f, g = fastps_op(op, a), gloo_op(op, a)
            f(), g()  # warm-up: names declared, connections and buffers in use
            sent, recv, ft, gt = [], [], [], []
            for _ in range(args.reps):
                C.barrier()
                s0, r0 = counters()
                t0 = time.perf_counter()
                f()
                ft.append(time.perf_counter() - t0)
                s1, r1 = counters()
                sent.append(s1 - s0)
                recv.append(r1 - r0)
                dist.barrier()
                t0 = time.perf_counter()
                g()
                gt.append(time.perf_counter() - t0)
            rows.append(
                {
                    "op": op,
                    "size": size,
                    "rank": rank,
                    "sent": statistics.median(sent),
                    "recv": statistics.median(recv),
                    "fastps_s": ft,
                    "gloo_s": gt,
                }
            )
    everyone = C.allgather_object(rows)
    if rank == 0:
        print("ROWS " + json.dumps([row for per_rank in everyone for row in per_rank]), flush=True)
    dist.destroy_process_group()
    C.end_session()
    fastps.shutdown()


# ----------------------------------------------------------------------------- driver


def summarize(n: int, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    keys = sorted({(r["size"], r["op"]) for r in rows}, key=lambda k: (k[0], OPS.index(k[1])))
    for size, op in keys:
        mine = [r for r in rows if r["size"] == size and r["op"] == op]
        worst = 0.0
        p2p = 0
        for r in mine:
            ms, mr = minimum(op, n, size, r["rank"])
            worst = max(worst, (r["sent"] + r["recv"]) / (ms + mr))
            p2p += sum(p2p_minimum(op, n, size, r["rank"]))
        reps = len(mine[0]["fastps_s"])
        # Per repetition the op ends when its slowest rank does.
        ft = statistics.median(max(r["fastps_s"][i] for r in mine) for i in range(reps))
        gt = statistics.median(max(r["gloo_s"][i] for r in mine) for i in range(reps))
        per = sorted(mine, key=lambda r: r["rank"])
        out.append(
            {
                "n": n,
                "op": op,
                "size": size,
                "sent": [int(r["sent"]) for r in per],
                "recv": [int(r["recv"]) for r in per],
                "min": [minimum(op, n, size, r["rank"]) for r in per],
                "worst_ratio": worst,
                "p2p_ratio": sum(r["sent"] + r["recv"] for r in mine) / p2p,
                "fastps_ms": ft * 1e3,
                "gloo_ms": gt * 1e3,
            }
        )
    return out


def mib(x: float) -> str:
    return f"{x / (1 << 20):.2f}"


def print_table(results: List[Dict[str, Any]]) -> None:
    print(
        "| workers | op | size/worker | sent per worker MiB (min) | received per worker MiB "
        "(min) | bytes / min (worst worker) | all workers' bytes / P2P min | fastps ms | "
        "Gloo ms | time fastps/Gloo |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        sent = " ".join(f"{mib(s)} ({mib(m[0])})" for s, m in zip(r["sent"], r["min"]))
        recv = " ".join(f"{mib(s)} ({mib(m[1])})" for s, m in zip(r["recv"], r["min"]))
        if r["op"] != "broadcast":  # every rank alike: show rank 0 only
            sent = f"{mib(r['sent'][0])} ({mib(r['min'][0][0])})"
            recv = f"{mib(r['recv'][0])} ({mib(r['min'][0][1])})"
        print(
            f"| {r['n']} | {r['op']} | {mib(r['size'])} MiB | {sent} | {recv} | "
            f"{r['worst_ratio']:.3f} | {r['p2p_ratio']:.2f} | {r['fastps_ms']:.1f} | "
            f"{r['gloo_ms']:.1f} | "
            f"{r['fastps_ms'] / r['gloo_ms']:.2f} |",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--servers", type=int, default=0, help="servers per job [default: workers]")
    ap.add_argument("--sizes", type=_parse_size, nargs="+", default=[1 << 20, 16 << 20])
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shm", action="store_true", help="keep shared memory on")
    ap.add_argument("--partition-bytes", default="1M")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    for size in args.sizes:
        for n in args.workers:
            if size % (4 * n):
                ap.error(f"size {size} must split into whole float32 elements over {n} ranks")
    results: List[Dict[str, Any]] = []
    for n in args.workers:
        env = dict(os.environ, OMP_NUM_THREADS="1", FASTPS_SHM="1" if args.shm else "0")
        cmd = [
            sys.executable,
            "-m",
            "fastps.launcher",
            "-np",
            str(n),
            "--num-servers",
            str(args.servers or n),
            "--partition-bytes",
            args.partition_bytes,
            sys.executable,
            HERE,
            "--worker",
            "--reps",
            str(args.reps),
            "--ops",
            *args.ops,
            "--sizes",
            *[str(s) for s in args.sizes],
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        line = next((x for x in p.stdout.splitlines() if "ROWS " in x), None)
        if p.returncode != 0 or line is None:
            tail = p.stdout[-4000:] + p.stderr[-4000:]
            sys.exit(f"{n} workers failed (rc {p.returncode}):\n{tail}")
        results.extend(summarize(n, json.loads(line.split("ROWS ", 1)[1])))
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
