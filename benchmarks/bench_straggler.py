"""Time per iteration with one worker 2x slower: synchronous, quorum rounds (n-1), async with
staleness s in {1, 4} and unbounded, against PyTorch DDP (Gloo), in the same run
(docs/async.md, docs/benchmarks.md "Stragglers").

Every worker trains the same MLP on a fixed batch; a step's compute is emulated by a sleep
(``--compute-ms``; the straggler, the last rank, sleeps ``--slow-factor`` times as long), so
the numbers measure what the synchronisation scheme makes the fast workers wait, not how
the loaded CPU happens to share its cores. Loopback: every process on this host.

    python benchmarks/bench_straggler.py --np 4 --iters 40

Prints one ``RESULT`` line per configuration: the mean time per iteration of rank 0 (a fast
worker) and of the straggler over the measured iterations, and the ratio to the
no-straggler synchronous time. ``--out FILE.json`` also keeps every iteration's time of
both, and ``--plot FILE.png`` draws them (a fast worker's ms per iteration against the
iteration, one line per configuration: where a bounded scheme starts waiting shows).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def build_model(width: int):
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


def train_loop(args: argparse.Namespace, rank: int, size: int, model, optimizer) -> List[float]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(rank)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    delay = args.compute_ms / 1000.0
    if rank == size - 1 and args.slow_factor != 1.0:
        delay *= args.slow_factor
    times: List[float] = []
    for _ in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        time.sleep(delay)  # the rest of the step's compute
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return times[args.warmup :]


def fastps_worker(args: argparse.Namespace) -> None:
    import fastps.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = build_model(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), asynchronous=args.mode == "async" or None
    )
    if args.mode != "async":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times = train_loop(args, rank, size, model, opt)
    print("TIMES " + json.dumps({"rank": rank, "times": times}), flush=True)
    hvd.shutdown()


def ddp_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = train_loop(args, rank, size, model, opt)
    print("TIMES " + json.dumps({"rank": rank, "times": times}), flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_argv(args: argparse.Namespace, mode: str, slow: float) -> List[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        mode,
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--compute-ms",
        str(args.compute_ms),
        "--slow-factor",
        str(slow),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
    ]


def collect(out: str) -> Dict[int, List[float]]:
    got: Dict[int, List[float]] = {}
    for line in out.splitlines():
        at = line.find("TIMES ")
        if at >= 0:
            rec = json.loads(line[at + 6 :])
            got[rec["rank"]] = rec["times"]
    return got


def run_fastps(args: argparse.Namespace, mode: str, slow: float, env: Dict[str, str]):
    # FASTPS_SHM=0: every worker pushes to the servers over TCP, as workers on separate
    # machines do; with shared memory the workers of one host sum locally first, and that
    # local sum waits for every worker of the host (quorum counts hosts: docs/async.md).
    run_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FASTPS_SHM="0", **env)
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", str(args.np)]
    res = subprocess.run(
        cmd + worker_argv(args, mode, slow),
        env=run_env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    if res.returncode != 0:
        raise RuntimeError(f"fastps {mode} {env} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return collect(res.stdout + res.stderr)


def run_ddp(args: argparse.Namespace, slow: float):
    port = free_port()
    procs = []
    for r in range(args.np):
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(r),
            WORLD_SIZE=str(args.np),
        )
        procs.append(
            subprocess.Popen(
                worker_argv(args, "ddp", slow),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    out = ""
    for p in procs:
        o, _ = p.communicate(timeout=args.timeout)
        out += o
        if p.returncode != 0:
            raise RuntimeError(f"ddp worker failed:\n{o[-3000:]}")
    return collect(out)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--width", type=int, default=512, help="MLP width (params ~2 w^2)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compute-ms", type=float, default=100.0)
    parser.add_argument("--slow-factor", type=float, default=2.0)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--out", default="", help="JSON file for every iteration's time")
    parser.add_argument("--plot", default="", help="PNG of a fast worker's time per iteration")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "ddp":
        ddp_worker(args)
        return 0
    if args.worker is not None:
        args.mode = args.worker
        fastps_worker(args)
        return 0

    n = args.np
    s = args.slow_factor
    configs = [
        ("sync-no-straggler", lambda: run_fastps(args, "sync", 1.0, {})),
        ("ddp-no-straggler", lambda: run_ddp(args, 1.0)),
        ("sync", lambda: run_fastps(args, "sync", s, {})),
        ("quorum-n-1", lambda: run_fastps(args, "sync", s, {"FASTPS_ROUND_QUORUM": str(n - 1)})),
        # A history longer than the run: the straggler's lag (half a round per round)
        # never reaches it, so this shows a transient straggler's cost, not the steady state.
        (
            "quorum-n-1-h64",
            lambda: run_fastps(
                args,
                "sync",
                s,
                {"FASTPS_ROUND_QUORUM": str(n - 1), "FASTPS_QUORUM_HISTORY": "64"},
            ),
        ),
        ("async-s1", lambda: run_fastps(args, "async", s, {"FASTPS_STALENESS": "1"})),
        ("async-s4", lambda: run_fastps(args, "async", s, {"FASTPS_STALENESS": "4"})),
        ("async-unbounded", lambda: run_fastps(args, "async", s, {})),
        ("ddp", lambda: run_ddp(args, s)),
    ]
    only = set(filter(None, args.only.split(",")))
    base: Optional[float] = None
    series: Dict[str, Dict[str, Any]] = {}
    for name, fn in configs:
        if only and name not in only and name != "sync-no-straggler":
            continue
        before = load()
        t0 = time.monotonic()
        got = fn()
        fast = sum(got[0]) / len(got[0])
        slowest = sum(got[n - 1]) / len(got[n - 1])
        if name == "sync-no-straggler":
            base = fast
        rec = {
            "config": name,
            "workers": n,
            "compute_ms": args.compute_ms,
            "slow_factor": s if "no-straggler" not in name else 1.0,
            "fast_ms_per_iter": round(fast * 1000, 1),
            "straggler_ms_per_iter": round(slowest * 1000, 1),
            "vs_sync_no_straggler": round(fast / base, 3) if base else None,
            "wall_s": round(time.monotonic() - t0, 1),
            "load_before": before,
            "load_after": load(),
        }
        print("RESULT " + json.dumps(rec), flush=True)
        series[name] = {"fast": got[0], "straggler": got[n - 1], "result": rec}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"argv": sys.argv[1:], "configs": series}, f, indent=1)
    if args.plot:
        plot(series, args, args.plot)
    return 0


def plot(series: Dict[str, Dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    """A fast worker's (rank 0's) time per measured iteration, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for name, got in series.items():
        ms = [t * 1000 for t in got["fast"]]
        style = "--" if name.startswith("ddp") else "-"
        ax.plot(range(args.warmup, args.warmup + len(ms)), ms, style, label=name, linewidth=1.2)
    ax.set_xlabel("iteration (after the warm-up)")
    ax.set_ylabel("fast worker (rank 0) ms per iteration")
    ax.set_title(
        f"{args.np} workers, one {args.slow_factor:g}x slower ({args.compute_ms:g} ms compute)"
    )
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
