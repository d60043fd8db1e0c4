"""Round-trip latency of one small push_pull against Gloo's all_reduce (loopback or rack).

A training step's last, small gradients (biases, norms) wait for their own round trip; so
does every scalar a loop synchronises (a loss, a count). This measures that round trip: two
workers (and one fastps server) on this machine each sum one float32 tensor of a given size,
synchronously, thousands of times, and the table shows the median and the 99th percentile
per size for fastps and for torch.distributed's Gloo all_reduce, measured in the same run.

    python -m benchmarks.bench_latency                        # 4 KiB and 64 KiB, 2000 each
    python -m benchmarks.bench_latency --sizes 4096 65536 1048576 --iters 5000
    python -m benchmarks.bench_latency --systems fastps --out /tmp/latency.csv
    python -m benchmarks.bench_latency --rack      # two hosts of the emulated rack (root)

With ``--rack`` the two workers sit on two hosts of the emulated rack (network namespaces,
links shaped to ``--rate``), each with a server, as in ``comm_rack``: the round trip then
crosses a host link both ways (push to the other host's server, its answer back), where
on loopback the two workers' local reduce on one host is the whole exchange.

Every result is checked (each worker sends rank + 1, every element must come back the sum).
The median of each worker's per-iteration time is taken, then the slower worker's (the
figure a job would see); the same for p99.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import rack_common as rc  # noqa: E402

SYSTEMS = ("fastps", "gloo")


def _percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _measure(one_round, iters: int, warmup: int) -> Dict[str, float]:  # type: ignore[no-untyped-def]
    times: List[float] = []
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        one_round()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return {"median_us": statistics.median(times) * 1e6, "p99_us": _percentile(times, 0.99) * 1e6}


def _emit(rank: int, out: Dict[int, Dict[str, float]]) -> None:
    # On the rack the orchestrator reads a file per rank; on loopback it reads stdout.
    if os.environ.get("RACK_RESULT_DIR"):
        rc.emit_result({"rank": rank, "sizes": out}, rank)
    else:
        print("RESULT " + json.dumps({"rank": rank, "sizes": out}), flush=True)


def child_fastps(args: argparse.Namespace) -> None:
    import fastps
    import numpy as np

    fastps.init()
    rank, n = fastps.rank(), fastps.size()
    want = n * (n + 1) / 2
    out: Dict[int, Dict[str, float]] = {}
    for size in args.sizes:
        buf = np.empty(size // 4, dtype=np.float32)
        bad = [0]

        def one_round(buf: Any = buf, name: str = f"lat{size}", bad: List[int] = bad) -> None:
            buf.fill(rank + 1)
            fastps.push_pull_async(buf, average=False, name=name, out=buf).synchronize()
            bad[0] += int(buf[0] != want or buf[-1] != want)

        fastps.barrier()
        out[size] = _measure(one_round, args.iters, args.warmup)
        if bad[0]:
            raise SystemExit(f"rank {rank}: WRONG SUM in {bad[0]} rounds of {size} bytes")
    _emit(rank, out)
    fastps.barrier()
    fastps.shutdown()


def child_gloo(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = rc.init_gloo_from_env(int(args.timeout))
    want = n * (n + 1) / 2
    out: Dict[int, Dict[str, float]] = {}
    for size in args.sizes:
        buf = torch.empty(size // 4, dtype=torch.float32)
        bad = [0]

        def one_round(buf: Any = buf, bad: List[int] = bad) -> None:
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
            bad[0] += int(buf[0].item() != want or buf[-1].item() != want)

        dist.barrier()
        out[size] = _measure(one_round, args.iters, args.warmup)
        if bad[0]:
            raise SystemExit(f"rank {rank}: WRONG SUM in {bad[0]} rounds of {size} bytes")
    _emit(rank, out)
    dist.barrier()
    dist.destroy_process_group()


def _child_argv(args: argparse.Namespace, system: str) -> List[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.bench_latency",
        "--child",
        system,
        "--sizes",
        *map(str, args.sizes),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--timeout",
        str(args.timeout),
    ]


def _results(outs: Sequence[str], system: str) -> Dict[int, Dict[str, float]]:
    per_rank = []
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                per_rank.append(json.loads(line[len("RESULT ") :])["sizes"])
    if len(per_rank) != 2:
        raise RuntimeError(
            f"{system}: results from {len(per_rank)} of 2 workers:\n{outs[-1][-3000:]}"
        )
    sizes = per_rank[0].keys()
    return {
        int(s): {m: max(r[s][m] for r in per_rank) for m in ("median_us", "p99_us")} for s in sizes
    }


def run_fastps(args: argparse.Namespace) -> Dict[int, Dict[str, float]]:
    cmd = [sys.executable, "-m", "fastps.launcher", "-np", "2", "--num-servers", "1"]
    p = subprocess.run(
        [*cmd, *_child_argv(args, "fastps")], capture_output=True, text=True, timeout=args.timeout
    )
    if p.returncode != 0:
        raise RuntimeError(
            f"fastps run failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
        )
    # fastpsrun prefixes each worker's lines with its rank; split them back apart.
    lines = [ln[ln.index("RESULT ") :] for ln in p.stdout.splitlines() if "RESULT " in ln]
    return _results(lines, "fastps")


def run_gloo(args: argparse.Namespace) -> Dict[int, Dict[str, float]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r))
        env.update(WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(
            subprocess.Popen(
                _child_argv(args, "gloo"),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = []
    deadline = time.monotonic() + args.timeout
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append(out)
            if p.returncode != 0:
                raise RuntimeError(f"gloo run failed ({p.returncode}):\n{out[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return _results(outs, "gloo")


def run_on_rack(
    args: argparse.Namespace, rack: Any, system: str, port: int
) -> Dict[int, Dict[str, float]]:
    """One run of `system` with its two workers on hosts w0 and w1 of `rack`."""
    with tempfile.TemporaryDirectory(prefix=f"latency-{system}-") as tmp:
        env = {"RACK_RESULT_DIR": tmp}
        argv = _child_argv(args, system)
        if system == "fastps":
            launch = rc.start_fastps(
                rack, 2, 0, argv, port, env, timeout_s=args.timeout, label=f"lat{port}"
            )
        else:
            launch = rc.start_gloo(rack, 2, argv, port, env, label=f"lat{port}")
        ok, err = rc.wait_all(rack, launch, args.timeout)
        if not ok:
            raise RuntimeError(f"{system} run on the rack failed:\n{err}")
        found = rc.read_results(Path(tmp))
    return _results(["RESULT " + json.dumps(found[r]) for r in sorted(found)], system)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536], help="bytes")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3, help="whole runs per system; medians")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None, help="CSV to write")
    p.add_argument(
        "--rack",
        action="store_true",
        help="the two workers on two hosts of the emulated rack, a server on each (root)",
    )
    p.add_argument("--rate", type=float, default=1000.0, help="--rack: Mbit/s per host link")
    p.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [s for s in args.sizes if s < 4 or s % 4]
    if bad or args.iters < 1 or args.repeats < 1:
        p.error(f"sizes must be positive multiples of 4 bytes (got {bad}); iters, repeats >= 1")
    if args.child == "fastps":
        child_fastps(args)
        return 0
    if args.child == "gloo":
        child_gloo(args)
        return 0

    runs: Dict[str, List[Dict[int, Dict[str, float]]]] = {s: [] for s in args.systems}
    with contextlib.ExitStack() as stack:
        if args.rack:
            from benchmarks.rack import Rack, is_supported

            ok, why = is_supported()
            if not ok:
                print(f"bench_latency: emulated rack not supported here: {why}", file=sys.stderr)
                return 2
            rack = stack.enter_context(
                Rack(n_workers=2, n_cpu_hosts=0, rate_mbit=args.rate, prefix="lat")
            )
            ports = iter(range(29500, 29500 + 3 * 2 * args.repeats + 3, 3))
            runners = {s: (lambda a, s=s: run_on_rack(a, rack, s, next(ports))) for s in SYSTEMS}
        else:
            runners = {"fastps": run_fastps, "gloo": run_gloo}
        for rep in range(args.repeats):  # interleaved, so both see the same machine
            for system in args.systems if rep % 2 == 0 else list(reversed(args.systems)):
                runs[system].append(runners[system](args))
    rows = []
    for size in args.sizes:
        for system in args.systems:
            med = statistics.median(r[size]["median_us"] for r in runs[system])
            p99 = statistics.median(r[size]["p99_us"] for r in runs[system])
            rows.append({"size_bytes": size, "system": system, "median_us": med, "p99_us": p99})
    print(
        f"round trip of one float32 tensor, 2 workers "
        f"{f'on two rack hosts at {args.rate:g} Mbit/s' if args.rack else 'on loopback'} "
        f"({os.cpu_count()} CPUs, load "
        f"{rc.load_text()}); medians of {args.repeats} runs x {args.iters} rounds"
    )
    print(f"{'bytes':>9} {'system':<7} {'median us':>10} {'p99 us':>8} {'vs gloo':>8}")
    for row in rows:
        gloo = next(
            (r for r in rows if r["size_bytes"] == row["size_bytes"] and r["system"] == "gloo"),
            None,
        )
        ratio = f"{gloo['median_us'] / row['median_us']:8.2f}" if gloo else f"{'-':>8}"
        print(
            f"{row['size_bytes']:>9} {row['system']:<7} {row['median_us']:10.1f} "
            f"{row['p99_us']:8.1f} {ratio}"
        )
    if args.out:
        with args.out.open("w", newline="") as f:
            for k, v in rc.provenance().items():
                f.write(f"# {k}: {v}\n")
            w = csv.DictWriter(
                f, fieldnames=["size_bytes", "system", "median_us", "p99_us", "status"]
            )
            w.writeheader()
            for row in rows:
                w.writerow({**row, "status": "ok"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
